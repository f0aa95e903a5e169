"""Tests for db/: real SQLite files under tmp_path and real PostgreSQL databases (every test that
takes ``db_url`` runs on both), real migrations, real second processes.

    .venv/bin/python -m pytest tests/db/test_store.py -q
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from datetime import timezone
from pathlib import Path

import alembic.command
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import JSON, event, func, select

import db
import db.connection as db_engine
from db import profiles
from db.tables import Base, EpochMetric

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {"strategy": "ddp", "model": "resnet18", "dataset": "cifar10", "epochs": 2, "tags": ["baseline"]}
EXPORT_KEYS = ["run_id", "status", "error", "pid", "config", "notes", "epochs"]
EXPORT_EXTRA_KEYS = {
    "created_at", "started_at", "finished_at", "host", "world_size", "tags", "user_note",
    "strategy", "model", "dataset", "heartbeat_at", "progress", "sweep_id", "nodes", "hosts", "elastic_run_id",
    "measurements", "steps", "system", "figures", "kind", "script_metrics",
}


HEAD = "0015"  # the newest migration; a new one bumps this


def epoch_metrics(epoch: int, **overrides) -> dict:
    metrics = {
        "epoch": epoch,
        "train_loss": 2.0 / epoch,
        "train_acc": 0.5 + epoch / 100,
        "val_loss": 2.5 / epoch,
        "val_acc": 0.4 + epoch / 100,
        "epoch_time_s": 3.25,
        "train_time_s": 2.75,
        "images_per_s": 1250.5,
        "lr": 0.001,
        "peak_memory_mb": {"cuda:0": 1024.5, "cuda:1": 998.25},
        "extra": {"stage_busy_fraction": {"stage0": 0.5}} if epoch == 2 else {},
    }
    metrics.update(overrides)
    return metrics


@pytest.fixture(autouse=True)
def _close_engines():
    yield
    db.dispose_engines()


@pytest.fixture
def db_url(backend_db_url):
    return backend_db_url


@pytest.fixture
def engine(db_url):
    return db.make_engine(db_url)


def metric_rows(engine, run_id: int) -> int:
    with db.session_scope(engine) as session:
        return session.scalar(select(func.count()).select_from(EpochMetric).where(EpochMetric.run_id == run_id))


# --- engine and migrations ----------------------------------------------------------------


def test_new_connections_have_the_sqlite_pragmas(tmp_path):
    engine = db.make_engine(f"sqlite:///{tmp_path / 'parallax.db'}")
    engine.dispose()  # empty the pool: check a connection opened now
    with engine.connect() as connection:
        pragma = lambda name: connection.exec_driver_sql(f"PRAGMA {name}").scalar()  # noqa: E731
        assert pragma("journal_mode") == "wal"
        assert pragma("foreign_keys") == 1
        assert pragma("busy_timeout") == 30000
        assert pragma("synchronous") == 1  # NORMAL


def test_migrations_reach_head_and_match_the_models(engine):
    heads = ScriptDirectory.from_config(db_engine.alembic_config(engine.url)).get_heads()
    assert len(heads) == 1, f"migrations must form one line, found heads {heads}"
    assert db_engine.current_revisions(engine) == set(heads) == {HEAD}
    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"compare_type": True, "compare_server_default": _compare_server_default}
        )
        assert compare_metadata(context, Base.metadata) == []


def _compare_server_default(context, inspected_column, metadata_column, inspected, metadata_default, rendered):
    """Alembic's comparison, except for JSON defaults on PostgreSQL, which it compares with
    ``'{}'::json = '{}'`` (json has no equality operator): compare their text instead."""
    if context.dialect.name == "postgresql" and isinstance(metadata_column.type, JSON) and inspected:
        return inspected.split("::")[0] != rendered
    return None


def test_make_engine_creates_folders_and_reopens_without_migrating(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'a' / 'b' / 'parallax.db'}"
    first = db.make_engine(url)
    assert db.make_engine(url) is first
    run_id = db.create_run(first, CONFIG)
    db.dispose_engines()

    def no_upgrade(*args, **kwargs):
        raise AssertionError("an up-to-date database must not be migrated again")

    monkeypatch.setattr(alembic.command, "upgrade", no_upgrade)
    reopened = db.make_engine(url)
    assert reopened is not first
    assert db.get_run(reopened, run_id).model == "resnet18"


def _open_engine(url: str, barrier) -> None:
    barrier.wait(timeout=30)
    db.make_engine(url)


def test_two_processes_can_create_the_same_database_at_once(db_url):
    spawn = multiprocessing.get_context("spawn")
    barrier = spawn.Barrier(2)
    processes = [spawn.Process(target=_open_engine, args=(db_url, barrier)) for _ in range(2)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
    assert [process.exitcode for process in processes] == [0, 0]
    assert db_engine.current_revisions(db.make_engine(db_url)) == {HEAD}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_opens_its_own_engine(engine, db_url):
    def child() -> None:
        own = db.make_engine(db_url)
        db.create_run(own, CONFIG)
        sys.exit(0 if own is not engine else 3)

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join(timeout=30)
    assert process.exitcode == 0
    assert len(db.list_runs(engine)) == 1


def test_alembic_cli_migrates_with_the_shipped_ini(tmp_path, db_url):
    # A SQLite file in a folder that does not exist yet: the CLI creates it.
    url = db_url.replace("parallax.db", "cli/parallax.db") if db_url.startswith("sqlite") else db_url
    result = subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(ROOT / "db" / "alembic.ini"), "upgrade", "head"],
        cwd=tmp_path,  # not the repository root: the ini must find everything by itself
        env={**os.environ, "PARALLAX_DB_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "Running upgrade  -> 0001" in result.stderr
    assert db_engine.current_revisions(db.make_engine(url)) == {HEAD}


# --- store ----------------------------------------------------------------------------------


def test_round_trip_through_export(engine):
    run_id = db.create_run(engine, CONFIG, notes=["DataParallel on CPU is a pass-through"], world_size=2)
    db.set_process(engine, run_id, pid=4242, host="node-1")
    db.log_epoch(engine, run_id, epoch_metrics(1))
    db.log_epoch(engine, run_id, epoch_metrics(2))
    db.set_status(engine, run_id, "completed")

    exported = db.export_run(engine, run_id)

    assert list(exported)[: len(EXPORT_KEYS)] == EXPORT_KEYS
    assert set(exported) - set(EXPORT_KEYS) <= EXPORT_EXTRA_KEYS
    assert json.loads(json.dumps(exported)) == exported
    assert exported["run_id"] == run_id
    assert exported["status"] == "completed"
    assert exported["error"] is None
    assert exported["pid"] == 4242
    assert exported["host"] == "node-1"
    assert exported["config"] == CONFIG
    assert exported["notes"] == ["DataParallel on CPU is a pass-through"]
    # each epoch gains energy_j_per_image, lifted out of extra (null where not measured)
    assert exported["epochs"] == [{**epoch_metrics(n), "energy_j_per_image": None} for n in (1, 2)]
    assert (exported["strategy"], exported["model"], exported["dataset"]) == ("ddp", "resnet18", "cifar10")
    assert exported["tags"] == ["baseline"]
    assert exported["world_size"] == 2
    assert exported["finished_at"] >= exported["started_at"] >= exported["created_at"]

    record = db.get_run(engine, run_id)
    assert record.created_at.tzinfo == timezone.utc
    assert record.created_at.isoformat() == exported["created_at"]


def test_logging_the_same_epoch_again_replaces_it(engine):
    run_id = db.create_run(engine, CONFIG)
    db.log_epoch(engine, run_id, epoch_metrics(1))
    db.log_epoch(engine, run_id, epoch_metrics(1, train_loss=0.125, peak_memory_mb={"cpu": 64.0}))

    rows = db.read_epoch_metrics(engine, [run_id])
    assert len(rows) == 1
    assert rows[0]["train_loss"] == 0.125
    assert rows[0]["peak_memory_mb"] == {"cpu": 64.0}
    assert metric_rows(engine, run_id) == 1


def test_read_epoch_metrics_orders_by_run_then_epoch(engine):
    first, second = db.create_run(engine, CONFIG), db.create_run(engine, CONFIG)
    for run_id, epoch in [(second, 2), (first, 2), (second, 1), (first, 1)]:
        db.log_epoch(engine, run_id, epoch_metrics(epoch))
    rows = db.read_epoch_metrics(engine, [second, first])
    assert [(row["run_id"], row["epoch"]) for row in rows] == [(first, 1), (first, 2), (second, 1), (second, 2)]
    assert db.read_epoch_metrics(engine, []) == []


def test_log_epoch_refuses_unknown_metrics(engine):
    run_id = db.create_run(engine, CONFIG)
    with pytest.raises(ValueError, match="val_accuracy"):
        db.log_epoch(engine, run_id, {**epoch_metrics(1), "val_accuracy": 0.9})
    with pytest.raises(ValueError, match="epoch counts from 1"):
        db.log_epoch(engine, run_id, {**epoch_metrics(1), "epoch": 0})
    assert metric_rows(engine, run_id) == 0


def test_set_status_names_a_bad_status_and_the_allowed_ones(engine):
    run_id = db.create_run(engine, CONFIG)
    with pytest.raises(ValueError, match="'finished'") as raised:
        db.set_status(engine, run_id, "finished")
    assert all(status in str(raised.value) for status in db.RUN_STATUSES)
    assert db.get_run(engine, run_id).status == "running"


@pytest.mark.parametrize("terminal", ["completed", "failed", "cancelled", "lost"])
def test_status_changes_stamp_start_and_finish(engine, terminal):
    run_id = db.create_run(engine, CONFIG, status="queued")
    queued = db.get_run(engine, run_id)
    assert (queued.started_at, queued.finished_at) == (None, None)

    db.set_status(engine, run_id, "running")
    running = db.get_run(engine, run_id)
    assert running.started_at is not None and running.finished_at is None

    db.set_status(engine, run_id, terminal, error="Traceback: boom")
    db.set_status(engine, run_id, terminal)  # no error given: the earlier one stays
    finished = db.get_run(engine, run_id)
    assert finished.status == terminal
    assert finished.finished_at >= finished.started_at == running.started_at
    assert finished.error == "Traceback: boom"


def test_add_notes_appends_without_duplicates(engine):
    run_id = db.create_run(engine, CONFIG, notes=["a"])
    db.add_notes(engine, run_id, ["b", "a", "c", "b"])
    assert db.get_run(engine, run_id).notes == ["a", "b", "c"]


def test_list_runs_is_newest_first_and_never_reads_config(engine):
    run_ids = [db.create_run(engine, {**CONFIG, "model": f"model-{i}"}) for i in range(3)]
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda conn, cursor, sql, *rest: statements.append(sql))

    runs = db.list_runs(engine)
    assert [run.id for run in runs] == run_ids[::-1]
    assert runs[0].model == "model-2" and runs[0].tags == ["baseline"]
    assert [run.id for run in db.list_runs(engine, limit=2)] == run_ids[::-1][:2]
    assert statements and not any("config" in sql for sql in statements)


def test_delete_run_cascades_to_metrics_and_never_reuses_the_id(engine):
    kept, deleted = db.create_run(engine, CONFIG), db.create_run(engine, CONFIG)
    for run_id in (kept, deleted):
        db.log_epoch(engine, run_id, epoch_metrics(1))
        db.log_epoch(engine, run_id, epoch_metrics(2))

    db.delete_run(engine, deleted)

    assert db.get_run(engine, deleted) is None
    assert metric_rows(engine, deleted) == 0
    assert metric_rows(engine, kept) == 2
    # The deleted run's files may still exist under runs/run-<id>.
    assert db.create_run(engine, CONFIG) == deleted + 1


def test_unknown_run_ids_raise_lookup_error(engine):
    missing = 999
    calls = [
        lambda: db.set_status(engine, missing, "failed"),
        lambda: db.set_process(engine, missing, pid=1, host="h"),
        lambda: db.add_notes(engine, missing, ["x"]),
        lambda: db.log_epoch(engine, missing, epoch_metrics(1)),
        lambda: db.export_run(engine, missing),
        lambda: db.delete_run(engine, missing),
    ]
    for call in calls:
        with pytest.raises(LookupError, match=f"no run with id {missing}"):
            call()
    assert db.get_run(engine, missing) is None


def test_profiles_keep_a_large_trace_byte_for_byte(engine):
    run_id = db.create_run(engine, CONFIG)
    trace = os.urandom(8 * 1024 * 1024)  # incompressible, as big as a long gzipped trace gets
    op = {"name": "aten::conv2d", "calls": 3, "self_cpu_us": 10.0, "cpu_total_us": 30.0, "self_device_us": 0.0,
          "device_total_us": 0.0, "self_cpu_memory_bytes": 2**33, "self_device_memory_bytes": 0}
    step = {"step": 2, "data_loading_ms": 1.0, "forward_ms": 2.0, "backward_ms": 3.0, "optimizer_step_ms": 0.5,
            "communication_ms": 0.0, "other_ms": 0.25, "total_ms": 6.75}
    profiles.save_profile(engine, run_id, 0, ops=[op], steps=[step], trace_gz=trace, trace_bytes=10 * len(trace))
    profiles.save_profile(engine, run_id, 1, ops=[op], steps=[step], trace_gz=b"rank 1", trace_bytes=6)

    assert profiles.read_trace(engine, run_id, 0) == trace
    assert profiles.list_traces(engine, run_id) == [
        {"rank": 0, "trace_bytes": 10 * len(trace), "gzip_bytes": len(trace)},
        {"rank": 1, "trace_bytes": 6, "gzip_bytes": 6},
    ]
    assert profiles.read_ops(engine, run_id)[0]["self_cpu_memory_bytes"] == 2**33
    assert [row["rank"] for row in profiles.read_steps(engine, [run_id])] == [0, 1]
    assert profiles.profiled_runs(engine) == {run_id}
    db.delete_run(engine, run_id)  # the profile goes with the run
    assert profiles.profiled_runs(engine) == set()


# --- a supervisor writing while the dashboard reads ---------------------------------------------

WRITER_EPOCHS = 30


def _write_epochs(url: str, run_ids: list[int], started) -> None:
    engine = db.make_engine(url)
    started.set()
    for epoch in range(1, WRITER_EPOCHS + 1):
        for run_id in run_ids:
            db.log_epoch(engine, run_id, epoch_metrics(epoch))


def test_reads_and_writes_while_another_process_writes(engine, db_url):
    run_ids = [db.create_run(engine, CONFIG) for _ in range(10)]
    own_run = db.create_run(engine, CONFIG)
    expected_rows = WRITER_EPOCHS * len(run_ids)  # 300

    spawn = multiprocessing.get_context("spawn")
    started = spawn.Event()  # the reads start with the writes, not while the writer's interpreter loads
    writer = spawn.Process(target=_write_epochs, args=(db_url, run_ids, started))
    writer.start()
    try:
        assert started.wait(timeout=60), "the writer did not start"
        seen_counts: list[int] = []
        while writer.is_alive() or not seen_counts:
            # Any OperationalError ("database is locked") here fails the test.
            seen_counts.append(len(db.read_epoch_metrics(engine, run_ids)))
            db.list_runs(engine)
            db.add_notes(engine, own_run, [f"read {len(seen_counts)}"])
        writer.join(timeout=60)
    finally:  # a writer that never started, or hangs, is not left behind
        if writer.is_alive():
            writer.kill()
            writer.join()

    assert writer.exitcode == 0
    assert seen_counts == sorted(seen_counts), "a reader saw committed rows disappear"
    assert any(0 < count < expected_rows for count in seen_counts), "reads never overlapped the writes"
    rows = db.read_epoch_metrics(engine, run_ids)
    assert len(rows) == expected_rows
    assert {(row["run_id"], row["epoch"]) for row in rows} == {
        (run_id, epoch) for run_id in run_ids for epoch in range(1, WRITER_EPOCHS + 1)
    }
    assert len(db.get_run(engine, own_run).notes) == len(seen_counts)
