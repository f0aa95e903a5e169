"""Slurm's warning (USR1 to the batch script, as Slurm sends it before the time limit or a preemption) on a real
Slurm cluster (tests/slurm_cluster.py): the ranks stop at the next step they agree on, the job requeues itself
and the requeued job continues at the next step, recording each epoch and each step point once.

    .venv/bin/python -m pytest tests/trainer_backend/control/test_slurm_step_stop.py -q
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from db import series, store
from db.folders import run_folder
from tests.support import SLEEPER, run_cli
from trainer_backend.control import slurm_job, slurm_status
from trainer_backend.control.slurm_status import watch_slurm_runs
from trainer_backend.rank import stopping

pytestmark = pytest.mark.processes

EPOCHS, STEPS = 8, 23  # digits' 1437 training images in batches of 64
ENV = {"PARALLAX_PLUGINS": "tests.plugins.sleeping_model", "PARALLAX_STEP_POINT_S": "1e-6",  # a point every step
       "PARALLAX_STOP_CHECK_S": "0.2"}  # a look every few steps: the stop comes well inside a 23-step epoch
RUN_WITHIN_S = 300.0  # a job's processes import torch and timm on a shared 2-core machine


@pytest.fixture
def slurm(slurm_cluster, parallax_home, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    slurm_status.forget_queue()
    yield slurm_cluster
    slurm_cluster.cancel_all()


def wait_for(engine, run_id: int, done, *, what: str = "the run"):
    """Poll the run (and Slurm, as the dashboard does) until ``done(run)``; the run then."""
    deadline = time.monotonic() + RUN_WITHIN_S
    while time.monotonic() < deadline:
        watch_slurm_runs(engine, interval_s=1.0)
        run = store.get_run(engine, run_id)
        if done(run):
            return run
        time.sleep(0.5)
    raise AssertionError(f"{what} not reached within {RUN_WITHIN_S:g} s: run {run_id} is {run.status} ({run.error})")


def ended(run) -> bool:
    return run.status not in ("queued", "running")


def test_the_batch_script_asks_for_the_file_the_ranks_look_for():
    assert slurm_job.STOP_REQUEST == stopping.STOP_FILE


def test_usr1_stops_the_ranks_at_a_step_and_the_requeued_job_continues_there(slurm, parallax_home, engine):
    launched = run_cli("launch", "--where", "slurm", "--strategy", "ddp", "--batch-size", "64", *SLEEPER,
                       "--devices", "cpu,cpu", "--slurm-nodes", "2", "--epochs", str(EPOCHS), home=parallax_home,
                       timeout=120, env_extra=ENV)
    assert launched.returncode == 0, launched.stderr
    fields = dict(part.split("=", 1) for part in launched.stdout.split())
    run_id, job_id = int(fields["run_id"]), fields["slurm_job"]
    wait_for(engine, run_id, lambda r: bool(series.last_step(engine, [run_id])) or ended(r), what="a step")
    warned = subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=slurm.env, capture_output=True,
                            text=True, timeout=30)
    assert warned.returncode == 0, warned.stderr
    run = wait_for(engine, run_id, ended)
    assert run.status == "completed", run.error
    assert [row["epoch"] for row in store.read_epoch_metrics(engine, [run_id])] == list(range(1, EPOCHS + 1))
    log = (run_folder(engine, run_id) / slurm_job.LOG_FILE).read_text()
    assert f"requeueing job {job_id}" in log and "attempt 2" in log, log[-3000:]
    found = [re.fullmatch(r"The job was told to stop and stopped after step (\d+) of epoch (\d+), its resume point "
                          r"saved there\.", note) for note in run.notes]
    (step, epoch), = [(int(m.group(1)), int(m.group(2))) for m in found if m] or pytest.fail(f"{run.notes}\n{log[-3000:]}")
    assert 0 < step < STEPS and epoch < EPOCHS
    assert any(note.startswith(f"Resumed at step {step + 1} of epoch {epoch}, from the point") for note in run.notes), \
        run.notes
    steps = [row["step"] for row in series.read_steps(engine, [run_id], max_points=None)]
    assert steps == list(range(1, EPOCHS * STEPS + 1))  # each once: before the stop, then after it
