"""What the tests share that is not a fixture: the checkout's root, the CLI in a process of its own, a finished
run's export and folder, the session's shared runs, a world of ranks and what its rank 0 wrote, and a
checkpoint evaluated in one process. Imported as ``tests.support`` by test modules, by the fixtures in
``conftest.py`` and by the ranks a test starts (which import the test module that defines their target).
"""

from __future__ import annotations

import atexit
import fcntl
import io
import itertools
import json
import locale
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A run that goes on while a test acts on it (cancels it, kills a rank or the dashboard, locks the
# database), or that a test only needs to exist: a model whose steps sleep (tests.plugins.sleeping_model),
# so that waiting on it leaves the cores to other work. Its flags, and the environment that loads the plugin.
SLEEPER = ("--dataset", "digits", "--model", "parallax_sleeps_each_step", "--image-size", "16")
# DDP over two CPU processes, a batch of 32 each.
DDP_ON_CPU = ("--strategy", "ddp", "--devices", "cpu,cpu", "--batch-size", "64")
SLEEPER_DDP = (*SLEEPER, *DDP_ON_CPU)
SLEEPER_ENV = {"PARALLAX_PLUGINS": "tests.plugins.sleeping_model"}
# What AppTest says when a test switches to a page behind the gate (ui.auth.stop_with_page): no page's
# script is registered, only the gate, under every page's path.
GATED = r"Could not find a navigation page for '[^']*pages/"


def run_cli(*args: str, home: Path, timeout: float = 600, env_extra: dict | None = None,
            fresh: bool = False) -> subprocess.CompletedProcess:
    """``python -m trainer_backend *args`` with its own PARALLAX_HOME (``run_python``), as
    ``subprocess.run(capture_output=True, text=True)`` returns it."""
    env = {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.pop("PARALLAX_DB_URL", None)
    env.update(env_extra or {})
    return run_python(["-m", "trainer_backend", *args], env=env, timeout=timeout, fresh=fresh)


def run_python(argv: list[str], *, env: dict[str, str], timeout: float, fresh: bool = False) -> subprocess.CompletedProcess:
    """``python *argv`` (``-m module ...`` or ``-c code ...``) as a process of its own in the checkout's root
    with ``env``, as ``subprocess.run(capture_output=True, text=True)`` returns it.

    The process is forked from the rank server (``runner.engine_forkserver``, one per test worker, as
    ``run_world``'s are), made what a new interpreter would be (``_as_new_interpreter``), then runs ``argv``:
    it does not import torch, timm and the training code again (about 5 s of CPU). Where ``env`` differs from the
    server's in a variable that something may read as it loads (any but ``FORKABLE``), or with
    ``fresh=True``, it executes a new interpreter in its place."""
    command = [sys.executable, *argv]
    context = _engine_server()
    with tempfile.TemporaryDirectory(prefix="parallax-python-") as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        process = context.Process(target=_forked_python, args=(argv, env, str(out), str(err), fresh),
                                  name="parallax-python")
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join(10)
            raise subprocess.TimeoutExpired(command, timeout, output=out.read_bytes(), stderr=err.read_bytes())
        return subprocess.CompletedProcess(command, process.exitcode, _printed(out), _printed(err))


# What a process may take from the test and still be a fork of the server, as read only when called:
# Parallax's own variables, pytest's bookkeeping, the terminal's size (argparse's help), and what libraries
# loaded in a test worker set there (torch.compile's cache folder and its private ones; matplotlib's backend,
# as Streamlit sets it; scikit-learn's two for Intel's OpenMP, which torch does not load; the CUDA device
# order, read as CUDA initialises, which the server has not done); PYTHONUNBUFFERED (the fork's output
# is unbuffered anyway); and SLURM_CONF, read only by Slurm's commands the process runs.
FORKABLE = ("PARALLAX_", "PYTEST_", "COLUMNS", "LINES", "TORCHINDUCTOR_CACHE_DIR", "_TORCHINDUCTOR_", "MPLBACKEND",
            "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK", "CUDA_DEVICE_ORDER", "PYTHONUNBUFFERED", "SLURM_CONF")
_SESSION_ENVIRONMENT: dict[str, str] = {}


def keep_session_environment() -> None:
    """Remember the environment the rank server is to start with (conftest, before any test runs)."""
    _SESSION_ENVIRONMENT.update(os.environ)


def start_engine_server() -> None:
    """Start the rank server now, if it is not running. ``run_cli`` starts it on first use, swapping
    ``os.environ`` for the moment it takes: call this first where threads will run ``run_cli`` at once."""
    _engine_server()


def _engine_server():
    """The rank server's forkserver context (``runner.engine_forkserver``), its server (one per test worker)
    started if it is not running with the environment kept before the tests (``keep_session_environment``),
    not one a test has changed for itself, which every later fork would then differ from."""
    from multiprocessing import forkserver

    from trainer_backend.supervisor.runner import engine_forkserver

    context = engine_forkserver()
    if forkserver._forkserver._forkserver_pid is not None or not _SESSION_ENVIRONMENT:
        return context
    now = dict(os.environ)
    os.environ.clear()
    os.environ.update(_SESSION_ENVIRONMENT)
    try:
        forkserver.ensure_running()
    finally:
        os.environ.clear()
        os.environ.update(now)
    return context


def _printed(path: Path) -> str:
    """What a ``run_python`` process wrote to ``path``, read as ``subprocess.run(text=True)`` reads a pipe."""
    return path.read_text(encoding=locale.getpreferredencoding(False)) if path.exists() else ""


def _forked_python(argv: list[str], env: dict[str, str], stdout_path: str, stderr_path: str, fresh: bool) -> None:
    """A ``run_python`` process: ``python *argv`` in the checkout's root with ``env`` and its output in two
    files; it ends as an interpreter ends (other threads joined, atexit handlers run, output flushed), with
    the status ``sys.exit`` gave, 1 after an uncaught exception, or SIGINT's after a KeyboardInterrupt."""
    os.chdir(ROOT)
    for fd, path in ((1, stdout_path), (2, stderr_path)):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    differs = {name for name in env.keys() | os.environ.keys() if env.get(name) != os.environ.get(name)}
    if fresh or not all(name.startswith(FORKABLE) for name in differs):  # os.environ: the server's own
        os.execve(sys.executable, [sys.executable, *argv], env)
    os.environ.clear()
    os.environ.update(env)
    _as_new_interpreter()
    option, target, *args = argv
    sys.argv = [option, *args]  # "-c" stays, as python -c has it; runpy puts the module's path in place of "-m"
    sys.path.insert(0, str(ROOT) if option == "-m" else "")
    try:
        if option == "-m":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            main = sys.modules["__main__"] = types.ModuleType("__main__")
            exec(compile(target, "<string>", "exec"), main.__dict__)
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:
        status = -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    threading._shutdown()  # what the interpreter does as it exits, in its order
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    if status == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


def _as_new_interpreter() -> None:
    """Undo what a fork of the server holds and a new interpreter would not: multiprocessing's view of it as
    a child (a start method forced to forkserver, a parent process, a name, the server's resource tracker),
    the server's standard streams (input becomes /dev/null on descriptor 0), and the native threads that the
    engine's import started there (``rank_server`` counts threads from those at its import)."""
    import multiprocessing.process
    import multiprocessing.resource_tracker
    from multiprocessing import context

    from trainer_backend.supervisor import rank_server

    context._default_context._actual_context = None
    multiprocessing.process._parent_process = None
    current = multiprocessing.process._current_process  # as the main process is, whose class is not kept
    current._name, current._identity, current._parent_pid, current._parent_name = "MainProcess", (), None, None
    multiprocessing.process._process_counter = itertools.count(1)
    multiprocessing.process._children = set()
    tracker = multiprocessing.resource_tracker._resource_tracker
    tracker._fd = tracker._pid = None
    rank_server.THREADS_AT_IMPORT = rank_server._native_threads()
    # As a new interpreter opens them, unbuffered as PYTHONUNBUFFERED asks.
    sys.stdout, sys.stderr = (io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=like.encoding,
                                               errors=like.errors, write_through=True)
                              for fd, like in ((1, sys.__stdout__), (2, sys.__stderr__)))
    sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr
    null = os.open(os.devnull, os.O_RDONLY)  # multiprocessing gave the fork one, not on descriptor 0
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = sys.__stdin__ = open(0, encoding=sys.stdout.encoding, errors=sys.stdout.errors, closefd=False)


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
    into one PARALLAX_HOME (``.home``) for the whole session. The workers of ``make test`` share the
    home: the first to ask trains the run under a lock and leaves its export beside the home, and the
    others read that. Tests must not change these runs, and must not assume that ``.home`` holds no
    other runs."""

    def __init__(self, home: Path):
        self.home = home
        self._runs: dict[str, dict] = {}

    def __getitem__(self, name: str) -> dict:
        if name not in self._runs:
            self.home.mkdir(parents=True, exist_ok=True)
            saved = self.home.with_name(f"{self.home.name}-{name}.json")
            with open(saved.with_suffix(".lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the test worker dies
                if not saved.exists():
                    run = train_and_export(self.home, *SHARED_RUNS[name])
                    cli = run["_cli"]
                    run["_cli"] = {"args": cli.args, "returncode": cli.returncode, "stdout": cli.stdout,
                                   "stderr": cli.stderr}
                    # Renamed into place: a test worker killed while writing leaves no half a file behind.
                    partial = saved.with_suffix(".part")
                    partial.write_text(json.dumps(run))
                    os.replace(partial, saved)
            run = json.loads(saved.read_text())
            run["_cli"] = subprocess.CompletedProcess(**run["_cli"])
            self._runs[name] = run
        return self._runs[name]


def session_folder(tmp_path_factory, name: str) -> Path:
    """A folder of this test session that every test worker of ``make test`` sees (their temporary
    folders share a parent); the session's own temporary folder without workers."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name


def run_world(target, nprocs: int, *args, timeout_s: float) -> None:
    """Run ``target(rank, store_port, *args)`` in ``nprocs`` processes that meet at a TCP store served
    here; every process is killed if they have not all finished in ``timeout_s``.

    The processes start as a run's CPU ranks do: forked from the rank server (one per test worker,
    ``runner.engine_forkserver``), each with ``os.environ`` set to this process's as it is now, as a
    spawned one would have it (what libraries read at import is the server's). They end as the
    engine's ranks end, without interpreter shutdown (see ``leave_as_a_rank``)."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    _engine_server()
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
    """A ``run_world`` process: the starting test's environment (the server's is the session's, as
    ``_engine_server`` started it), then the target."""
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
    """End a ``run_world`` process as Parallax's ranks end (trainer_backend.supervisor.runner): without
    interpreter shutdown, where gloo's and FSDP's C++ destructors can abort a finished rank."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def evaluate_checkpoint(home: Path, run: dict) -> tuple[dict, float, float, int]:
    """Load a run's best.pt into a fresh timm model and evaluate it in one process over the whole
    validation split: (checkpoint, accuracy, mean loss, images)."""
    import torch

    from contract.config import RunConfig
    from trainer_backend.rank.inputs import DeviceInputs
    from trainer_backend.rank.loop import validate
    from trainer_backend.rank.models import create_model
    from trainer_backend.rank.strategies import Strategy
    from trainer_backend.rank.trainer import build_loaders, load_data

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
    loss_sum, correct, count = validate(model, val_loader, strategy).tolist()[:3]
    return checkpoint, correct / count, loss_sum / count, int(count)


def run_installed(*args: str, cwd: Path, home: Path, timeout: float = 600,
                  env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """The installed ``parallax`` command (the one beside this interpreter, in the venv) run as a user runs it:
    from ``cwd``, a folder of theirs that is not the checkout, with its own PARALLAX_HOME."""
    env = {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.pop("PARALLAX_DB_URL", None)
    env.update(env_extra or {})
    return subprocess.run([str(Path(sys.executable).parent / "parallax"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def system_metric_rows(samples: list[dict]) -> list[dict]:
    """Whole system samples (each with its ``run_id``) as ``db.system_metrics.read_metric`` returns them at
    full resolution: a row per series and moment (a bucket of one), for charts built without a database."""
    import math

    from db.system_metrics import split_samples

    rows = []
    for run_id in dict.fromkeys(sample["run_id"] for sample in samples):
        of_run = [{name: value for name, value in sample.items() if name != "run_id"}
                  for sample in samples if sample["run_id"] == run_id]
        for (node, kind, device, metric), (t_s, values) in split_samples(of_run).items():
            for at, value in zip(t_s, values):
                figure = None if math.isnan(value) else value
                rows.append({"run_id": run_id, "node": node, "kind": kind, "device": device, "metric": metric,
                             "bucket": None, "t_s": at, "value": figure, "min": figure, "max": figure, "n": 1,
                             "nonfinite": int(figure is None)})
    return rows
