"""A launched run leaves the queue as soon as its supervisor starts, not after the supervisor has imported the training code
(torch, timm: about 4 s of a 2-core machine), where its devices are free; where they are not, it waits its
turn as before.

    .venv/bin/python -m pytest tests/trainer_backend/supervisor/test_claim_before_imports.py -q
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from tests.support import run_cli
from db import run_state, make_engine, store
from trainer_backend.control.lifecycle import group_members
from trainer_backend.supervisor.liveness import claim_if_free, wait_for_turn

CONFIG = {"dataset": "digits", "model": "test_resnet", "strategy": "single", "devices": ["cpu"], "epochs": 1}


def test_a_free_run_is_claimed_at_once_and_its_turn_then_needs_no_wait(engine):
    run_id = store.create_run(engine, CONFIG, status="queued")
    assert claim_if_free(engine, run_id)
    run = store.get_run(engine, run_id)
    assert run.status == "running" and run.pid == os.getpid() and run.host == socket.gethostname()
    started = time.monotonic()
    assert wait_for_turn(engine, run_id, echo=False)  # already this process's: no ClaimedElsewhere, no wait
    assert time.monotonic() - started < 1
    assert not claim_if_free(engine, run_id)  # claimed once


def test_a_run_whose_devices_are_busy_is_not_claimed_early(engine):
    running = store.create_run(engine, CONFIG, status="running")
    store.set_process(engine, running, pid=os.getpid(), host=socket.gethostname())
    waiting = store.create_run(engine, CONFIG, status="queued")
    assert not claim_if_free(engine, waiting)  # one CPU run at a time
    assert store.get_run(engine, waiting).status == "queued"
    run_state.finish(engine, running, "cancelled")
    cancelled = store.create_run(engine, CONFIG, status="queued")
    run_state.finish(engine, cancelled, "cancelled")
    assert not claim_if_free(engine, cancelled)


@pytest.mark.processes
def test_a_launched_run_is_running_while_its_supervisor_still_imports_the_engine(parallax_home, tmp_path):
    """The supervisor's torch is a stand-in whose import sleeps: the run must turn running all the same."""
    stand_in = tmp_path / "slow_imports" / "torch"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text("import time\ntime.sleep(120)\nraise ImportError('a stand-in torch')\n")
    env = {"PYTHONPATH": str(stand_in.parent)}
    launched = run_cli("launch", "--dataset", "digits", "--model", "test_resnet", "--epochs", "1", home=parallax_home,
                       timeout=60, env_extra=env)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    run_id = int(launched.stdout.split("run_id=")[1].split()[0])
    engine = make_engine(f"sqlite:///{parallax_home / 'parallax.db'}")
    deadline = time.monotonic() + 30
    try:
        while (run := store.get_run(engine, run_id)).status == "queued":
            assert time.monotonic() < deadline, "the run stayed queued while its supervisor imported the training code"
            time.sleep(0.2)
        assert run.status == "running", run.error
        maps = Path(f"/proc/{run.pid}/maps").read_text()
        assert "libtorch" not in maps  # still in the stand-in's import: the real engine was never loaded
    finally:
        cancelled = run_cli("cancel", str(run_id), home=parallax_home, timeout=60)
    assert cancelled.stdout.strip() == f"run_id={run_id} status=cancelled", cancelled.stdout + cancelled.stderr
    deadline = time.monotonic() + 15
    while group_members(run.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert group_members(run.pid) == []
