"""Shared fixtures and the tiers' hooks: every test gets its own PARALLAX_HOME and SQLite file, never the user's.
Helpers that are not fixtures are in ``support.py``.

Tests that take ``backend_db_url`` run twice: on SQLite and on a fresh PostgreSQL database
(see ``pg_server.py``: ``PARALLAX_TEST_PG_URL``, a role allowed to create databases, or else a
throwaway cluster; skipped only where PostgreSQL is not installed).
"""

from __future__ import annotations

import ast
import functools
import os
import subprocess
from pathlib import Path

import pytest

from tests import pg_server, support
from tests.support import SharedRuns, run_cli, session_folder

# The test workers share the cores, and each starts training processes that size their threads to
# the cores. libgomp's threads spin while they wait, taking the cores from the other test worker's
# processes; threads that sleep made the training-heavy files 23 % faster (113 s -> 88 s on 2
# cores). Set before torch is first imported here and inherited by every process a test starts.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
support.keep_session_environment()  # what the rank server for run_cli and run_world starts with


# The longest test files (paths under tests/), longest first: their wall time in a whole `make test`
# (2026-11-27, 2 cores). Under pytest-xdist (make test: --dist loadfile, in collection order with
# --no-loadscope-reorder) each file goes whole to the next test worker with two tests or fewer left to run;
# starting the long ones first keeps a test worker from being handed a two-minute file when the rest of the
# suite is almost done. The Slurm runs go first of all: their jobs mostly sleep, so they overlap the other
# test worker's files instead of waiting out a minute-long time limit at the end; the search's trials (which sleep too)
# next.
LONGEST_FILES = ("trainer_backend/control/test_slurm_runs.py", "trainer_backend/control/test_search.py",
                 "e2e/test_docs_as_written.py", "trainer_backend/control/test_speed_search.py",
                 "bench/test_run_all_smoke.py", "e2e/test_browser.py", "system/test_faults.py",
                 "trainer_backend/control/test_lifecycle.py", "e2e/test_training.py",
                 "trainer_backend/supervisor/test_torchrun.py", "ui/test_serving.py", "system/test_wrong_process.py",
                 "ui/test_auth_login.py", "trainer_backend/rank/forecast/test_memory_estimate.py",
                 "trainer_backend/control/test_cli_bad_input.py", "db/test_reserve_full_disks.py", "db/test_store.py",
                 "db/test_folders.py", "reports/test_sweep.py", "trainer_backend/telemetry/test_profiling.py",
                 "trainer_backend/rank/strategies/test_pp_fsdp.py", "e2e/test_browser_memory_estimate.py")
TESTS = Path(__file__).resolve().parent
# Files whose tests are independent of one another and long each (every guide's examples run in a shell of their
# own): under --dist loadfile each of their tests is a unit of its own, so the test workers share them.
SPLIT_FILES = ("e2e/test_docs_as_written.py",)


# Tiers. `make test-fast` runs the tests that start no process (no subprocess, rank, server, database cluster
# or browser), in under a minute; the others are marked `processes` (and `browser`): by the fixtures they take
# (below), by their file's `pytestmark`, or one by one. In the fast tier a test that starts a process anyway
# fails, naming the mark it lacks, so the tiers cannot drift.
PROCESS_FIXTURES = {"cli", "shared_runs", "served", "postgres_server", "postgres_url", "slurm_cluster"}
# What a test (or a function or fixture of its module that it uses) names when it starts processes.
PROCESS_NAMES = {"run_cli", "train_and_export", "run_world", "engine_forkserver", "subprocess", "Popen", "spawn",
                 "start_processes", "fork", "Process", "launch", "launch_sweep", "sync_playwright", "ThrowawayCluster",
                 "AppTest"}
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


# And the helpers in support.py that start processes, directly or through each other (world_results, ...).
PROCESS_NAMES |= {name for name, used in module_reach(Path(support.__file__)).items() if used & PROCESS_NAMES}


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}

    def under_tests(path: Path) -> str:
        return path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else path.name

    items.sort(key=lambda item: rank.get(under_tests(item.path), len(LONGEST_FILES)))  # stable: the rest keep their order
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


def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, but each test of SPLIT_FILES a unit of its own (pytest-xdist's hook)."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    split = tuple(f"{TESTS.name}/{name}::" for name in SPLIT_FILES)

    class FilesAndSplitTests(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return nodeid if nodeid.startswith(split) else super()._split_scope(nodeid)

    return FilesAndSplitTests(config, log)


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
    of CPU per run). Every test worker of ``make test`` shares it; the cache writes under a lock."""
    folder = session_folder(tmp_path_factory, "shared-data")
    os.environ["PARALLAX_DATA_DIR"] = str(folder)
    return folder


@pytest.fixture
def signals():
    """SIGTERM's and SIGALRM's handlers, the real-time timer (pytest-timeout's alarm) and the wakeup file
    descriptor put back after the test, and the SIGTERM stop's state (rank/stopping.py) cleared before and
    after it."""
    import signal

    from trainer_backend.rank import stopping

    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGALRM)}
    timer = signal.getitimer(signal.ITIMER_REAL)
    wakeup = signal.set_wakeup_fd(-1)

    def clear() -> None:
        stopping._signalled.clear()
        stopping._taken.clear()
        stopping._grace.pop("heard", None)
        stopping._grace.pop("record", None)

    clear()
    stopping._settled.clear()
    yield
    stopping._settled.set()  # a grace still kept from this test stands down
    signal.set_wakeup_fd(wakeup)
    signal.setitimer(signal.ITIMER_REAL, 0)
    for signum, handler in before.items():
        signal.signal(signum, handler)
    if timer[0]:
        signal.setitimer(signal.ITIMER_REAL, *timer)
    clear()


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


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A two-node Slurm cluster (``slurm_cluster.py``) for this test worker, stopped by pid after the session;
    skipped only where Slurm's packages are not installed (``scripts/system-deps`` installs them)."""
    from tests.slurm_cluster import SlurmCluster, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    try:
        yield cluster
    finally:
        cluster.cancel_all()
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


@pytest.fixture
def cli(parallax_home):
    """``cli("run", "--epochs", "1")``: the CLI in a process of its own (``run_cli``), on this test's PARALLAX_HOME."""
    return lambda *args, **kwargs: run_cli(*args, home=parallax_home, **kwargs)


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
