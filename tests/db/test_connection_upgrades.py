"""Upgrades: a database written by the first schema (revision 0001, ``fixtures/parallax-0001.db``,
made by ``fixtures/make_parallax_0001.py``) opens with today's code, is migrated to the head,
and keeps every row; the migration scripts form one line with exactly one head; and 0015 makes the runs of
the old kind `engine` `launched`, and back.

    .venv/bin/python -m pytest tests/db/test_connection_upgrades.py -q
"""

from __future__ import annotations

import fcntl
import shutil
import sqlite3
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

from alembic.script import ScriptDirectory

from db import dispose_engines, make_engine, store
from db.connection import alembic_config, current_revisions, schema_head
from tests.support import ROOT

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "parallax-0001.db"


def rows(path: Path, table: str, columns: list[str] | None = None) -> list[dict]:
    connection = sqlite3.connect(path)
    connection.row_factory = sqlite3.Row
    try:
        picked = ", ".join(columns) if columns else "*"
        return [dict(row) for row in connection.execute(f"SELECT {picked} FROM {table} ORDER BY id")]
    finally:
        connection.close()


def heads() -> set[str]:
    return set(ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads())


def test_the_migrations_have_exactly_one_head_and_one_base():
    scripts = ScriptDirectory.from_config(alembic_config("sqlite://"))
    assert len(scripts.get_heads()) == 1, f"several heads: {scripts.get_heads()} (merge them)"
    assert len(scripts.get_bases()) == 1, f"several bases: {scripts.get_bases()}"
    # One line from the head down to 0001 through every script, each revising the one before.
    line = list(scripts.walk_revisions())  # head first
    assert line[-1].revision == "0001" and line[-1].down_revision is None
    for newer, older in zip(line, line[1:]):
        assert newer.down_revision == older.revision, f"{newer.revision} does not revise {older.revision}"
    files = list((Path(scripts.dir) / "versions").glob("*.py"))
    assert len(line) == len(files), "a migration script is not on the line from 0001 to the head"
    # How an up-to-date database is recognised without loading Alembic: from the scripts' names.
    assert all(Path(script.path).name.startswith(f"{script.revision}_") for script in line)
    assert scripts.get_heads() == [schema_head()]


def test_only_a_database_to_migrate_imports_alembic(tmp_path):
    """A new database is migrated by Alembic; one already at the head is opened with one read, and
    the process never imports Alembic (about 0.4 s of CPU in every process that opens it)."""
    probe = "import sys, db; db.make_engine(sys.argv[1]); print('alembic' in sys.modules)"
    url = f"sqlite:///{tmp_path / 'parallax.db'}"
    probes = [subprocess.run([sys.executable, "-c", probe, url], cwd=ROOT, capture_output=True, text=True,
                             timeout=120) for _ in range(2)]
    assert [p.stdout.strip() for p in probes] == ["True", "False"], [p.stderr for p in probes]
    assert current_revisions(make_engine(url)) == {schema_head()}
    dispose_engines()


def test_a_0001_database_is_upgraded_to_the_head_with_every_row_intact(tmp_path):
    path = tmp_path / "parallax.db"
    shutil.copyfile(FIXTURE, path)
    runs_before, epochs_before = rows(path, "runs"), rows(path, "epoch_metrics")
    assert len(runs_before) == 3 and len(epochs_before) == 6  # the fixture is what it claims to be

    url = f"sqlite:///{path}"
    try:
        engine = make_engine(url)
        assert current_revisions(engine) == heads() != {"0001"}
        # Every column the old schema had keeps its value in every row...
        assert rows(path, "runs", list(runs_before[0])) == runs_before
        assert rows(path, "epoch_metrics", list(epochs_before[0])) == epochs_before
        # ...and today's readers see the runs whole, new columns at their defaults.
        for before in runs_before:
            run = store.export_run(engine, before["id"])
            assert (run["status"], run["strategy"], run["model"], run["error"]) == \
                (before["status"], before["strategy"], before["model"], before["error"])
            assert [e["epoch"] for e in run["epochs"]] == \
                [e["epoch"] for e in epochs_before if e["run_id"] == before["id"]]
            assert all(e["extra"] == {} for e in run["epochs"])
        # The figures each run's row now carries were computed from its epochs, as run_figures does.
        from db import dashboard
        from db.run_figures import run_figures

        for row in dashboard.run_table(engine):
            figures = run_figures(store.read_epoch_metrics(engine, [row["id"]]))
            assert (row["epochs_done"], row["best_val_acc"], row["mean_images_per_s"], row["train_time_s"],
                    row["epochs_time_s"]) == (figures.epochs_done, figures.best_val_acc, figures.images_per_s,
                                              figures.training_time_s, figures.epochs_time_s)
        assert sum(row["epochs_done"] for row in dashboard.run_table(engine)) == 6
        assert [r.id for r in store.list_runs(engine)] == [3, 2, 1]
        assert store.get_run(engine, 1).tags == ["baseline"] and store.get_run(engine, 1).sweep_id is None
        new_id = store.create_run(engine, {"strategy": "single", "model": "resnet18", "dataset": "digits"})
        assert new_id == 4  # ids go on after the old rows
    finally:
        dispose_engines()
    opened_again = sqlite3.connect(path)
    assert opened_again.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert opened_again.execute("PRAGMA foreign_key_check").fetchall() == []
    opened_again.close()


def test_processes_creating_one_database_queue_for_its_first_open(tmp_path):
    """Switching a new SQLite file to WAL needs it alone (a second process is told "locked" at
    once): an opener waits while another holds the file's migration lock, then finds it ready."""
    path = tmp_path / "parallax.db"
    opened = []
    with open(f"{path}.migrate.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as another process's first open holds it
        opener = threading.Thread(target=lambda: opened.append(make_engine(f"sqlite:///{path}")), daemon=True)
        opener.start()
        opener.join(0.5)
        assert opener.is_alive() and not opened
        assert not path.exists()  # it waits before its first connection, not in the middle of it
    opener.join(30)
    try:
        assert opened and current_revisions(opened[0]) == {schema_head()}
        with open(path, "rb") as database:
            assert database.read(20)[18:20] == b"\x02\x02"  # WAL, as every later opener finds it
    finally:
        dispose_engines()


def test_a_scripts_values_of_one_row_each_are_packed_on_upgrade_every_one_kept(backend_db_url):
    """Revision 0011 moves ``script_metrics`` (a row per value) into packed chunks: every value comes back,
    in step order, NaN (stored as NULL) as null; a chart's buckets keep the one-step spike."""
    import alembic.command
    from sqlalchemy import create_engine, text

    alembic.command.upgrade(alembic_config(backend_db_url), "0010")
    raw = create_engine(backend_db_url)
    logged = [(step, step * 0.5, 100.0 if step == 777 else 1.0 + step % 3) for step in range(1500)]
    logged[10] = (10, 5.0, None)
    with raw.begin() as connection:
        connection.execute(text("INSERT INTO runs (created_at, status, strategy, model, dataset, config, kind) "
                                "VALUES (:now, 'completed', 'script', 'm', '', '{}', 'script')"),
                           {"now": "2026-01-01 00:00:00"})
        rows = [{"run_id": 1, "name": name, "step": step, "t_s": at, "value": value}
                for name in ("train/loss", "lr") for step, at, value in reversed(logged)]
        connection.execute(text("INSERT INTO script_metrics (run_id, name, step, t_s, value) "
                                "VALUES (:run_id, :name, :step, :t_s, :value)"), rows)
    raw.dispose()
    try:
        engine = make_engine(backend_db_url)
        assert current_revisions(engine) == {schema_head()}
        from db import script_metrics

        every = script_metrics.read_points(engine, [1], names=["train/loss"], max_points=None)
        assert [(p["step"], p["t_s"], p["value"]) for p in every] == logged
        assert script_metrics.metric_names(engine, [1]) == {1: ["lr", "train/loss"]}
        assert script_metrics.last_logged_step(engine, 1) == 1499 and script_metrics.points_logged(engine, 1) == 3000
        buckets = script_metrics.read_points(engine, [1], names=["lr"], max_points=20)
        assert len(buckets) <= 20 and max(b["max"] for b in buckets) == 100.0
        assert sum(b["n"] for b in buckets) == 1500 and sum(b["nonfinite"] for b in buckets) == 1
    finally:
        dispose_engines()


def test_runs_of_the_old_kind_engine_are_launched_after_0015_and_back_after_its_downgrade(backend_db_url):
    import sqlalchemy as sa
    from alembic import command

    engine = sa.create_engine(backend_db_url)
    config = alembic_config(backend_db_url)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0014")
    runs = sa.Table("runs", sa.MetaData(), autoload_with=engine)
    base = {"created_at": datetime(2026, 1, 2, tzinfo=timezone.utc), "status": "completed", "strategy": "single", "model": "resnet18",
            "dataset": "digits", "config": {}}
    with engine.begin() as connection:
        connection.execute(runs.insert(), [{**base, "kind": "engine"}, {**base, "kind": "script"}])
        connection.execute(runs.insert().values(**base))  # the column's default at 0014
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0015")
    with engine.connect() as connection:
        assert connection.execute(sa.select(runs.c.kind).order_by(runs.c.id)).scalars().all() == [
            "launched", "script", "launched"]
        connection.execute(runs.insert().values(**base))
        connection.commit()
        assert connection.execute(sa.select(runs.c.kind).order_by(runs.c.id.desc())).scalars().first() == "launched"
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0014")
    with engine.connect() as connection:
        assert connection.execute(sa.select(runs.c.kind).order_by(runs.c.id)).scalars().all() == [
            "engine", "script", "engine", "engine"]
    engine.dispose()
def test_system_samples_are_moved_into_series_on_upgrade_every_figure_kept(backend_db_url):
    """Revision 0014 moves ``system_samples`` (a row per sample, its ranks and GPUs in JSON) into a packed
    series per figure: every sample comes back whole (a figure not measured as None, a second machine's
    samples without host figures), and a chart of one metric keeps a one-second spike."""
    import alembic.command
    import sqlalchemy as sa

    alembic.command.upgrade(alembic_config(backend_db_url), "0013")
    raw = sa.create_engine(backend_db_url)
    old = sa.table("system_samples", sa.column("run_id", sa.Integer), sa.column("t_s", sa.Float),
                   sa.column("node", sa.Integer), sa.column("host_cpu_pct", sa.Float),
                   sa.column("host_memory_mb", sa.Float), sa.column("processes", sa.JSON), sa.column("gpus", sa.JSON))
    samples = [{"t_s": float(t), "node": 0, "host_cpu_pct": 50.0 + t % 7, "host_memory_mb": 2000.0,
                "processes": [{"rank": 0, "cpu_pct": 90.0, "rss_mb": 800.0 + t},
                              {"rank": 1, "cpu_pct": 91.0, "rss_mb": None if t == 3 else 810.0}],
                "gpus": [{"index": 0, "util_pct": 100.0 if t == 123 else 40.0, "memory_used_mb": 1000.0,
                          "power_w": 250.0, "temperature_c": 60.0, "sm_clock_mhz": None}]}
               for t in range(300)]
    samples += [{"t_s": t + 0.5, "node": 1, "host_cpu_pct": None, "host_memory_mb": None,
                 "processes": [{"rank": 2, "cpu_pct": 70.0, "rss_mb": 700.0}], "gpus": []} for t in range(0, 300, 50)]
    with raw.begin() as connection:
        connection.execute(sa.text("INSERT INTO runs (created_at, status, strategy, model, dataset, config, kind) "
                                   "VALUES (:now, 'completed', 'ddp', 'm', 'digits', '{}', 'engine')"),
                           {"now": "2026-01-01 00:00:00"})
        connection.execute(sa.insert(old), [{"run_id": 1, **sample} for sample in reversed(samples)])
    raw.dispose()
    try:
        engine = make_engine(backend_db_url)
        assert current_revisions(engine) == {schema_head()}
        from db import system_metrics

        moved = system_metrics.read_samples(engine, [1])
        expected = sorted(({"run_id": 1, **sample} for sample in samples), key=lambda s: (s["t_s"], s["node"]))
        assert moved == expected
        spikes = system_metrics.read_metric(engine, [1], [("gpu", "util_pct")], max_points=20)
        assert len(spikes) <= 20 and max(row["max"] for row in spikes) == 100.0
        assert sum(row["n"] for row in spikes) == 300
        with engine.connect() as connection:
            tables = sa.inspect(connection).get_table_names()
        assert "system_samples" not in tables and {"system_series", "system_chunks"} <= set(tables)
        dispose_engines()
        alembic.command.downgrade(alembic_config(backend_db_url), "0013")  # and back, every sample whole
        raw = sa.create_engine(backend_db_url)
        with raw.connect() as connection:
            back = [dict(row._mapping) for row in connection.execute(
                sa.select(old).order_by(old.c.t_s, old.c.node))]
        raw.dispose()
        assert back == expected
    finally:
        dispose_engines()
