"""Training scripts the tests run as real processes, and the helper that runs them with bounds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

# Short turns, so that a test sees writes, heartbeats and samples within seconds.
FAST_ENV = {"PARALLAX_SDK_FLUSH_S": "0.2", "PARALLAX_SAMPLE_S": "0.5", "PYTHONUNBUFFERED": "1"}


def write_script(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def start_script(argv: list[str], *, cwd: Path, env_extra: dict | None = None) -> subprocess.Popen:
    """``python *argv`` in a session of its own (its whole group can be killed), output captured."""
    env = {**os.environ, **FAST_ENV, **(env_extra or {})}
    return subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish_script(process: subprocess.Popen, timeout_s: float = 120) -> tuple[int, str, str]:
    """Wait for the script (its group killed past ``timeout_s``); (exit code, stdout, stderr)."""
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(process)
        out, err = process.communicate(timeout=30)
        raise AssertionError(f"the script ran past {timeout_s} s; stdout: {out[-2000:]} stderr: {err[-2000:]}") from None
    return process.returncode, out, err


def run_script(argv: list[str], *, cwd: Path, env_extra: dict | None = None, timeout_s: float = 120):
    return finish_script(start_script(argv, cwd=cwd, env_extra=env_extra), timeout_s)


def kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_for_line(process: subprocess.Popen, marker: str, timeout_s: float = 60) -> None:
    """Read the script's stdout until a line holding ``marker`` (the script prints it when ready)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if marker in line:
            return
        if not line and process.poll() is not None:
            raise AssertionError(f"the script ended ({process.returncode}) before {marker!r}: {process.stderr.read()}")
    kill_group(process)
    raise AssertionError(f"no {marker!r} from the script within {timeout_s} s")


PLAIN = """
    import parallax
    run = parallax.init(project="tests", name="plain", config={"lr": 0.1, "batch_size": 32}, tags=["smoke"])
    for step in range(200):
        parallax.log({"train/loss": 1.0 / (step + 1), "lr": 0.1}, step=step)
        if step % 50 == 49:
            parallax.log({"val/acc": step / 200}, step=step)
    run.summary["best"] = 0.75
    run.config["epochs"] = 3
    import time; time.sleep(1.2)  # a system sample or two
    parallax.finish()
    print("run_id", run.run_id)
"""

RAISES = """
    import parallax
    parallax.init(project="tests", name="raises")
    parallax.log({"train/loss": 1.0})
    def train():
        raise ValueError("the loss exploded at step 3")
    train()
"""

# Ends the way argv[1] names, after logging a point; argv[2] is "with" for a `with parallax.init(...)` block.
EXITS = """
    import os, sys, threading
    import parallax
    how = sys.argv[1]

    def end():
        parallax.log({"train/loss": 1.0})
        if how == "sys.exit(3)":
            sys.exit(3)
        elif how == "sys.exit(message)":
            sys.exit("no data in /nowhere")
        elif how == "exit(2)":
            exit(2)
        elif how == "raise SystemExit(3)":
            raise SystemExit(3)
        elif how == "sys.exit(0)":
            sys.exit(0)
        elif how == "sys.exit()":
            sys.exit()
        elif how == "sys.exit(None)":
            sys.exit(None)
        elif how == "sys.exit(4) in a thread":
            thread = threading.Thread(target=sys.exit, args=(4,))
            thread.start()
            thread.join()
        elif how == "os._exit(4)":
            print("ready", flush=True)
            os._exit(4)

    if sys.argv[2] == "with":
        with parallax.init(project="tests", name="exits"):
            end()
    else:
        parallax.init(project="tests", name="exits")
        end()
"""

# Logs until stopped; prints "ready" once its run exists and some points are written.
LOGS_UNTIL_STOPPED = """
    import sys, time
    import parallax
    run = parallax.init(project="tests", name="long", id=sys.argv[1] if len(sys.argv) > 1 else None,
                        resume=sys.argv[2] if len(sys.argv) > 2 else "never")
    step = 0
    while True:
        parallax.log({"train/loss": 1.0 / (step + 1)})
        step += 1
        if step == 20:
            time.sleep(0.5)
            print("ready", run.run_id, flush=True)
        time.sleep(0.01)
"""

# Logs a known number of points over several seconds, then finishes.
STEADY = """
    import sys, time
    import parallax
    run = parallax.init(project="tests", name="steady", id=sys.argv[1] if len(sys.argv) > 1 else None,
                        resume="allow")
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    print("ready", run.run_id, flush=True)
    for _ in range(steps):
        parallax.log({"train/loss": 0.5, "lr": 0.01})
        time.sleep(0.02)
    parallax.finish()
    print("done", run.run_id, flush=True)
"""

OFFLINE = """
    import parallax
    run = parallax.init(project="tests", name="offline", config={"lr": 0.3}, mode="offline")
    for step in range(30):
        parallax.log({"train/loss": 3.0 - step * 0.1}, step=step)
    parallax.finish()
    print("file", run.offline_file)
"""

DDP = """
    import os, time
    import torch, torch.distributed as dist
    import parallax

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    run = parallax.init(project="tests", name="ddp", config={"strategy": "ddp", "devices": ["cpu", "cpu"]})
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(30):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        optimizer.zero_grad(); loss.backward(); optimizer.step()
        parallax.log({"train/loss": loss.item(), "rank_logged": float(rank)}, step=step)
    time.sleep(2.0)  # a few system samples from each rank
    dist.barrier()
    parallax.finish()
    print("rank", rank, "run_id", run.run_id, flush=True)
    dist.destroy_process_group()
"""

PROFILED = """
    import sys
    import parallax
    print("torch before init", "torch" in sys.modules, flush=True)
    import torch
    run = parallax.init(project="tests", name="profiled")
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with parallax.profile(wait=1, warmup=1, active=2) as prof:
        for step in range(6):
            with prof.range("forward"):
                loss = model(torch.randn(4, 8)).pow(2).mean()
            with prof.range("backward"):
                loss.backward()
            with prof.range("optimizer_step"):
                optimizer.step()
                optimizer.zero_grad()
            parallax.log({"train/loss": loss.item()})
            prof.step()
    parallax.finish()
"""

# Logs train/loss until a file named "more" appears beside it, then val/acc as well, until a file "stop".
WATCHED = """
    import time
    from pathlib import Path
    import parallax
    here = Path(__file__).parent
    run = parallax.init(project="tests", name="watched", config={"lr": 0.05, "batch_size": 128})
    step = 0
    while not (here / "stop").exists():
        values = {"train/loss": 2.0 / (step + 1)}
        if (here / "more").exists():
            values["val/acc"] = min(1.0, step / 100)
        parallax.log(values)
        if step == 5:
            print("ready", run.run_id, flush=True)
        step += 1
        time.sleep(0.1)
    parallax.finish()
"""

# A forked child (as DataLoader workers are) ended by SIGTERM, as a DataLoader ends a worker that does not stop in
# time: the child inherits the script's handlers, and must not end the run.
WITH_CHILD = """
    import multiprocessing, time
    import parallax

    parallax.init(project="tests", name="child")
    parallax.log({"train/loss": 1.0})
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
    child.start()
    time.sleep(0.5)
    child.terminate()
    child.join(30)
    print("child exit", child.exitcode, flush=True)
    time.sleep(0.5)
    parallax.log({"train/loss": 0.5})
    parallax.finish()
"""

WIDE = """
    import parallax
    names = [f"layer{i // 100:03d}/unit{i % 100:02d}" for i in range(10_000)]  # a metric per unit of a network
    with parallax.init(project="tests", name="wide") as run:
        for step in range(3):
            parallax.log({name: (index + step) / 10_000 for index, name in enumerate(names)}, step=step)
    print("run_id", run.run_id)
"""
