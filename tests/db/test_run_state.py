"""Racing state changes: the first end of a run stands, claims only take queued runs, and a
run whose process is gone reads as lost: on this host by its pid, on another by its heartbeat.
Every test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from sqlalchemy import update

from db import run_state as state
from db import make_engine, session_scope, store
from db.tables import Run

CONFIG = {"strategy": "single", "model": "resnet18", "dataset": "digits", "devices": ["cpu"]}


@pytest.fixture
def db_url(backend_db_url):
    return backend_db_url


@pytest.fixture
def engine(db_url):
    return make_engine(db_url)


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()  # reaped: the pid no longer exists
    return process.pid


def beat_seconds_ago(engine, run_id: int, seconds: float) -> None:
    with session_scope(engine) as session:
        session.execute(update(Run).where(Run.id == run_id)
                        .values(heartbeat_at=state.database_now(engine) - timedelta(seconds=seconds)))


def test_claim_takes_only_a_queued_run(engine):
    run_id = store.create_run(engine, CONFIG, status="queued")
    assert state.claim(engine, run_id) is True
    assert state.claim(engine, run_id) is False
    run = store.get_run(engine, run_id)
    assert run.status == "running" and run.started_at and run.heartbeat_at


def test_the_first_end_stands(engine):
    run_id = store.create_run(engine, CONFIG)
    assert state.finish(engine, run_id, "cancelled", error="cancelled by the user") is True
    assert state.finish(engine, run_id, "failed", error="late") is False
    run = store.get_run(engine, run_id)
    assert (run.status, run.error) == ("cancelled", "cancelled by the user")
    with pytest.raises(ValueError, match="'running' does not end a run"):
        state.finish(engine, run_id, "running")


def test_progress_and_active_runs(engine):
    run_id = store.create_run(engine, {**CONFIG, "devices": ["cuda:0", "cuda:1"]})
    state.set_progress(engine, run_id, epoch=2, step=7, total_steps=12)
    exported = store.export_run(engine, run_id)
    assert exported["progress"] == {"epoch": 2, "step": 7, "total_steps": 12}
    (active,) = state.active_runs(engine)
    assert active.gpus == {"cuda:0", "cuda:1"} and not active.uses_cpu


def test_a_run_whose_process_is_gone_is_marked_lost(engine):
    dead = dead_pid()
    gone = store.create_run(engine, CONFIG)
    store.set_process(engine, gone, pid=dead, host=socket.gethostname())
    state.heartbeat(engine, gone)  # a fresh heartbeat does not hide a dead process here
    alive = store.create_run(engine, CONFIG)
    store.set_process(engine, alive, pid=os.getpid(), host=socket.gethostname())
    reused = store.create_run(engine, CONFIG)  # its pid lives, but has not beaten for long: reused
    store.set_process(engine, reused, pid=os.getpid(), host=socket.gethostname())
    beat_seconds_ago(engine, reused, state.PID_REUSED_AFTER.total_seconds() + 5)
    late = store.create_run(engine, CONFIG)  # beats skipped while the database was locked
    store.set_process(engine, late, pid=os.getpid(), host=socket.gethostname())
    beat_seconds_ago(engine, late, state.STALE_AFTER.total_seconds() + 60)
    done = store.create_run(engine, CONFIG)
    store.set_process(engine, done, pid=dead, host=socket.gethostname())
    store.set_status(engine, done, "completed")

    assert state.mark_lost_runs(engine) == [gone, reused]
    assert store.get_run(engine, gone).status == "lost"
    assert f"process {dead} on {socket.gethostname()} is gone" in store.get_run(engine, gone).error
    assert store.get_run(engine, alive).status == "running"
    assert store.get_run(engine, late).status == "running"  # a live local pid outweighs a late beat
    assert store.get_run(engine, done).status == "completed"  # an ended run is never relabelled
    assert state.heartbeat(engine, gone) is False  # an ended run takes no more beats


def test_a_run_on_another_host_is_judged_by_its_heartbeat_not_its_pid(engine):
    # The pids say nothing about another machine: a pid dead here, and one alive here.
    beating = store.create_run(engine, CONFIG)
    store.set_process(engine, beating, pid=dead_pid(), host="gpu-node-7")
    beat_seconds_ago(engine, beating, state.STALE_AFTER.total_seconds() - 10)
    silent = store.create_run(engine, CONFIG)
    store.set_process(engine, silent, pid=os.getpid(), host="gpu-node-8")
    beat_seconds_ago(engine, silent, state.STALE_AFTER.total_seconds() + 5)
    starting = store.create_run(engine, CONFIG, status="queued")  # launched, its supervisor not beating yet
    store.set_process(engine, starting, pid=dead_pid(), host="gpu-node-9")

    assert state.mark_lost_runs(engine) == [silent]
    error = store.get_run(engine, silent).error
    assert f"no heartbeat from process {os.getpid()} on gpu-node-8 for 3" in error
    assert store.get_run(engine, beating).status == "running"
    assert store.get_run(engine, starting).status == "queued"
    assert state.heartbeat(engine, beating) is True


def test_zombies_are_not_alive():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while state.process_alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # exited but not reaped: a zombie
    assert state.process_alive(child.pid) is False
    child.wait()
