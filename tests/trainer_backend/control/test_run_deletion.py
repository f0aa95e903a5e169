"""A deletion behind the page (``trainer_backend/control/run_deletion.py``): it returns at once, counts its
progress, marks its runs until it ends, and an ended one no page forgot goes after a while. Real SQLite files.

    .venv/bin/python -m pytest tests/trainer_backend/control/test_run_deletion.py -q
"""

from __future__ import annotations

import sqlite3
import time

import db
from db import make_engine, store
from tests.trainer_backend.control.test_housekeeping_batches import add_runs
from trainer_backend.control import run_deletion


def wait_for_end(key: int, timeout_s: float = 30) -> run_deletion.Deletion:
    deadline = time.monotonic() + timeout_s
    while not run_deletion.deletion(key).finished and time.monotonic() < deadline:
        time.sleep(0.05)
    return run_deletion.deletion(key)


def test_a_deletion_behind_the_page_returns_at_once_and_counts_its_progress(parallax_home, monkeypatch):
    """``start_deletion`` returns while the database is locked by another writer; the runs are marked as being
    deleted, the count stays at 0 until the lock goes, then every run is gone and the deletion says so."""
    path = parallax_home / "background.db"
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    ids = add_runs(engine, 60)
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    try:
        key = run_deletion.start_deletion(ids, db_url=url)
        job = run_deletion.deletion(key)
        assert not job.finished and job.done == 0 and job.total == len(ids)
        assert run_deletion.runs_being_deleted() >= set(ids)
        time.sleep(0.3)
        assert run_deletion.deletion(key).done == 0 and len(store.list_runs(engine)) == len(ids)
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    job = wait_for_end(key)
    assert job.finished and job.done == job.total == len(ids) and job.deleted == ids and job.refused == []
    assert store.list_runs(engine) == [] and not run_deletion.runs_being_deleted() & set(ids)
    run_deletion.forget(key)
    assert run_deletion.deletion(key) is None
    db.dispose_engines()


def test_an_ended_deletion_no_page_forgot_goes_when_a_later_one_starts(parallax_home, monkeypatch):
    url = f"sqlite:///{parallax_home / 'ended.db'}"
    engine = make_engine(url)
    first, second = add_runs(engine, 2)
    old = run_deletion.start_deletion([first], db_url=url)
    assert wait_for_end(old).deleted == [first]
    monkeypatch.setattr(run_deletion, "KEPT_AFTER_END_S", 0.0)
    new = run_deletion.start_deletion([second], db_url=url)
    assert run_deletion.deletion(old) is None  # its tab closed before it ended: nothing keeps it
    assert wait_for_end(new).deleted == [second]
    run_deletion.forget(new)
    db.dispose_engines()
