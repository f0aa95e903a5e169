"""Parallax on a shared PostgreSQL database: a real training run records into it, first-time
migrations queue on an advisory lock, dropped connections are replaced, and a database that
cannot be opened is one line naming its URL without the password. (The store, migration and
lifecycle tests in test_db*.py run on PostgreSQL too.)

    .venv/bin/python -m pytest tests/db/test_connection_postgres.py -q
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, make_url, pool, select, text
from streamlit.testing.v1 import AppTest

import db
import db.connection as db_engine
from tests.support import ROOT, run_cli
from db import store
from db.connection import MIGRATION_LOCK_KEY, DatabaseUnavailable


@pytest.fixture(autouse=True)
def _close_engines():
    yield
    db.dispose_engines()


def test_a_cli_run_records_into_postgresql(parallax_home, postgres_url):
    env = {"PARALLAX_DB_URL": postgres_url}
    result = run_cli("run", "--dataset", "digits", "--model", "test_resnet", "--image-size", "16", "--epochs", "1",
                     home=parallax_home, env_extra=env, timeout=300)
    last = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0 and last.endswith("status=completed"), result.stdout + result.stderr
    run_id = last.split()[0].split("=")[1]

    exported = run_cli("export", run_id, home=parallax_home, env_extra=env)
    assert exported.returncode == 0, exported.stderr
    run = json.loads(exported.stdout)
    assert [epoch["epoch"] for epoch in run["epochs"]] == [1]
    assert 0.0 <= run["epochs"][0]["val_acc"] <= 1.0 and run["epochs"][0]["images_per_s"] > 0
    assert run["status"] == "completed" and run["heartbeat_at"]
    assert not (parallax_home / "parallax.db").exists()  # nothing went to SQLite
    assert store.get_run(db.make_engine(postgres_url), int(run_id)).model == "test_resnet"


def test_a_launched_supervisor_gets_the_url_without_showing_its_password(parallax_home, postgres_url):
    password = make_url(postgres_url).password
    result = run_cli("--db", postgres_url, "launch", "--dataset", "digits", "--model", "test_resnet",
                     "--image-size", "16", "--epochs", "1", home=parallax_home)
    assert result.returncode == 0, result.stderr
    run_id = int(result.stdout.split()[0].split("=")[1])
    engine = db.make_engine(postgres_url)
    pid = store.get_run(engine, run_id).pid
    try:
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
        assert "supervisor" in command_line and password and password not in command_line  # ps shows argv to all
    finally:
        assert run_cli("--db", postgres_url, "cancel", str(run_id), home=parallax_home).returncode == 0
    assert store.get_run(engine, run_id).status == "cancelled"


def test_first_migration_waits_for_the_advisory_lock(postgres_url):
    # Another machine migrating this database holds the lock: this process must wait, not race it.
    other = create_engine(postgres_url, poolclass=pool.NullPool)
    opened: list[object] = []
    with other.connect() as holder:
        holder.execute(select(func.pg_advisory_lock(MIGRATION_LOCK_KEY)))
        opener = threading.Thread(target=lambda: opened.append(db.make_engine(postgres_url)), daemon=True)
        opener.start()
        opener.join(timeout=1.5)
        assert opener.is_alive() and not opened, "migrated without taking the lock"
        tables = holder.execute(text("SELECT count(*) FROM pg_tables WHERE tablename = 'alembic_version'")).scalar()
        assert tables == 0
        holder.execute(select(func.pg_advisory_unlock(MIGRATION_LOCK_KEY)))
        opener.join(timeout=30)
    other.dispose()
    assert opened and db_engine.current_revisions(opened[0]) == db_engine.current_revisions(db.make_engine(postgres_url))
    assert db_engine.current_revisions(opened[0])


def test_a_dropped_connection_is_replaced_before_use(postgres_url):
    engine = db.make_engine(postgres_url)
    run_id = store.create_run(engine, {"strategy": "single", "model": "resnet18", "dataset": "digits"})
    admin = create_engine(postgres_url, poolclass=pool.NullPool)
    with admin.connect() as connection:  # as a server restart or a firewall would
        ended = connection.execute(text(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )).scalar()
    admin.dispose()
    assert ended >= 1  # the engine's pooled connection was among them
    assert store.get_run(engine, run_id).status == "running"


def test_a_database_that_cannot_be_opened_is_one_line_without_the_password(postgres_server):
    missing = postgres_server.set(database="no_such_database")
    with pytest.raises(DatabaseUnavailable) as raised:
        db.make_engine(missing.render_as_string(hide_password=False))
    message = str(raised.value)
    assert message.startswith(f"cannot open the database {missing.render_as_string(hide_password=True)}: ")
    assert 'database "no_such_database" does not exist' in message
    assert "\n" not in message
    assert postgres_server.password is None or str(postgres_server.password) not in message


def test_cli_names_an_unreachable_database_in_one_line(parallax_home):
    # Port 1 on loopback: nothing listens, the connection is refused at once. Needs no server.
    url = "postgresql+psycopg://parallax:s3cret@127.0.0.1:1/parallax"
    started = time.monotonic()
    result = run_cli("list", home=parallax_home, env_extra={"PARALLAX_DB_URL": url})
    assert result.returncode == 2
    assert result.stderr.startswith("error: cannot open the database postgresql+psycopg://parallax:***@127.0.0.1:1/parallax: ")
    assert len(result.stderr.strip().splitlines()) == 1 and "s3cret" not in result.stderr
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("url, expected", [
    ("not a url", "database URL 'not a url' is not a database URL; use sqlite:///"),
    ("nosuchdb://u:pw@host/db", "database URL nosuchdb://u:***@host/db needs a driver that is not installed"),
])
def test_unusable_urls_say_what_is_allowed(url, expected):
    with pytest.raises(DatabaseUnavailable) as raised:
        db.make_engine(url)
    assert str(raised.value).startswith(expected) and "pw@" not in str(raised.value)
    assert "postgresql+psycopg://user:password@host/database" in str(raised.value)  # what is allowed


def test_dashboard_shows_an_unreachable_database_as_one_error(parallax_home, monkeypatch):
    monkeypatch.setenv("PARALLAX_DB_URL", "postgresql+psycopg://parallax:s3cret@127.0.0.1:1/parallax")
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=90)
    at.switch_page("pages/runs.py")
    at.run()
    assert not at.exception, at.exception
    (error,) = [e.value for e in at.error]
    assert error.startswith("cannot open the database postgresql+psycopg://parallax:***@127.0.0.1:1/parallax: ")
    assert "s3cret" not in error
    assert not at.sidebar.caption  # the message is the whole page: no navigation to pages that cannot load
