"""A search's life from the command line and the dashboard: check one, record it, drive it (here, or in a detached
process that outlives the dashboard), resume it, stop it.

    search_id = create_search(base, space)                    # every value checked first; nothing started
    status = drive(search_id)                                 # parallax search: in this process, to its end
    start_detached_driver(search_id)                          # the dashboard's Search mode: returns at once
    resume_search(search_id, detached=True); stop_search(search_id)

This module imports neither torch nor Optuna: the driver (control/search_driver.py) does, in its own process.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from pathlib import Path

from contract.config import RunConfig
from contract.environment import database_url, parallax_home
from contract.python_process import python_command
from contract.search_space import Choices, SearchSpace, check_space, trial_config
from db import make_engine
from db.connection import absolute_database_url
from db.searches import add_search_notes, get_search, mark_stopped, search_log, trial_runs
from db.searches import create_search as record_search

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def checked_space(base: RunConfig, space: SearchSpace) -> SearchSpace:
    """The space checked as a launch checks a config (contract/search_space.check_space), a speed search's default
    knobs filled in, and every model it may draw that is your own checked in a child process as a launch checks
    it; ConfigError (or ModelError) in one line, before anything is recorded."""
    if space.kind == "speed":
        from trainer_backend.control.speed_search import with_default_knobs

        space = with_default_knobs(base, space)
    space = check_space(base, space)
    from trainer_backend.supervisor.model_check import check_model_before_launch

    models = next((p.values for p in space.params if isinstance(p, Choices) and p.name == "model"), (base.model,))
    for model in models:
        check_model_before_launch(trial_config(base, {"model": model}))
    return space


def create_search(base: RunConfig, space: SearchSpace, *, db_url: str | None = None,
                  data_roots: list[Path] | None = None) -> int:
    """Check the search (``checked_space``) and record it, running, with no trial yet; its id."""
    if data_roots is not None:
        from trainer_backend.datasets.roots import check_under_roots

        check_under_roots(base.dataset, data_roots)
    if base.where == "slurm":
        from trainer_backend.control.slurm_job import check_database_reachable, check_world

        check_world(base)
        check_database_reachable(absolute_database_url(database_url(db_url)))
    space = checked_space(base, space)
    engine = make_engine(db_url)
    return record_search(engine, space.kind, base.to_dict(), space.to_dict(), list(space.notes))


def drive(search_id: int, *, db_url: str | None = None, data_roots: list[Path] | None = None, echo=None) -> str:
    """Drive the search in this process (control/search_driver.py): its final status."""
    from trainer_backend.supervisor.startup import engine_imports

    with engine_imports():  # torch for a speed search's forecast, Optuna for every search
        from trainer_backend.control.search_driver import drive as drive_here

    return drive_here(search_id, db_url=db_url, data_roots=data_roots, echo=echo)


def start_detached_driver(search_id: int, *, db_url: str | None = None, data_roots: list[Path] | None = None) -> None:
    """Drive the search in a detached process (its own session: it outlives the dashboard), its output appended to
    ``search_log``. The database URL travels in the environment, never in argv."""
    url = absolute_database_url(database_url(db_url))
    engine = make_engine(url)
    env = {**os.environ, "PARALLAX_HOME": str(parallax_home()), "PYTHONUNBUFFERED": "1", "PARALLAX_DB_URL": url,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    roots = ["--data-roots", os.pathsep.join(str(r) for r in data_roots)] if data_roots is not None else []
    log_path = search_log(engine, search_id)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(python_command("-m", "trainer_backend", "search", "--resume", str(search_id), *roots),
                                   cwd=PROJECT_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    threading.Thread(target=process.wait, name=f"reap-search-{search_id}", daemon=True).start()


def check_resumable(search_id: int, *, db_url: str | None = None):
    """The search, refused in one line where it cannot be resumed: unknown, or driven by a live process here."""
    engine = make_engine(db_url)
    search = get_search(engine, search_id)
    if search is None:
        raise LookupError(f"no search with id {search_id}")
    if search.driven_here_by_a_live_process and search.driver_pid != os.getpid():
        raise ValueError(f"search {search_id} is being driven by process {search.driver_pid} on this machine: it "
                         "needs no resuming (stop that process first to drive it from here)")
    return search


def stop_search(search_id: int, *, db_url: str | None = None) -> str:
    """Stop the search: its live driver on this machine is asked (SIGTERM: it cancels its running trials and
    leaves the search stopped); with none, its running trials are cancelled here. Returns what was done, in words."""
    from trainer_backend.control.lifecycle import cancel

    engine = make_engine(db_url)
    search = get_search(engine, search_id)
    if search is None:
        raise LookupError(f"no search with id {search_id}")
    if search.driven_here_by_a_live_process:
        os.kill(search.driver_pid, signal.SIGTERM)
        return f"search {search_id}: its driver (process {search.driver_pid}) was asked to stop"
    if search.driver_pid is not None and search.driver_host != socket.gethostname():
        raise ValueError(f"search {search_id} is driven from {search.driver_host} (process {search.driver_pid}): "
                         "stop it there")
    cancelled = [run["id"] for run in trial_runs(engine, search_id).values() if run["status"] in ("queued", "running")]
    for run_id in cancelled:
        cancel(run_id, db_url=db_url)
    add_search_notes(engine, search_id, [f"Stopped with no driver running; trials cancelled: runs "
                                         f"{', '.join(map(str, cancelled)) or 'none'}."])
    mark_stopped(engine, search_id)  # a later resume tells the study how the cancelled trials ended
    return f"search {search_id} stopped; cancelled runs: {', '.join(map(str, cancelled)) or 'none'}"
