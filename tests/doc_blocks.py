"""The docs' code blocks as the docs-as-tests harness reads and runs them (tests/e2e/test_docs_as_written.py).

Every fenced block of README.md and docs/*.md says by its fence what it is (docs/HOW_IT_IS_BUILT.md, "Docs that
run"): ```console (commands, run, with the output they show checked), ```python (a script, run; with
``file=PATH`` a file the next commands use, written there), or a display (```text, ```toml, ```json), which is
only shown. ``needs=gpu,slurm`` on a fence names what its commands need; a block whose needs are not met here is
reported as skipped, with the reason.

    blocks = read_blocks(ROOT / "README.md")     # [Block(path, line, language, needs, file, body), ...]
    session = DocSession(work, env)              # one shell state per document: its folder, exports, home
    session.run(block)                           # AssertionError naming the doc's line on any difference
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

RUN = ("console", "python")
DISPLAY = ("text", "toml", "json")
# What a block may need, and why it does not run everywhere.
NEEDS = {
    "gpu": "needs a CUDA GPU (runs where one is: `make gpu-check` runs the GPU paths)",
    "slurm": "needs a Slurm cluster (the test cluster of tests/slurm_cluster.py serves it where Slurm is installed)",
    "machines": "needs several machines or a database server of their own",
    "checkout": "runs the checkout's own make targets: `make test` is this suite, `make run` serves until stopped",
    "server": "serves until stopped (the dashboard): tests/ui/test_serving*.py start it as `make run` does",
}
COMMAND_TIMEOUT_S = 600
PROMPT = "$ "
ANY_LINES = "..."


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # the fence's line, from 1
    language: str
    needs: tuple[str, ...]
    file: str | None  # python file=PATH: written there, not run
    body: str

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"


def read_blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, in order (fences at the start of a line, as GitHub reads them)."""
    blocks, lines = [], path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("```"):
            info = line[3:].strip().split()
            end = next((i for i in range(index + 1, len(lines)) if lines[i].startswith("```")), None)
            if end is None:
                raise AssertionError(f"{path.name}:{index + 1}: a fence that never closes")
            attributes = dict(part.split("=", 1) for part in info[1:] if "=" in part)
            blocks.append(Block(path, index + 1, info[0] if info else "",
                                tuple(n for n in attributes.get("needs", "").split(",") if n),
                                attributes.get("file"), "\n".join(lines[index + 1:end]) + "\n"))
            index = end + 1
        else:
            index += 1
    return blocks


def fence_problem(block: Block) -> str | None:
    """Why a block's fence breaks the convention, or None."""
    if block.language not in (*RUN, *DISPLAY):
        return (f"{block.where}: a ```{block.language} fence: a block is ```console (commands, run), ```python "
                f"(run, or file=PATH) or a display ({', '.join(DISPLAY)}); see docs/HOW_IT_IS_BUILT.md")
    unknown = [need for need in block.needs if need not in NEEDS]
    if unknown:
        return f"{block.where}: needs={','.join(unknown)} is not one of {', '.join(NEEDS)}"
    if block.language == "console" and not block.body.lstrip().startswith(PROMPT):
        return f"{block.where}: a ```console block starts with a command line: '$ ' and the command"
    if block.file is not None and block.language != "python":
        return f"{block.where}: file= is for a ```python block"
    return None


def commands(block: Block) -> list[tuple[str, list[str]]]:
    """A console block's (command, the output lines it shows): '$ ' starts a command, a line ending in '\\'
    continues it, and the lines up to the next '$ ' are what it prints."""
    found: list[tuple[str, list[str]]] = []
    lines = block.body.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if not line.startswith(PROMPT):
            if found:
                found[-1][1].append(line)
            index += 1
            continue
        command = [line[len(PROMPT):]]
        while command[-1].endswith("\\") and index + 1 < len(lines):
            index += 1
            command.append(lines[index])
        found.append(("\n".join(command), []))
        index += 1
    return found


def line_pattern(expected: str) -> re.Pattern:
    """An output line as the doc shows it: '...' stands for any text, and a run of spaces for any run of spaces
    (columns line up differently with other numbers); matched against the printed line with its spaces so
    collapsed (``spaced``)."""
    return re.compile(".*".join(re.escape(spaced(part)) for part in expected.split(ANY_LINES)))


def spaced(text: str) -> str:
    return " ".join(text.split())


def output_problem(expected: list[str], printed: str) -> str | None:
    """Why ``printed`` is not what the doc shows: each shown line must be a printed line, in order ('...' within
    a line is any text; a line of '...' alone only says that more is printed)."""
    wanted = [line for line in expected if line.strip() and line.strip() != ANY_LINES]
    got = [spaced(line) for line in printed.splitlines()]
    position = 0
    for line in wanted:
        pattern = line_pattern(line)
        while position < len(got) and not pattern.fullmatch(got[position]):
            position += 1
        if position == len(got):
            return f"the line {line.strip()!r} is not printed (after the lines matched before it)"
        position += 1
    return None


class DocSession:
    """One document's shell: its working folder and environment carry from command to command (``cd``,
    ``export``), as in a terminal where a user follows the document from the top."""

    def __init__(self, work: Path, env: dict[str, str]):
        self.work, self.env = work, env
        self.state = work.parent / f".{work.name}-shell"
        self.state.mkdir(exist_ok=True)
        (self.state / "env").write_text("")
        (self.state / "cwd").write_text(str(work))

    def shell(self, command: str, timeout_s: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess:
        state = shlex.quote(str(self.state))
        script = (f'cd "$(cat {state}/cwd)" && source {state}/env\n{command}\nstatus=$?\n'
                  f"export -p > {state}/env; pwd > {state}/cwd; exit $status\n")
        return subprocess.run(["bash", "-c", script], env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)

    def run(self, block: Block, index: int) -> None:
        if block.language == "python":
            if block.file is not None:
                target = (Path(self.env["HOME"]) / block.file[2:] if block.file.startswith("~/")
                          else Path((self.state / "cwd").read_text().strip()) / block.file)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(block.body)
                return
            script = self.state / f"block_{index}.py"
            script.write_text(block.body)
            result = self.shell(f"python {shlex.quote(str(script))}")
            assert result.returncode == 0, (f"{block.where}: the Python block exited {result.returncode}:\n"
                                            f"{result.stdout[-4000:]}")
            return
        for command, expected in commands(block):
            result = self.shell(command)
            shown = f"{block.where}: $ {command}\n--- printed (exit {result.returncode}):\n{result.stdout[-4000:]}"
            assert result.returncode == 0, f"{shown}\n--- the command failed"
            problem = output_problem(expected, result.stdout)
            assert problem is None, f"{shown}\n--- {problem}"
