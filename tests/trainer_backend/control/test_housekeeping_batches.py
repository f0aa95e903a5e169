"""Deleting many runs in batches (``trainer_backend/control/housekeeping.py``'s ``delete_runs_and_files``): each
batch one short transaction with its runs' metrics, the folders after the rows, and a failure part-way said in
one line with the runs not reached left whole.
Real SQLite files and real PostgreSQL databases.

    .venv/bin/python -m pytest tests/trainer_backend/control/test_housekeeping_batches.py -q
"""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import event, func, select

import db
from db import make_engine, script_metrics, series, store
from db.folders import run_folder
from db.tables import ScriptChunk, StepMetric
from trainer_backend.control import housekeeping

CONFIG = {"dataset": "digits", "model": "resnet18", "strategy": "single", "devices": ["cpu"], "batch_size": 128,
          "image_size": 32, "amp": "auto", "epochs": 1, "tags": []}
STEPS_PER_RUN = 5


def add_runs(engine, count: int) -> list[int]:
    """``count`` finished runs, each with a few step points, one in a hundred with a folder."""
    ids = []
    for index in range(count):
        run_id = store.create_run(engine, CONFIG, status="completed")
        series.add_steps(engine, run_id, [{"epoch": 1, "step": step, "t_s": 0.5 * step, "train_loss": 1.0,
                                           "images_per_s": 10.0, "lr": 0.1} for step in range(1, STEPS_PER_RUN + 1)])
        if index % 100 == 0:
            run_folder(engine, run_id, create=True).joinpath("run.log").write_text("epoch 1/1\n")
        ids.append(run_id)
    return ids


def count(engine, table) -> int:
    with engine.connect() as connection:
        return connection.execute(select(func.count()).select_from(table)).scalar()


@pytest.fixture
def db_url(backend_db_url):
    return backend_db_url


def test_many_runs_go_in_batches_each_its_own_short_transaction(db_url):
    """1,000 runs and a script run: every row and folder gone, in transactions of at most RUNS_PER_DELETE runs,
    the first FIRST_BATCH_RUNS, so that the write lock is let go many times on the way."""
    engine = make_engine(db_url)
    ids = add_runs(engine, 1_000)
    script = script_metrics.create_script_run(engine, name="s", project="p", config={}, key="script:d",
                                              status="completed")
    script_metrics.add_points(engine, script, [("loss", step, 0.0, 1.0) for step in range(500)])
    folders = [run_folder(engine, run_id) for run_id in ids[::100]]
    assert all(folder.exists() for folder in folders)

    batches: list[int] = []
    event.listen(engine, "before_cursor_execute", lambda conn, cursor, statement, parameters, *rest: batches.append(
        len(parameters) if isinstance(parameters, (list, tuple)) else len(parameters or {}))
        if statement.lstrip().upper().startswith("DELETE FROM RUNS") else None)
    commits = []
    event.listen(engine, "commit", lambda connection: commits.append(1))
    seen = []
    deleted, refused = housekeeping.delete_runs_and_files([*ids, script], db_url=db_url,
                                                          progress=lambda done, total: seen.append((done, total)))
    assert deleted == [*ids, script] and refused == []
    assert count(engine, StepMetric) == count(engine, ScriptChunk) == 0 and store.list_runs(engine) == []
    assert not any(folder.exists() for folder in folders)
    assert batches[0] == housekeeping.FIRST_BATCH_RUNS and max(batches) <= store.RUNS_PER_DELETE
    assert sum(batches) == len(ids) + 1 and len(batches) >= 4 and len(commits) >= len(batches)
    assert seen[-1] == (len(ids) + 1, len(ids) + 1) and [done for done, _ in seen] == sorted({d for d, _ in seen})
    db.dispose_engines()


def test_a_batch_that_fails_stops_the_deletion_in_one_line_and_leaves_the_rest_whole(parallax_home, monkeypatch):
    """The database locked by another writer past the wait after the first batch: the first batch is gone with
    its folders, every other run keeps its row, its step points and its folder, and one line says so."""
    monkeypatch.setenv("PARALLAX_DB_LOCK_WAIT_S", "0.5")
    path = parallax_home / "locked.db"
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    ids = add_runs(engine, 120)
    for run_id in ids:
        run_folder(engine, run_id, create=True)
    locker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    def lock_after_the_first_batch(done: int, total: int) -> None:
        if done == housekeeping.FIRST_BATCH_RUNS:
            locker.execute("BEGIN IMMEDIATE")  # another process's writer, holding on

    try:
        deleted, refused = housekeeping.delete_runs_and_files(ids, db_url=url, progress=lock_after_the_first_batch)
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    first = housekeeping.FIRST_BATCH_RUNS
    assert deleted == ids[:first]
    [line] = refused
    assert line == (f"deleting stopped after {first} of {len(ids)} runs: database is locked; the other "
                    f"{len(ids) - first} runs are left whole, as they were")
    assert [run.id for run in store.list_runs(engine)][::-1] == ids[first:]
    assert count(engine, StepMetric) == (len(ids) - first) * STEPS_PER_RUN
    assert [run_folder(engine, run_id).exists() for run_id in ids] == [False] * first + [True] * (len(ids) - first)
    db.dispose_engines()

