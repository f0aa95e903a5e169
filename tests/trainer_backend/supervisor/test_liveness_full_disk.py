"""A run whose database's disk is full when its turn comes (supervisor/liveness.py): claiming it, and recording the
process that claimed it, end in the one line a full disk gets everywhere else (DatabaseFullError, shown without a
traceback), not SQLAlchemy's OperationalError. The disk is a real tmpfs mounted as root (skipped with the reason
where mounting is not allowed), always unmounted afterwards.

    .venv/bin/python -m pytest tests/trainer_backend/supervisor/test_liveness_full_disk.py -q
"""

from __future__ import annotations

import sqlite3

import pytest

import db
from db import store
from db.connection import DatabaseFullError
from tests.db.test_reserve_full_disks import fill, mounted_tmpfs
from trainer_backend.supervisor import liveness

pytestmark = pytest.mark.processes  # mount and umount


@pytest.fixture
def queued_on_a_full_disk(tmp_path, parallax_home):
    """(engine, run id, disk) of a queued run in a SQLite file on a tmpfs with no room left for a write."""
    with mounted_tmpfs(tmp_path / "db-disk", "size=2m") as disk:
        engine = db.make_engine(f"sqlite:///{disk / 'parallax.db'}")
        run_id = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": "single"},
                                  status="queued")
        db.dispose_engines()
        with sqlite3.connect(disk / "parallax.db") as connection:  # an empty WAL: the next write must grow it
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        fill(disk, 0)
        try:
            yield db.make_engine(f"sqlite:///{disk / 'parallax.db'}"), run_id, disk
        finally:
            db.dispose_engines()


@pytest.mark.parametrize("claim", ["wait_for_turn", "claim_if_free"])
def test_claiming_a_run_on_a_full_disk_is_one_line_naming_the_database(queued_on_a_full_disk, claim):
    # Was: sqlalchemy.exc.OperationalError (database or disk is full), which the run recorded with its traceback.
    engine, run_id, disk = queued_on_a_full_disk
    with pytest.raises(DatabaseFullError) as full:
        getattr(liveness, claim)(engine, run_id)
    message = str(full.value)
    assert message.startswith(f"disk full while writing to the database sqlite:///{disk / 'parallax.db'}: could not "
                              "claim the run (database or disk is full; "), message
    assert f"left in {disk})" in message and "\n" not in message
    assert store.get_run(engine, run_id).status == "queued"  # read as it is; nothing half-written
