"""Room for a run's last write when the database's disk fills up mid-run.

    reserve = SpaceReserve(url, run_id).keep()
    ...                         # train; an epoch's write may find the disk full
    reserve.release()           # now the write that records how the run ended has room
    finish(engine, run_id, "failed", error=...)

A SQLite database in WAL mode cannot even update a row once its disk is full: the update is a new
frame in the WAL. A run therefore keeps a small file of its own beside the database while it runs
and deletes it just before its last write, so that "disk full while writing ..." is recorded as
the run's reason instead of the run being left active (and later marked lost). A PostgreSQL
database's disk is the server's, out of this process's reach: nothing is kept for it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from sqlalchemy import make_url
from sqlalchemy.exc import ArgumentError

from db.connection import sqlite_file

# A run's last write is one row (and its indexes): a few pages of WAL. Many times that, so that a
# checkpoint's first frames fit too, and small next to any database.
RESERVE_BYTES = 256 * 1024


class SpaceReserve:
    """``<database>.run-<id>.reserve`` while the run runs (SQLite files only)."""

    def __init__(self, url: str, run_id: int):
        try:
            database = sqlite_file(make_url(url))
        except ArgumentError:
            database = None
        self.path: Path | None = database.with_name(f"{database.name}.run-{run_id}.reserve") if database else None

    def keep(self) -> SpaceReserve:
        """Take the room now, while there is some; a run without it still runs."""
        if self.path is not None:
            try:
                with open(self.path, "wb") as handle:
                    handle.write(bytes(RESERVE_BYTES))  # written, not sparse: the blocks are really taken
                    handle.flush()
                    os.fsync(handle.fileno())
            except OSError:  # already full, or a read-only folder: the run goes on without a reserve
                self.release()
        return self

    def release(self) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()

