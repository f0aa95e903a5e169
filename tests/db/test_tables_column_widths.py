"""Every value the config allows fits its column on SQLite and on a real PostgreSQL (a dataset path
as long as the OS allows; was varchar(128), refused by PostgreSQL only), migration 0009 keeps the
rows of a database at 0008, and a command that fails after the database opened is not worded as
a failure to open it.

    .venv/bin/python -m pytest tests/db/test_tables_column_widths.py -q
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
import sqlalchemy as sa
from alembic import command

import db
from db import store
from db.connection import alembic_config, current_revisions, schema_head
from tests.trainer_backend.control.test_cli_bad_input import BASE, write_images
from trainer_backend.control.cli import main
from contract.config import MAX_PATH_LENGTH, RunConfig


def longest_path() -> str:
    """A dataset path of exactly the OS's limit, every part within NAME_MAX."""
    parts, length = [], 0
    while length + 201 <= MAX_PATH_LENGTH:
        parts.append("d" * 200)
        length += 201
    path = "/" + "/".join(parts)
    return path + "/" + "e" * (MAX_PATH_LENGTH - len(path) - 1)


@pytest.fixture(autouse=True)
def _close_engines():
    yield
    db.dispose_engines()


def test_a_dataset_path_as_long_as_the_os_allows_is_recorded_and_read_back(backend_db_url):
    path = longest_path()
    assert len(path) == MAX_PATH_LENGTH
    config = RunConfig(dataset=path, model="resnet18.a1_in1k").to_dict()  # the config accepts it...
    engine = db.make_engine(backend_db_url)
    run_id = store.create_run(engine, config, status="queued")  # ...and so must the database
    (run,) = store.list_runs(engine)
    assert (run.id, run.dataset, run.model) == (run_id, path, "resnet18.a1_in1k")
    assert store.get_run(engine, run_id).config["dataset"] == path


def test_a_run_on_postgresql_trains_on_a_folder_whose_path_is_over_128_characters(postgres_url, tmp_path,
                                                                                 parallax_home, capsys):
    folder = tmp_path / ("long-named-dataset-folder-" * 4) / ("images-" * 10)
    assert len(str(folder)) > 200
    for label in ("a", "b"):
        write_images(folder / label, 4)
    code = main(["--db", postgres_url, *BASE, "--dataset", str(folder), "--batch-size", "4"])
    captured = capsys.readouterr()
    assert code == 0 and captured.out.strip().endswith("run_id=1 status=completed"), captured.out + captured.err
    main(["--db", postgres_url, "export", "1"])
    exported = json.loads(capsys.readouterr().out)
    assert exported["dataset"] == str(folder) and [e["epoch"] for e in exported["epochs"]] == [1]


def test_a_database_at_0008_is_migrated_keeping_its_runs_and_then_takes_long_paths(backend_db_url):
    engine = sa.create_engine(backend_db_url)
    config = alembic_config(backend_db_url)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0008")
    short = {"created_at": datetime(2026, 1, 2, tzinfo=timezone.utc), "status": "completed", "strategy": "ddp",
             "model": "resnet18", "dataset": "/data/" + "x" * 122, "config": {"dataset": "/data/" + "x" * 122}}
    runs = sa.Table("runs", sa.MetaData(), autoload_with=engine)
    assert isinstance(runs.c.dataset.type, sa.String) and runs.c.dataset.type.length == 128
    with engine.begin() as connection:
        connection.execute(runs.insert().values(**short))
    engine.dispose()

    upgraded = db.make_engine(backend_db_url)
    assert current_revisions(upgraded) == {schema_head()}
    (old,) = store.list_runs(upgraded)
    assert (old.dataset, old.model, old.status, old.strategy) == (short["dataset"], "resnet18", "completed", "ddp")
    indexes = {index["name"] for index in sa.inspect(upgraded).get_indexes("runs")}
    assert "ix_runs_dataset" not in indexes and "ix_runs_model" in indexes
    new_id = store.create_run(upgraded, RunConfig(dataset=longest_path()).to_dict(), status="queued")
    assert store.get_run(upgraded, new_id).dataset == longest_path()


def test_a_command_that_fails_after_the_database_opened_is_not_called_a_failure_to_open_it(postgres_url, parallax_home,
                                                                                          capsys):
    """A role that may read but not write (real PostgreSQL): the database opens, the insert is refused."""
    engine = db.make_engine(postgres_url)  # migrated to the head by its owner
    url = sa.make_url(postgres_url)
    role = f"reader_{url.database}"[:60]
    with engine.begin() as connection:
        connection.execute(sa.text(f'CREATE ROLE "{role}" LOGIN PASSWORD \'readonly\''))
        connection.execute(sa.text(f'GRANT CONNECT ON DATABASE "{url.database}" TO "{role}"'))
        connection.execute(sa.text(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{role}"'))
    db.dispose_engines()
    reader = url.set(username=role, password="readonly").render_as_string(hide_password=False)
    try:
        assert main(["--db", reader, *BASE]) == 2
        line = capsys.readouterr().err.strip()
        masked = url.set(username=role, password="readonly").render_as_string(hide_password=True)
        assert line.startswith(f"error: the database {masked} failed a command after it opened: "), line
        assert "permission denied for table runs" in line and "cannot open" not in line, line
        assert "what was recorded before stays" in line and len(line.splitlines()) == 1
    finally:
        db.dispose_engines()
        with engine.begin() as connection:
            connection.execute(sa.text(f'REVOKE ALL ON ALL TABLES IN SCHEMA public FROM "{role}"'))
            connection.execute(sa.text(f'REVOKE ALL ON DATABASE "{url.database}" FROM "{role}"'))
            connection.execute(sa.text(f'DROP ROLE "{role}"'))
        engine.dispose()
