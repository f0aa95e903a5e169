"""Where a run's files live: ``PARALLAX_HOME/runs/<database key>/run-N``, one folder per run of each database.

    folder = run_folder(engine, 7)                  # the path; created only with create=True
    name = run_folder_name(engine, 7)               # "3f9c…/run-7", for a process on another machine

Every reader and writer of a run's folder (the trainer, the log, the dashboard, delete) goes
through ``run_folder``, so two databases under one PARALLAX_HOME, or a database created again
there, never share a log, a checkpoint or a deletion. Runs that existed when their database was
upgraded to keyed folders keep ``runs/run-N``.
"""

from __future__ import annotations

import threading
import weakref
from pathlib import Path

from sqlalchemy import Engine, select

from db.engine import session_scope
from db.models import DatabaseIdentity
from db.settings import parallax_home

# The key never changes for a database: read once per engine.
_keys: weakref.WeakKeyDictionary[Engine, tuple[str, int]] = weakref.WeakKeyDictionary()
_keys_lock = threading.Lock()


def database_key(engine: Engine) -> tuple[str, int]:
    """(folder key, highest run id that keeps an unkeyed folder) of the database behind ``engine``."""
    with _keys_lock:
        known = _keys.get(engine)
    if known is not None:
        return known
    with session_scope(engine) as session:
        row = session.execute(select(DatabaseIdentity.folder_key, DatabaseIdentity.unkeyed_runs_up_to)
                              .order_by(DatabaseIdentity.id).limit(1)).first()
    if row is None or not _is_plain_name(row.folder_key):
        raise LookupError("the database has no usable database_identity row, which names its run folders: "
                          "restore it from a backup of the database")
    with _keys_lock:
        _keys[engine] = (row.folder_key, row.unkeyed_runs_up_to)
    return row.folder_key, row.unkeyed_runs_up_to


def _is_plain_name(key: str) -> bool:
    return bool(key) and key.isalnum() and key.isascii()


def run_folder_name(engine: Engine, run_id: int) -> str:
    """The run's folder relative to ``PARALLAX_HOME/runs``."""
    run_id = int(run_id)
    key, unkeyed_up_to = database_key(engine)
    return f"run-{run_id}" if run_id <= unkeyed_up_to else f"{key}/run-{run_id}"


def named_run_folder(name: str, *, create: bool = False) -> Path:
    """``PARALLAX_HOME/runs/<name>`` for a name ``run_folder_name`` gave (on this or another machine)."""
    parts = name.split("/")
    if not 1 <= len(parts) <= 2 or not parts[-1].startswith("run-") or not all(_is_plain_name(p.replace("run-", "", 1))
                                                                               for p in parts):
        raise ValueError(f"{name!r} is not a run folder name (run-N or <key>/run-N)")
    path = parallax_home() / "runs" / name
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def run_folder(engine: Engine, run_id: int, *, create: bool = False) -> Path:
    """The folder of run ``run_id`` of the database behind ``engine``."""
    return named_run_folder(run_folder_name(engine, run_id), create=create)
