"""Where a run's files live: ``PARALLAX_HOME/runs/<database key>/run-N``, one folder per run of each database.

    folder = run_folder(engine, 7)                  # the path; created only with create=True
    name = run_folder_name(engine, 7)               # "3f9c…/run-7", for a process on another machine

Every reader and writer of a run's folder (the trainer, the log, the dashboard, delete) goes
through ``run_folder``, so two databases under one PARALLAX_HOME, or a database created again
there, never share a log, a checkpoint or a deletion. Runs that existed when their database was
upgraded to keyed folders keep ``runs/run-N``.
"""

from __future__ import annotations

import os
import stat
import threading
import weakref
from pathlib import Path
from typing import BinaryIO

from sqlalchemy import Engine, select

from db.connection import session_scope
from db.tables import DatabaseIdentity
from contract.environment import parallax_home

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


class NotARegularFile(OSError):
    """A run's file that is a named pipe, a device, a socket or a folder: it is not read."""


_KINDS = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def open_regular_file(path: Path | str) -> BinaryIO:
    """``path`` opened for reading, refused (NotARegularFile) unless it is a regular file.

    Opened without blocking and checked on the opened descriptor: a run's folder is writable by
    whoever runs training, and a named pipe put there in place of ``run.log`` would otherwise make
    the reader (a page, on every refresh) wait for a writer forever; checking before opening would
    leave a moment in which the file could be swapped."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise NotARegularFile(f"{os.fspath(path)} is {kind}, not a regular file: it is not read")
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_regular_file(path: Path | str) -> bytes:
    """The whole of ``path``, a regular file (``open_regular_file``)."""
    with open_regular_file(path) as handle:
        return handle.read()
