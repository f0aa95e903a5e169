"""Deleting runs from the Runs page: "Yes, delete" returns at once, the page counts the deletion's progress and
marks the runs on their way out (in another tab too), and once it has ended the runs are gone from the table; a deletion stopped
part-way says why in one line.

    .venv/bin/python -m pytest tests/pages/test_runs_delete.py -q
"""

from __future__ import annotations

import sqlite3
import time

from db import store
from db.folders import run_folder
from tests.nvml_machines import fake_nvml  # noqa: F401
from tests.pages.test_every_page import config, cpu_machine, open_page, select_rows, table, texts  # noqa: F401
from trainer_backend.control import run_deletion


def button(at, label: str):
    return next(b for b in at.button if b.label == label)


def progress_lines(at) -> list[str]:
    return [element.proto.text for element in at.get("progress")]


def wait_until_deleted(engine, run_ids: list[int], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(store.get_run(engine, run_id) for run_id in run_ids):
        time.sleep(0.05)


def test_delete_returns_at_once_shows_progress_and_then_the_runs_are_gone(parallax_home, engine):
    """The database held by another writer while the page deletes: the page has returned, counting 0 of the
    runs and marking them; once the writer lets go, the runs and their folders go and a rerun shows the rest."""
    kept = store.create_run(engine, config(), status="completed")
    doomed = [store.create_run(engine, config(), status="completed") for _ in range(12)]
    run_folder(engine, doomed[0], create=True).joinpath("run.log").write_text("epoch 1/1\n")
    at = select_rows(open_page("pages/runs.py"), list(range(len(doomed))))  # newest first: every doomed run
    button(at, "Delete…").click().run()
    locker = sqlite3.connect(parallax_home / "parallax.db", isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")  # another writer holds the database: the deletion cannot start yet
    try:
        started = time.monotonic()
        button(at, "Yes, delete").click().run()
        assert time.monotonic() - started < 20  # the page has returned while nothing could be deleted
        assert not at.exception, at.exception
        assert progress_lines(at) == [f"Deleting 0 of {len(doomed)} runs…"]
        statuses = dict(zip(table(at).value["run"], table(at).value["status"]))
        assert statuses == {kept: "completed", **{run_id: "deleting" for run_id in doomed}}
        assert all(store.get_run(engine, run_id) for run_id in doomed)
        other_tab = open_page("pages/runs.py")  # a reload, or another tab, sees it too
        assert progress_lines(other_tab) == [f"Deleting 0 of {len(doomed)} runs…"]
        assert table(other_tab).value["status"].tolist() == ["deleting"] * len(doomed) + ["completed"]
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    wait_until_deleted(engine, doomed)
    at.run()
    assert not at.exception, at.exception
    assert table(at).value["run"].tolist() == [kept] and progress_lines(at) == []
    assert not run_folder(engine, doomed[0]).exists()
    assert not run_deletion.runs_being_deleted() & set(doomed)


def test_a_deletion_that_cannot_go_on_says_so_in_one_line(parallax_home, engine, monkeypatch):
    """The database locked past the wait for the whole deletion: nothing is deleted and one line says why."""
    monkeypatch.setenv("PARALLAX_DB_LOCK_WAIT_S", "0.5")
    import db

    db.dispose_engines()  # connections opened from now wait 0.5 s for a lock
    runs = [store.create_run(engine, config(), status="completed") for _ in range(3)]
    at = select_rows(open_page("pages/runs.py"), [0, 1, 2])
    button(at, "Delete…").click().run()
    locker = sqlite3.connect(parallax_home / "parallax.db", isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    try:
        button(at, "Yes, delete").click().run()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and run_deletion.runs_being_deleted() & set(runs):
            time.sleep(0.05)
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    at.run()
    assert not at.exception, at.exception
    assert texts(at.warning) == ["deleting stopped after 0 of 3 runs: database is locked; the other 3 runs are "
                                 "left whole, as they were"]
    assert sorted(table(at).value["run"].tolist()) == runs
    at.run()
    assert texts(at.warning) == []  # said once
