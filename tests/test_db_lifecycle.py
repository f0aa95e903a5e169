"""Racing state changes: the first end of a run stands, claims only take queued runs, and a
run whose process is gone reads as lost."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from db import lifecycle as state
from db import make_engine, store

CONFIG = {"strategy": "single", "model": "resnet18", "dataset": "digits", "devices": ["cpu"]}


@pytest.fixture
def engine(db_url):
    return make_engine(db_url)


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
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # reaped: the pid no longer exists
    gone = store.create_run(engine, CONFIG)
    store.set_process(engine, gone, pid=dead.pid, host=socket.gethostname())
    alive = store.create_run(engine, CONFIG)
    store.set_process(engine, alive, pid=os.getpid(), host=socket.gethostname())
    done = store.create_run(engine, CONFIG)
    store.set_process(engine, done, pid=dead.pid, host=socket.gethostname())
    store.set_status(engine, done, "completed")

    assert state.mark_lost_runs(engine) == [gone]
    assert store.get_run(engine, gone).status == "lost"
    assert f"process {dead.pid}" in store.get_run(engine, gone).error
    assert store.get_run(engine, alive).status == "running"
    assert store.get_run(engine, done).status == "completed"  # an ended run is never relabelled


def test_zombies_are_not_alive():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while state.process_alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # exited but not reaped: a zombie
    assert state.process_alive(child.pid) is False
    child.wait()
