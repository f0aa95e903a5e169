"""Searches in the database, on SQLite and PostgreSQL: a run ends ``pruned`` with its epochs kept (a status the
schema allows from revision 0011, and a downgrade turns back into ``cancelled``); a search's Optuna study lives in
Parallax's own database beside Parallax's revision and is found again by a new process's storage; a study stored
by another Optuna schema is refused in one line; one live driver at a time.

    .venv/bin/python -m pytest tests/db/test_searches.py -q
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from alembic import command
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from db import dispose_engines, make_engine, store
from db import run_state as state
from db.connection import alembic_config, current_revisions, schema_head
from db.search_study import StudySchemaMismatch, forget_storages, has_study_tables, study_storage
from db.searches import claim_driver, create_search, get_search, release_driver, trial_runs

CONFIG = {"dataset": "digits", "model": "resnet18", "strategy": "single", "devices": ["cpu"], "epochs": 3}


@pytest.fixture
def clean_storages():
    yield
    forget_storages()
    dispose_engines()


def test_a_trial_run_ends_pruned_with_its_epochs_kept(backend_db_url, clean_storages):
    engine = make_engine(backend_db_url)
    search_id = create_search(engine, "hyper", CONFIG, {"params": ["lr=1e-4:1e-1:log"]})
    run_id = store.create_run(engine, CONFIG, status="running", search_trial=(search_id, 0))
    store.log_epoch(engine, run_id, {"epoch": 1, "val_acc": 0.3})
    assert state.finish(engine, run_id, "pruned", error="pruned by the search's median pruner after epoch 1")
    assert not state.finish(engine, run_id, "cancelled")  # the first end stands
    run = store.get_run(engine, run_id)
    assert (run.status, run.error) == ("pruned", "pruned by the search's median pruner after epoch 1")
    assert [e["epoch"] for e in store.read_epoch_metrics(engine, [run_id])] == [1]
    assert trial_runs(engine, search_id)[0]["id"] == run_id


def test_a_downgrade_below_searches_turns_pruned_runs_into_cancelled_ones(db_url, clean_storages):
    engine = make_engine(db_url)
    run_id = store.create_run(engine, CONFIG, status="pruned")
    with engine.connect() as connection:
        config = alembic_config(engine.url)
        config.attributes["connection"] = connection
        command.downgrade(config, "0012")
        connection.commit()
        assert connection.execute(text("SELECT status FROM runs WHERE id = :id"), {"id": run_id}).scalar() == "cancelled"
        with pytest.raises(IntegrityError):  # before 0013 the schema allows no pruned run
            connection.execute(text("UPDATE runs SET status = 'pruned' WHERE id = :id"), {"id": run_id})
        connection.rollback()
    dispose_engines()
    assert current_revisions(make_engine(db_url)) == {schema_head()}  # opened again: upgraded to the head


def test_a_study_lives_in_the_parallax_database_and_outlives_the_process_that_made_it(backend_db_url, clean_storages):
    import optuna

    engine = make_engine(backend_db_url)
    assert not has_study_tables(backend_db_url)
    assert study_storage(backend_db_url, create=False) is None
    study = optuna.create_study(study_name="parallax-search-1", storage=study_storage(backend_db_url),
                                direction="maximize")
    trial = study.ask()
    trial.suggest_float("lr", 1e-4, 1e-1, log=True)
    trial.report(0.4, 1)
    study.tell(trial, 0.5)
    forget_storages()  # what a new process (the dashboard restarted, a resumed driver) starts from
    again = optuna.load_study(study_name="parallax-search-1", storage=study_storage(backend_db_url, create=False))
    assert [(t.state.name, t.value, t.intermediate_values) for t in again.trials] == [("COMPLETE", 0.5, {1: 0.4})]
    assert current_revisions(engine) == {schema_head()}  # Optuna left Parallax's revision alone


def test_a_study_stored_by_another_optuna_schema_is_refused_in_one_line(db_url, clean_storages):
    study_storage(db_url)
    with make_engine(db_url).begin() as connection:
        connection.execute(text("UPDATE version_info SET schema_version = schema_version - 1"))
    forget_storages()
    with pytest.raises(StudySchemaMismatch, match=r"were stored by Optuna .* \(study schema \d+\); the installed "
                                                  r"Optuna .* uses schema \d+: install Optuna"):
        study_storage(db_url)


def test_one_live_driver_at_a_time(db_url, clean_storages):
    engine = make_engine(db_url)
    search_id = create_search(engine, "hyper", CONFIG, {"params": ["lr=1e-4:1e-1:log"]})
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        from sqlalchemy import update

        from db.connection import session_scope
        from db.tables import Search

        import socket

        with session_scope(engine) as session:  # another process of this machine drives it
            session.execute(update(Search).where(Search.id == search_id).values(
                driver_pid=other.pid, driver_host=socket.gethostname(), driver_start=state.process_start(other.pid)))
        assert get_search(engine, search_id).driven_here_by_a_live_process
        assert not claim_driver(engine, search_id)
    finally:
        other.kill()
        other.wait()
    assert claim_driver(engine, search_id)  # its driver is gone: this process takes over
    release_driver(engine, search_id, "stopped")
    assert (get_search(engine, search_id).status, get_search(engine, search_id).driver_pid) == ("stopped", None)
