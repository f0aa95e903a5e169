"""What the tests share that is not a fixture: the checkout's root, the CLI in a subprocess, a finished run's
export and folder, the session's shared runs, a world of ranks and what its rank 0 wrote, and a
checkpoint evaluated in one process. Imported as ``tests.support`` by test modules, by the fixtures in
``conftest.py`` and by the ranks a test starts (which import the test module that defines their target).
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, home: Path, timeout: float = 600, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m trainer_backend`` as a real subprocess with its own PARALLAX_HOME."""
    env = {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.pop("PARALLAX_DB_URL", None)
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "trainer_backend", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )


def train_and_export(home: Path, *flags: str) -> dict:
    """Run ``trainer_backend run`` to the end and return the run's export (plus ``_cli``)."""
    result = run_cli("run", "--dataset", "digits", *flags, home=home)
    last = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert last.startswith("run_id="), result.stdout + result.stderr
    exported = run_cli("export", last.split()[0].split("=")[1], home=home)
    assert exported.returncode == 0, exported.stderr
    run = json.loads(exported.stdout)
    run["_cli"] = result
    return run


def run_dir(home: Path, run_id: int) -> Path:
    """The folder of run ``run_id`` of the home's own SQLite database (``runs/<database key>/run-N``)."""
    from db import make_engine
    from db.folders import run_folder_name

    return home / "runs" / run_folder_name(make_engine(f"sqlite:///{home / 'parallax.db'}"), run_id)


# Small runs that several test files only read. Trained once per session, on first use.
SHARED_RUNS: dict[str, tuple[str, ...]] = {
    # ddp on two CPU processes, timm's tiny test model at 16 px: one epoch of 1,437 digits.
    "ddp_tiny": ("--model", "test_resnet", "--image-size", "16", "--devices", "cpu,cpu", "--batch-size", "64",
                 "--strategy", "ddp", "--epochs", "1"),
}


class SharedRuns:
    """``shared_runs["ddp_tiny"]``: the run's export (as ``train_and_export``), trained on first use
    into one PARALLAX_HOME (``.home``) for the whole session. Both workers of ``make test`` share the
    home: the first to ask trains the run under a lock and leaves its export beside the home, and the
    other reads that. Tests must not change these runs, and must not assume that ``.home`` holds no
    other runs."""

    def __init__(self, home: Path):
        self.home = home
        self._runs: dict[str, dict] = {}

    def __getitem__(self, name: str) -> dict:
        if name not in self._runs:
            self.home.mkdir(parents=True, exist_ok=True)
            saved = self.home.with_name(f"{self.home.name}-{name}.json")
            with open(saved.with_suffix(".lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the worker dies
                if not saved.exists():
                    run = train_and_export(self.home, *SHARED_RUNS[name])
                    cli = run["_cli"]
                    run["_cli"] = {"args": cli.args, "returncode": cli.returncode, "stdout": cli.stdout,
                                   "stderr": cli.stderr}
                    # Renamed into place: a worker killed while writing leaves no half a file behind.
                    partial = saved.with_suffix(".part")
                    partial.write_text(json.dumps(run))
                    os.replace(partial, saved)
            run = json.loads(saved.read_text())
            run["_cli"] = subprocess.CompletedProcess(**run["_cli"])
            self._runs[name] = run
        return self._runs[name]


def session_folder(tmp_path_factory, name: str) -> Path:
    """A folder of this test session that both workers of ``make test`` see (their temporary
    folders share a parent); the session's own temporary folder without workers."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name


def run_world(target, nprocs: int, *args, timeout_s: float) -> None:
    """Run ``target(rank, store_port, *args)`` in ``nprocs`` processes that meet at a TCP store served
    here; every process is killed if they have not all finished in ``timeout_s``.

    The processes start as a run's CPU ranks do: forked from the engine's server (one per test worker,
    ``runner.engine_forkserver``), each with ``os.environ`` set to this process's as it is now, as a
    spawned one would have it (what libraries read at import is the server's). They end as the
    engine's ranks end, without interpreter shutdown (see ``leave_as_a_rank``)."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    from trainer_backend.worker.runner import engine_forkserver

    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    engine_forkserver()
    context = mp.start_processes(_in_environment, args=(dict(os.environ), target, store.port, *args), nprocs=nprocs,
                                 join=False, start_method="forkserver")
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {nprocs} processes did not finish in {timeout_s} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()


def _in_environment(rank: int, environment: dict[str, str], target, *args) -> None:
    """A ``run_world`` process: the starting test's environment (the server's is that of its first
    user), then the target."""
    os.environ.clear()
    os.environ.update(environment)
    target(rank, *args)


def world_results(tmp_path_factory, target, nprocs: int, *, timeout_s: float) -> dict:
    """Run ``target(rank, store_port, out_path)`` in ``nprocs`` processes (``run_world``) and return what rank 0
    wrote to ``out_path`` as JSON (``leave_with_results``)."""
    out = tmp_path_factory.mktemp("world") / "rank0.json"
    run_world(target, nprocs, str(out), timeout_s=timeout_s)
    return json.loads(out.read_text())


def leave_with_results(rank: int, results: dict, out_path: str) -> None:
    """End a ``world_results`` process: rank 0 writes ``results`` as JSON, then every rank leaves as a rank."""
    if rank == 0:
        with open(out_path, "w") as handle:
            json.dump(results, handle)
    leave_as_a_rank()


def leave_as_a_rank() -> None:
    """End a ``run_world`` process as the engine's ranks end (trainer_backend.worker.runner): without
    interpreter shutdown, where gloo's and FSDP's C++ destructors can abort a finished rank."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def evaluate_checkpoint(home: Path, run: dict) -> tuple[dict, float, float, int]:
    """Load a run's best.pt into a fresh timm model and evaluate it in one process over the whole
    validation split: (checkpoint, accuracy, mean loss, images)."""
    import torch

    from trainer_backend.contract.config import RunConfig
    from trainer_backend.engine.inputs import DeviceInputs
    from trainer_backend.engine.loop import evaluate
    from trainer_backend.engine.models import create_model
    from trainer_backend.engine.strategies import Strategy
    from trainer_backend.engine.trainer import build_loaders, load_data

    checkpoint = torch.load(run_dir(home, run["run_id"]) / "best.pt", weights_only=True)
    config = RunConfig.from_dict({**run["config"], "strategy": "single", "devices": ["cpu"]})
    old_home = os.environ.get("PARALLAX_HOME")
    os.environ["PARALLAX_HOME"] = str(home)  # the run's dataset cache
    try:
        data = load_data(config)
    finally:
        if old_home is None:
            os.environ.pop("PARALLAX_HOME")
        else:
            os.environ["PARALLAX_HOME"] = old_home
    model = create_model(config.model, num_classes=data.info.num_classes, in_chans=data.info.in_chans)
    model.load_state_dict(checkpoint["model"])
    strategy = Strategy(config)
    strategy.inputs = DeviceInputs.for_run(config, data.train.normalise, strategy.input_device)
    _, val_loader = build_loaders(data, config, strategy)
    loss_sum, correct, count = evaluate(model, val_loader, strategy).tolist()[:3]
    return checkpoint, correct / count, loss_sum / count, int(count)
