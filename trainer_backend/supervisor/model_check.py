"""Your own model checked before launch, in a child process, so that an import that crashes, hangs
or eats memory cannot take the dashboard or the command line down with it:

    check_model_before_launch(config)   # ModelError in one line, or the line that describes the model

The child (``python -m trainer_backend.supervisor.model_check --config FILE --verdict FILE``) looks the dataset's
classes and channels up without decoding it, imports the model, builds it on the meta device and runs one fake
forward at the run's image size (custom_model.py); for mp and pp it also cuts the model into its stages, on the
CPU. It runs where a launched supervisor runs (the project's folder, its PYTHONPATH), so what it accepts the supervisor
can import. This module imports neither torch nor timm: the child does.

The verdict travels apart from whatever the model's code prints: the child writes it to a file of its own, and
its standard output and error (the user's prints), read from a pipe of which only the last few kilobytes are
kept, only give the last line of a child that ended without one.
The child leads a process group of its own and adopts the orphans among its descendants (Linux's child
subreaper), so that a helper that left the group, even one that made a session of its own, still descends from
it; the model's code runs in a judge the child forks, so that the child is still there to end them when the
judge dies without warning (killed for its memory, a crash, ``os._exit``). Once there is a verdict, the judge
has ended, or the limit is reached, every descendant and the whole group are killed, so no helper process the
model's import started outlives its check.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import NoReturn

from contract.config import RunConfig
from contract.model_source import ModelError, is_custom_model, module_file_in

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CHECK_TIMEOUT_S = 120.0  # importing torch and timm is most of it (seconds); a hung import ends here
POLL_S = 0.05
VERDICT_FILE, CONFIG_FILE = "verdict.json", "config.json"
TAIL_BYTES = 4096  # what is kept of the model's output: its last line is all the check ever shows of it
MAX_READS_PER_TURN = 64  # 4 MB of output read between two looks at the verdict and the clock


def check_model_before_launch(config: RunConfig, *, timeout_s: float = CHECK_TIMEOUT_S) -> str:
    """'' for a timm model (preflight checks those); for your own, the note that says which of
    num_classes and in_chans it takes, or ModelError naming the path and what went wrong."""
    if not is_custom_model(config.model):
        return ""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory(prefix="parallax-model-check-") as folder:
        verdict_file, config_file = Path(folder) / VERDICT_FILE, Path(folder) / CONFIG_FILE
        config_file.write_text(json.dumps(config.to_dict()), encoding="utf-8")
        read_end, write_end = os.pipe()
        try:
            child = subprocess.Popen(
                [sys.executable, "-m", "trainer_backend.supervisor.model_check", "--config", str(config_file),
                 "--verdict", str(verdict_file)],
                stdin=subprocess.DEVNULL, stdout=write_end, stderr=subprocess.STDOUT, cwd=PROJECT_ROOT, env=env,
                start_new_session=True)  # its own group: the model's helpers too are ended with it
            os.close(write_end)
            write_end = -1
            output = OutputTail(read_end)
            ended = _wait_then_end_group(child, verdict_file, timeout_s, output)
        finally:
            for end in (read_end, write_end):
                if end >= 0:
                    os.close(end)
        verdict = _read_verdict(verdict_file)
        if verdict is None:
            if not ended:
                raise ModelError(f"model {config.model!r}: its check did not finish within {timeout_s:g} s (an "
                                 "import or forward that hangs?)")
            raise ModelError(f"model {config.model!r}: its check ended without a verdict "
                             f"({_exit_status(child.returncode)}): {output.last_line()}")
    if verdict.get("error"):
        raise ModelError(verdict["error"] + _in_your_folder(config.model, verdict["error"]))
    return verdict.get("note", "")


def _in_your_folder(model: str, error: str) -> str:
    """Where a module path that was not found is a file in the folder the command runs in: how to give it."""
    found = module_file_in(model, os.getcwd()) if ": not importable: no module named" in error else None
    if found is None:
        return ""
    relative = os.path.relpath(found, os.getcwd())
    return (f"; {found} is in the folder you run this in, which a module path is not imported from: give the file "
            f"({relative}:{model.rpartition(':')[2]}), or put its folder on PYTHONPATH")


class OutputTail:
    """The end of what the child prints (the model's prints, a traceback), read from a pipe as it comes and
    kept to TAIL_BYTES: its last line is all the check shows, so a model that prints without end fills neither
    memory nor a disk."""

    def __init__(self, fd: int):
        self.fd, self.kept, self.closed = fd, b"", False
        os.set_blocking(fd, False)

    def read(self, wait_s: float) -> None:
        """Take what has come, waiting up to ``wait_s`` for it (sleeping, once every writer has closed)."""
        if self.closed or not select.select([self.fd], [], [], wait_s)[0]:
            if self.closed:
                time.sleep(wait_s)
            return
        for _ in range(MAX_READS_PER_TURN):  # then back to the caller's clock, however fast the child prints
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                self.closed = True
                return
            self.kept = (self.kept + chunk)[-TAIL_BYTES:]

    def last_line(self) -> str:
        """The last line printed, on one line, cut to 300 characters."""
        from contract.printable import one_line

        lines = [line for line in self.kept.decode("utf-8", "replace").splitlines() if line.strip()]
        return one_line(lines[-1].strip())[:300] if lines else "it printed nothing"


def _wait_then_end_group(child: subprocess.Popen, verdict_file: Path, timeout_s: float, output: OutputTail) -> bool:
    """Wait, reading ``output``, until the child has written its verdict, has ended, or ``timeout_s`` is up;
    then kill its whole process group. True where it gave a verdict or ended within the limit."""
    deadline = time.monotonic() + timeout_s
    while True:
        # WNOWAIT leaves an ended child unreaped: its id, and so its group's, cannot be reused before the kill.
        ended = os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        if ended or verdict_file.exists() or time.monotonic() >= deadline:
            break
        output.read(POLL_S)
    _kill_descendants(child.pid)  # while the child (their reaper) still holds them, each helper in any session
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group has no process left
        pass
    child.wait()
    output.read(0)  # what came last: every writer has ended (one that escaped cannot hold this up)
    return ended or verdict_file.exists()


def _live_descendants(root: int) -> list[int]:
    """The processes below ``root`` that have not ended (their parents read from /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):  # ended meanwhile
            continue
        if fields[0] != b"Z":
            parents.setdefault(int(fields[1]), []).append(int(entry))
    found, pending = [], [root]
    while pending:
        below = parents.get(pending.pop(), [])
        found += below
        pending += below
    return found


def _kill_descendants(root: int) -> None:
    """SIGKILL every live process below ``root`` until none is left (a helper may start another meanwhile)."""
    for _ in range(100):
        alive = _live_descendants(root)
        if not alive:
            return
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if root == os.getpid():  # this process adopted them: reap them, so that they leave the process table
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
        time.sleep(POLL_S / 5)


def _adopt_orphans() -> None:
    """Be the reaper of this process's orphaned descendants (PR_SET_CHILD_SUBREAPER), so that a helper whose
    parent left it, or that made a session of its own, is still found below this process and ended with it."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # 36: PR_SET_CHILD_SUBREAPER (Linux 3.4)


def _read_verdict(verdict_file: Path) -> dict | None:
    try:
        verdict = json.loads(verdict_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return verdict if isinstance(verdict, dict) and ("error" in verdict or "note" in verdict) else None


def _exit_status(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}" if -code in signal.valid_signals() else f"signal {-code}"
    return f"exit status {code}"


def _verdict(config: RunConfig) -> dict:
    from contract.strategy_specs import spec
    from trainer_backend.rank.custom_model import check_custom_model
    from trainer_backend.rank.forecast.memory_estimate import dataset_shape

    num_classes, in_chans = dataset_shape(config)
    given = check_custom_model(config.model, config.model_kwargs, num_classes=num_classes, in_chans=in_chans,
                               image_size=config.image_size)
    if spec(config.strategy).staged:
        from trainer_backend.rank.models import create_model, split_into_stages  # imports timm: only for mp and pp

        model = create_model(config.model, num_classes=num_classes, in_chans=in_chans, model_args=config.model_kwargs)
        stages = config.world_size if spec(config.strategy).distributed else len(config.devices)
        split_into_stages(model, stages, in_chans=in_chans, image_size=config.image_size, name=config.model)
    takes = " and ".join(given) if given else "neither num_classes nor in_chans (its output width is checked)"
    return {"error": "", "note": f"model {config.model} takes {takes}"}


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m trainer_backend.supervisor.model_check")
    parser.add_argument("--config", required=True, help="the run's config, as JSON")
    parser.add_argument("--verdict", required=True, help="where the verdict goes, as JSON")
    args = parser.parse_args(argv)
    _adopt_orphans()  # before the model's code runs, in the process that outlives it
    with contextlib.suppress(OSError, ValueError):  # a crash is said in the verdict line, not dumped in the checkout
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    judge = os.fork()  # the model's code runs in the judge; this process only waits, so it is there to end helpers
    if judge == 0:
        _judge(Path(args.config), Path(args.verdict))
    _, status = os.waitpid(judge, 0)
    _kill_descendants(os.getpid())  # the model's helpers end with the check, however the judge ended
    _leave_as(status)


def _judge(config_file: Path, verdict_file: Path) -> NoReturn:
    """Import, build and try the model, write the verdict (whole or not at all), and leave at once: threads or
    exit handlers the model's code left must not keep the check going."""
    from contract.printable import one_line

    code = 1
    try:
        try:
            verdict = _verdict(RunConfig.from_dict(json.loads(config_file.read_text(encoding="utf-8"))))
        except (ValueError, LookupError, OSError) as exc:  # ModelError, EstimateError, a dataset that is not there
            verdict = {"error": one_line(exc)}
        written = verdict_file.with_suffix(".part")
        written.write_text(json.dumps(verdict), encoding="utf-8")
        os.replace(written, verdict_file)  # the parent reads it as soon as it is there
        code = 0
    except SystemExit as exc:  # the model's code called sys.exit: its status, as Python would leave with it
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except BaseException:  # anything else its code raised: the traceback is the check's last line
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _leave_as(status: int) -> NoReturn:
    """End this process as the judge ended (its exit status, or the signal that killed it), for the parent to say."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        for step in (lambda: signal.signal(number, signal.SIG_DFL),  # (SIGKILL and SIGSTOP take no handler)
                     lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, [number]),
                     lambda: os.kill(os.getpid(), number)):
            with contextlib.suppress(OSError, ValueError):
                step()
        os._exit(128 + number)
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    sys.exit(main())
