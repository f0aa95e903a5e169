"""Shared fixtures: every test gets its own PARALLAX_HOME and SQLite file, never the user's.

Tests that take ``backend_db_url`` run twice: on SQLite and on a fresh PostgreSQL database
(see ``pg_server.py``: ``PARALLAX_TEST_PG_URL``, a role allowed to create databases, or else a
throwaway cluster; skipped only where PostgreSQL is not installed).
"""

from __future__ import annotations

import ast
import fcntl
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pg_server

ROOT = Path(__file__).resolve().parents[1]

# Two test workers share the cores, and each starts training processes that size their threads to
# the cores. libgomp's threads spin while they wait, taking the cores from the other worker's
# processes; threads that sleep made the training-heavy files 23 % faster (113 s -> 88 s on 2
# cores). Set before torch is first imported here and inherited by every process a test starts.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# The longest test files, longest first. Under pytest-xdist (make test: --dist loadfile, in collection
# order with --no-loadscope-reorder) each file goes
# whole to the next free worker in collection order; starting the long ones first keeps a worker from
# being handed a two-minute file when the rest of the suite is almost done.
LONGEST_FILES = ("test_bench_smoke.py", "test_e2e_browser.py", "test_training.py", "test_pipeline_fsdp.py",
                 "test_faults.py", "test_torchrun.py", "test_profiling.py", "test_recipe.py", "test_sweep.py")


# Tiers. `make test-fast` runs the tests that start no process (no subprocess, rank, server, database cluster
# or browser), in under a minute; the others are marked `processes` (and `browser`): by the fixtures they take
# (below), by their file's `pytestmark`, or one by one. In the fast tier a test that starts a process anyway
# fails, naming the mark it lacks, so the tiers cannot drift.
PROCESS_FIXTURES = {"cli", "shared_runs", "served", "postgres_server", "postgres_url"}
# What a test (or a function or fixture of its module that it uses) names when it starts processes.
PROCESS_NAMES = {"run_cli", "train_and_export", "run_world", "subprocess", "Popen", "spawn", "start_processes",
                 "fork", "Process", "launch", "launch_sweep", "sync_playwright", "ThrowawayCluster", "AppTest"}
BROWSER_NAMES = {"sync_playwright"}


def names_used(tree: ast.AST) -> set[str]:
    return ({node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
            | {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
            | {arg.arg for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) for arg in node.args.args})


@functools.cache
def module_reach(path: Path) -> dict[str, set[str]]:
    """For each top-level function and class of a test module, every name it uses, directly or through the
    module's other functions, classes and fixtures (arguments name fixtures)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    direct = {node.name: names_used(node) for node in tree.body
              if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    reach = {name: set(used) for name, used in direct.items()}
    changed = True
    while changed:
        changed = False
        for name, used in reach.items():
            more = set().union(*(reach[other] for other in used & reach.keys() if other != name)) - used
            if more:
                used |= more
                changed = True
    return reach


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FILES)))  # stable: the rest keep their order
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        used = set(item.fixturenames)
        if isinstance(item, pytest.Function):
            reach = module_reach(item.path)
            used |= reach.get(item.originalname, set())
            for fixture in item.fixturenames:
                used |= reach.get(fixture, set())
        if used & BROWSER_NAMES:
            item.add_marker(pytest.mark.browser)
        if used & (PROCESS_FIXTURES | PROCESS_NAMES) or params.get("backend_db_url") == "postgresql":
            item.add_marker(pytest.mark.processes)


# Library probes that are not the test's processes (ctypes asks ldconfig where a library is).
PROBES = {"ldconfig", "uname"}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """In the fast tier (PARALLAX_TEST_TIER=fast), a test (with its fixtures) that starts a process fails."""
    if os.environ.get("PARALLAX_TEST_TIER") != "fast":
        yield
        return
    import multiprocessing.process

    popen_init, process_start = subprocess.Popen.__init__, multiprocessing.process.BaseProcess.start
    message = f"{item.nodeid} starts a process: mark it `processes` (see tests/conftest.py), or keep it out of the fast tier"

    def guarded_popen(self, args, *rest, **kwargs):
        first = args if isinstance(args, str) else (list(args)[0] if args else "")
        if os.path.basename(str(first).split()[0] if first else "") not in PROBES:
            raise AssertionError(message)
        popen_init(self, args, *rest, **kwargs)

    def guarded_start(self):
        raise AssertionError(message)

    subprocess.Popen.__init__, multiprocessing.process.BaseProcess.start = guarded_popen, guarded_start
    try:
        yield
    finally:
        subprocess.Popen.__init__, multiprocessing.process.BaseProcess.start = popen_init, process_start


@pytest.fixture(scope="session", autouse=True)
def shared_data_dir(tmp_path_factory) -> Path:
    """One dataset folder for every test's home and every process a test starts: digits is decoded
    and split once per suite instead of once per home (each decode imports scikit-learn, about 2 s
    of CPU per run). Both workers of ``make test`` share it; the cache writes under a lock."""
    folder = session_folder(tmp_path_factory, "shared-data")
    os.environ["PARALLAX_DATA_DIR"] = str(folder)
    return folder


@pytest.fixture
def own_data_dir(monkeypatch) -> None:
    """For tests of downloading, decoding and caching: datasets under the test's own home."""
    monkeypatch.delenv("PARALLAX_DATA_DIR", raising=False)


@pytest.fixture
def parallax_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("PARALLAX_HOME", str(home))
    monkeypatch.delenv("PARALLAX_DB_URL", raising=False)
    return home


@pytest.fixture
def db_url(parallax_home) -> str:
    return f"sqlite:///{parallax_home / 'parallax.db'}"


@pytest.fixture
def engine(db_url):
    """The test's own SQLite database, its engines disposed of afterwards."""
    import db

    yield db.make_engine(db_url)
    db.dispose_engines()


@pytest.fixture(scope="session")
def postgres_server():
    """The URL of a PostgreSQL server to create test databases on."""
    server = pg_server.server_from_env()
    if server is not None:
        yield server
        return
    binaries = pg_server.find_binaries()
    if binaries is None:
        pytest.skip(pg_server.NOT_INSTALLED)
    try:
        cluster = pg_server.ThrowawayCluster(binaries)
    except pg_server.Unavailable as reason:
        pytest.skip(str(reason))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture
def postgres_url(postgres_server):
    """A new, empty PostgreSQL database for this test, dropped after it."""
    from db import dispose_engines

    database = pg_server.create_database(postgres_server)
    yield database.render_as_string(hide_password=False)
    dispose_engines()
    pg_server.drop_database(postgres_server, database)


@pytest.fixture(params=["sqlite", "postgresql"])
def backend_db_url(request, parallax_home) -> str:
    """The test's database URL, once for each backend Parallax supports."""
    if request.param == "sqlite":
        return f"sqlite:///{parallax_home / 'parallax.db'}"
    return request.getfixturevalue("postgres_url")


def run_cli(*args: str, home: Path, timeout: float = 600, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m trainer_backend`` as a real subprocess with its own PARALLAX_HOME."""
    env = {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.pop("PARALLAX_DB_URL", None)
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "trainer_backend", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )


@pytest.fixture
def cli(parallax_home):
    """``cli("run", "--epochs", "1")``: the CLI in a subprocess, on this test's PARALLAX_HOME."""
    return lambda *args, **kwargs: run_cli(*args, home=parallax_home, **kwargs)


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


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory) -> SharedRuns:
    return SharedRuns(session_folder(tmp_path_factory, "shared-home"))


@pytest.fixture
def served():
    """A c10d TCP store this process serves, as a torchrun job's store is served; yields its port."""
    from datetime import timedelta

    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)
    yield server.port
    del server


def run_world(target, nprocs: int, *args, timeout_s: float) -> None:
    """Run ``target(rank, store_port, *args)`` in ``nprocs`` spawned processes that meet at a TCP
    store served here; every process is killed if they have not all finished in ``timeout_s``."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    context = mp.start_processes(target, args=(store.port, *args), nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {nprocs} processes did not finish in {timeout_s} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()


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
