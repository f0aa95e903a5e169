"""Your own model checked before launch, in a child process, so that an import that crashes, hangs
or eats memory cannot take the dashboard or the command line down with it:

    check_model_before_launch(config)   # ModelError in one line, or the line that describes the model

The child (``python -m trainer_backend.worker.model_check --config FILE --verdict FILE``) looks the dataset's
classes and channels up without decoding it, imports the model, builds it on the meta device and runs one fake
forward at the run's image size (custom_model.py); for mp and pp it also cuts the model into its stages, on the
CPU. It runs where a launched worker runs (the project's folder, its PYTHONPATH), so what it accepts the worker
can import. This module imports neither torch nor timm: the child does.

The verdict travels apart from whatever the model's code prints: the child writes it to a file of its own, and
its standard output and error (the user's prints) only give the last line of a child that ended without one.
The child leads a process group of its own and adopts the orphans among its descendants (Linux's child
subreaper), so that a helper that left the group, even one that made a session of its own, still descends from
it; once it has a verdict, ends, or reaches the limit, every descendant and the whole group are killed, so no
helper process the model's import started outlives its check.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from contract.config import RunConfig
from contract.model_source import ModelError, is_custom_model, module_file_in

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CHECK_TIMEOUT_S = 120.0  # importing torch and timm is most of it (seconds); a hung import ends here
POLL_S = 0.05
VERDICT_FILE, CONFIG_FILE, OUTPUT_FILE = "verdict.json", "config.json", "output.txt"


def check_model_before_launch(config: RunConfig, *, timeout_s: float = CHECK_TIMEOUT_S) -> str:
    """'' for a timm model (preflight checks those); for your own, the note that says which of
    num_classes and in_chans it takes, or ModelError naming the path and what went wrong."""
    if not is_custom_model(config.model):
        return ""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory(prefix="parallax-model-check-") as folder:
        verdict_file, config_file, output_file = (Path(folder) / name for name in (VERDICT_FILE, CONFIG_FILE, OUTPUT_FILE))
        config_file.write_text(json.dumps(config.to_dict()), encoding="utf-8")
        with open(output_file, "w+b") as output:
            child = subprocess.Popen(
                [sys.executable, "-m", "trainer_backend.worker.model_check", "--config", str(config_file),
                 "--verdict", str(verdict_file)],
                stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, cwd=PROJECT_ROOT, env=env,
                start_new_session=True)  # its own group: the model's helpers too are ended with it
            ended = _wait_then_end_group(child, verdict_file, timeout_s)
            verdict = _read_verdict(verdict_file)
            if verdict is None:
                if not ended:
                    raise ModelError(f"model {config.model!r}: its check did not finish within {timeout_s:g} s (an "
                                     "import or forward that hangs?)")
                raise ModelError(f"model {config.model!r}: its check ended without a verdict "
                                 f"({_exit_status(child.returncode)}): {_last_line(output)}")
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


def _wait_then_end_group(child: subprocess.Popen, verdict_file: Path, timeout_s: float) -> bool:
    """Wait until the child has written its verdict, has ended, or ``timeout_s`` is up; then kill its whole
    process group. True where it gave a verdict or ended within the limit."""
    deadline = time.monotonic() + timeout_s
    while True:
        # WNOWAIT leaves an ended child unreaped: its id, and so its group's, cannot be reused before the kill.
        ended = os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        if ended or verdict_file.exists() or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    _kill_descendants(child.pid)  # while the child (their reaper) still holds them, each helper in any session
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group has no process left
        pass
    child.wait()
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


def _last_line(output) -> str:
    """The last line of the child's output (the user's prints, a traceback), one line, cut to 300 characters."""
    from contract.printable import one_line

    output.seek(max(0, output.seek(0, os.SEEK_END) - 4096))
    lines = [line for line in output.read().decode("utf-8", "replace").splitlines() if line.strip()]
    return one_line(lines[-1].strip())[:300] if lines else "it printed nothing"


def _verdict(config: RunConfig) -> dict:
    from contract.strategy_specs import spec
    from trainer_backend.engine.custom_model import check_custom_model
    from trainer_backend.engine.forecast.memory_estimate import dataset_shape

    num_classes, in_chans = dataset_shape(config)
    given = check_custom_model(config.model, config.model_kwargs, num_classes=num_classes, in_chans=in_chans,
                               image_size=config.image_size)
    if spec(config.strategy).staged:
        from trainer_backend.engine.models import create_model, split_into_stages  # imports timm: only for mp and pp

        model = create_model(config.model, num_classes=num_classes, in_chans=in_chans, model_args=config.model_kwargs)
        stages = config.world_size if spec(config.strategy).distributed else len(config.devices)
        split_into_stages(model, stages, in_chans=in_chans, image_size=config.image_size, name=config.model)
    takes = " and ".join(given) if given else "neither num_classes nor in_chans (its output width is checked)"
    return {"error": "", "note": f"model {config.model} takes {takes}"}


def main(argv: list[str] | None = None) -> int:
    import argparse

    from contract.printable import one_line

    parser = argparse.ArgumentParser(prog="python -m trainer_backend.worker.model_check")
    parser.add_argument("--config", required=True, help="the run's config, as JSON")
    parser.add_argument("--verdict", required=True, help="where the verdict goes, as JSON")
    args = parser.parse_args(argv)
    _adopt_orphans()  # before the model's code runs
    try:
        try:
            verdict = _verdict(RunConfig.from_dict(json.loads(Path(args.config).read_text(encoding="utf-8"))))
        except (ValueError, LookupError, OSError) as exc:  # ModelError, EstimateError, a dataset that is not there
            verdict = {"error": one_line(exc)}
        written = Path(args.verdict).with_suffix(".part")
        written.write_text(json.dumps(verdict), encoding="utf-8")
        os.replace(written, args.verdict)  # whole or not at all: the parent reads it as soon as it is there
    finally:
        _kill_descendants(os.getpid())  # the model's helpers end with the check, however it ends
    sys.stdout.flush()
    sys.stderr.flush()
    # The verdict is given: threads or exit handlers the model's code left must not keep the check going.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
