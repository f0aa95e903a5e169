"""A run whose database's disk is full when its turn comes (supervisor/liveness.py): claiming it, and recording the
process that claimed it, and a torchrun job making its run as it starts, end in the one line a full disk gets
everywhere else (DatabaseFullError, shown without a traceback), not SQLAlchemy's OperationalError. The disk is a real tmpfs mounted as root (skipped with the reason
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


def test_a_torchrun_job_starting_on_a_full_disk_is_one_line_naming_the_database(tmp_path, parallax_home, monkeypatch):
    # A torchrun job makes its own run as it starts (no queue): that first write is guarded as the others are.
    from contract.config import RunConfig
    from contract.world import SUBMITTED_RUN_ENV, TorchrunWorld
    from trainer_backend.supervisor import torchrun

    monkeypatch.delenv(SUBMITTED_RUN_ENV, raising=False)
    joined = RunConfig.from_dict({"dataset": "digits", "model": "test_resnet", "strategy": "ddp",
                                  "devices": ["cpu", "cpu"]})
    world = TorchrunWorld(rank=0, world_size=2, local_rank=0, local_world_size=2, node_rank=0, job_id="job",
                          restart_count=0, max_restarts=0)
    with mounted_tmpfs(tmp_path / "db-disk", "size=2m") as disk:
        db.make_engine(f"sqlite:///{disk / 'parallax.db'}")  # migrated while there is room
        db.dispose_engines()
        with sqlite3.connect(disk / "parallax.db") as connection:
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        fill(disk, 0)
        try:
            engine = db.make_engine(f"sqlite:///{disk / 'parallax.db'}")
            with pytest.raises(DatabaseFullError) as full:
                torchrun._open_run(engine, joined, world, ["localhost"], [], restarted=False)
            message = str(full.value)
            assert message.startswith(f"disk full while writing to the database sqlite:///{disk / 'parallax.db'}: "
                                      "could not record the job's run (database or disk is full; "), message
            assert "\n" not in message and store.list_runs(engine) == []  # nothing half-written
        finally:
            db.dispose_engines()
