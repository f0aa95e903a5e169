"""Runs on a real Slurm cluster (two slurmd on this machine, tests/slurm_cluster.py), submitted from the command
line: a 1-node and a 2-node DDP run (one rank per node, gloo on CPU) complete with every epoch; a failing job
fails with its reason and Slurm's exit code; cancels while pending and while running; a requeued job resumes
and records each epoch once; a sweep is one job array, two tasks at a time; any number of readers cost one
squeue per interval; a job stopped by its time limit ends TIMEOUT with its resume point kept.

Each job trains the sleeping test model (tests/plugins/sleeping_model.py): its epochs pass at a steady pace
whatever else loads the machine. Every wait is bounded; the fixture cancels what a failed test leaves.
"""

from __future__ import annotations

import subprocess
import threading
import time
from datetime import datetime, timezone

import pytest

from db import store
from db.folders import run_folder
from tests.support import SLEEPER, run_cli
from contract.config import RunConfig
from trainer_backend.control import slurm_status
from trainer_backend.control.slurm_job import LOG_FILE, SCRIPT_FILE, slurm_info, submit_array
from trainer_backend.control.slurm_status import queue, watch_slurm_runs

pytestmark = pytest.mark.processes

PLUGINS = "tests.plugins.sleeping_model,tests.plugins.failing_model"
ON_SLURM = ("--where", "slurm", "--strategy", "ddp", "--batch-size", "64")
RUN_WITHIN_S = 300.0  # a job's processes import torch and timm on a shared 2-core machine


@pytest.fixture
def slurm(slurm_cluster, parallax_home, monkeypatch):
    """The cluster, this test's home, and a ``launch`` that submits to it; what the test leaves is cancelled."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    monkeypatch.setenv("PARALLAX_PLUGINS", PLUGINS)
    slurm_status.forget_queue()
    yield slurm_cluster
    slurm_cluster.cancel_all()


def launch(home, *args: str) -> tuple[int, str]:
    result = run_cli("launch", *ON_SLURM, *args, home=home, timeout=120,
                     env_extra={"PARALLAX_PLUGINS": PLUGINS})
    assert result.returncode == 0, result.stderr
    fields = dict(part.split("=", 1) for part in result.stdout.split())
    return int(fields["run_id"]), fields["slurm_job"]


def wait_for(engine, run_id: int, done, *, within_s: float = RUN_WITHIN_S, what: str = "the run"):
    """Poll the run (and Slurm, as the dashboard does) until ``done(run)``; the run then."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        watch_slurm_runs(engine, interval_s=1.0)
        run = store.get_run(engine, run_id)
        if done(run):
            return run
        time.sleep(1.0)
    raise AssertionError(f"{what} not reached within {within_s:g} s: run {run_id} is {run.status} ({run.error})")


def ended(run) -> bool:
    return run.status not in ("queued", "running")


def epochs_of(engine, run_id: int) -> list[int]:
    return [row["epoch"] for row in store.read_epoch_metrics(engine, [run_id])]


def squeue_state(cluster, job_id: str) -> str:
    result = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=cluster.env, capture_output=True,
                            text=True, timeout=10)
    return result.stdout.strip()


@pytest.mark.parametrize("nodes, devices", [(1, "cpu"), (2, "cpu,cpu")], ids=["1-node", "2-node"])
def test_a_run_submitted_from_the_cli_trains_every_epoch_on_its_nodes(slurm, parallax_home, engine, nodes, devices):
    submitted, submitted_at = time.monotonic(), time.time()
    run_id, job_id = launch(parallax_home, *SLEEPER, "--devices", devices, "--slurm-nodes", str(nodes),
                            "--epochs", "2")
    run = store.get_run(engine, run_id)
    folder = run_folder(engine, run_id)
    assert run.status == "queued" and slurm_info(run)["job_id"] == job_id
    script = (folder / SCRIPT_FILE).read_text()
    assert f"#SBATCH --job-name=parallax-{run_id}" in script and f"#SBATCH --nodes={nodes}" in script
    assert (folder / LOG_FILE).exists()  # from submission, for the Run page's tail
    first_epoch = wait_for(engine, run_id, lambda r: epochs_of(engine, run_id) or ended(r), what="a first epoch")
    log = (run_folder(engine, run_id) / LOG_FILE).read_text()
    started_at = datetime.strptime(log.split(" at ", 1)[1].split()[0], "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=timezone.utc).timestamp()
    print(f"submit to first epoch ({nodes} node(s)): {time.monotonic() - submitted:.1f} s, of which the batch script "
          f"started after {started_at - submitted_at:.0f} s (the launch command included)")
    run = wait_for(engine, run_id, ended)
    assert first_epoch and run.status == "completed", run.error
    assert epochs_of(engine, run_id) == [1, 2]
    assert run.nodes == nodes and run.world_size == nodes and run.config["where"] == "slurm"
    assert run.elastic_run_id == job_id  # torchrun's --rdzv-id is the job id
    assert f"run {run_id}, job {job_id}, attempt 1" in (folder / LOG_FILE).read_text()


def test_a_failing_job_fails_with_the_runs_reason_and_slurms_exit_code(slurm, parallax_home, engine):
    run_id, job_id = launch(parallax_home, "--dataset", "digits", "--model", "parallax_fails_on_rank1",
                            "--image-size", "16", "--devices", "cpu,cpu", "--slurm-nodes", "2", "--epochs", "1")
    run = wait_for(engine, run_id, ended)
    assert run.status == "failed" and "deliberate failure in rank 1" in run.error
    deadline = time.monotonic() + 60
    while (job := queue(interval_s=0).get(job_id)) is not None and not job.ended and time.monotonic() < deadline:
        time.sleep(1)
    assert job is not None and job.state == "FAILED" and job.exit_code not in (None, 0), job  # srun's status


def test_a_pending_job_is_cancelled_and_leaves_the_queue(slurm, parallax_home, engine):
    run_id, job_id = launch(parallax_home, *SLEEPER, "--devices", "cpu", "--slurm-extra=--begin=now+1hour")
    job = queue(interval_s=0)[job_id]
    assert job.state == "PENDING" and job.reason == "BeginTime"
    assert watch_slurm_runs(engine, interval_s=0)[run_id].reason == "BeginTime"
    cancelled = run_cli("cancel", str(run_id), home=parallax_home, timeout=120)
    assert cancelled.returncode == 0 and "status=cancelled" in cancelled.stdout, cancelled.stderr
    assert squeue_state(slurm, job_id) in ("", "CANCELLED")


def test_a_running_job_is_cancelled_within_its_bound_and_resumed_by_a_new_job(slurm, parallax_home, engine):
    run_id, job_id = launch(parallax_home, *SLEEPER, "--devices", "cpu,cpu", "--slurm-nodes", "2", "--epochs", "30")
    wait_for(engine, run_id, lambda r: epochs_of(engine, run_id) or ended(r), what="a first epoch")
    started = time.monotonic()
    cancelled = run_cli("cancel", str(run_id), home=parallax_home, timeout=120)
    assert cancelled.returncode == 0 and "status=cancelled" in cancelled.stdout, cancelled.stderr
    assert time.monotonic() - started < 60
    deadline = time.monotonic() + 60
    while squeue_state(slurm, job_id) not in ("", "CANCELLED", "FAILED", "COMPLETED") and time.monotonic() < deadline:
        time.sleep(1)
    assert squeue_state(slurm, job_id) in ("", "CANCELLED", "FAILED", "COMPLETED")
    run = store.get_run(engine, run_id)
    done = epochs_of(engine, run_id)
    assert run.status == "cancelled" and 1 <= len(done) < 30
    resumed = run_cli("resume", str(run_id), home=parallax_home, timeout=120)
    assert resumed.returncode == 0 and "status=queued" in resumed.stdout, resumed.stderr
    new_job = slurm_info(store.get_run(engine, run_id))["job_id"]
    assert new_job != job_id
    run = wait_for(engine, run_id, ended)
    assert run.status == "completed", run.error
    assert epochs_of(engine, run_id) == list(range(1, 31))  # each recorded once


def test_a_requeued_job_resumes_and_records_each_epoch_once(slurm, parallax_home, engine):
    run_id, job_id = launch(parallax_home, *SLEEPER, "--devices", "cpu,cpu", "--slurm-nodes", "2", "--epochs", "6")
    wait_for(engine, run_id, lambda r: len(epochs_of(engine, run_id)) >= 2 or ended(r), what="two epochs")
    requeued = subprocess.run(["scontrol", "requeue", job_id], env=slurm.env, capture_output=True, text=True,
                              timeout=30)
    assert requeued.returncode == 0, requeued.stderr
    # Slurm holds a requeued job back (BeginTime) for a while; a user in a hurry releases it as here.
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=slurm.env, capture_output=True,
                   timeout=30)
    run = wait_for(engine, run_id, ended)
    assert run.status == "completed", run.error
    assert epochs_of(engine, run_id) == [1, 2, 3, 4, 5, 6]
    assert any("requeued" in note and job_id in note for note in run.notes), run.notes
    assert "attempt 2" in (run_folder(engine, run_id) / LOG_FILE).read_text()


def test_usr1_lets_the_epoch_end_then_requeues_and_the_run_resumes(slurm, parallax_home, engine):
    """Slurm's warning before the time limit or a preemption, sent as Slurm sends it (to the batch script)."""
    run_id, job_id = launch(parallax_home, *SLEEPER, "--devices", "cpu,cpu", "--slurm-nodes", "2", "--epochs", "8")
    wait_for(engine, run_id, lambda r: len(epochs_of(engine, run_id)) >= 1 or ended(r), what="an epoch")
    warned = subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=slurm.env, capture_output=True,
                            text=True, timeout=30)
    assert warned.returncode == 0, warned.stderr
    run = wait_for(engine, run_id, ended)
    assert run.status == "completed", run.error
    assert epochs_of(engine, run_id) == list(range(1, 9))
    log = (run_folder(engine, run_id) / LOG_FILE).read_text()
    assert f"requeueing job {job_id}" in log and "attempt 2" in log, log[-2000:]


def test_a_sweep_is_one_job_array_running_two_at_a_time(slurm, parallax_home, engine):
    base = RunConfig(dataset="digits", model="parallax_sleeps_each_step", image_size=16, where="slurm",
                     strategy="ddp", batch_size=64, epochs=2)
    sweep_id = store.create_sweep(engine, base.to_dict(), ["ddp"] * 4)
    run_ids = submit_array([base.replace(seed=seed) for seed in range(4)], sweep_id=sweep_id, array_limit=2)
    array_ids = {slurm_info(store.get_run(engine, r))["array_job_id"] for r in run_ids}
    assert len(array_ids) == 1
    most_running = 0
    deadline = time.monotonic() + 2 * RUN_WITHIN_S
    while time.monotonic() < deadline:
        watch_slurm_runs(engine, interval_s=1.0)
        statuses = [store.get_run(engine, r).status for r in run_ids]
        running = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i"], env=slurm.env, capture_output=True,
                                 text=True, timeout=10).stdout.split()
        most_running = max(most_running, len(running))
        if all(s not in ("queued", "running") for s in statuses):
            break
        time.sleep(1.0)
    assert statuses == ["completed"] * 4
    assert most_running == 2
    assert all(epochs_of(engine, r) == [1, 2] for r in run_ids)


def test_many_runs_and_readers_cost_one_squeue_per_interval(slurm, parallax_home, engine):
    base = RunConfig(dataset="digits", model="parallax_sleeps_each_step", image_size=16, where="slurm",
                     strategy="ddp", batch_size=64, slurm_extra=("--begin=now+1hour",))
    run_ids = [submit_array([base.replace(seed=seed)])[0] for seed in range(20)]
    interval_s, readers, seen = 2.0, 2, []
    slurm_status.forget_queue()
    calls_before = slurm_status.squeue_calls
    started = time.monotonic()

    def read():
        while time.monotonic() - started < 3 * interval_s - 0.5:
            seen.append(watch_slurm_runs(engine, interval_s=interval_s))
            time.sleep(0.1)

    threads = [threading.Thread(target=read) for _ in range(readers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert slurm_status.squeue_calls - calls_before == 3  # at 0, interval and 2 × interval
    assert len(seen) > 20 and all(set(s) == set(run_ids) for s in seen)
    assert {job.reason for job in seen[-1].values()} == {"BeginTime"}


def test_a_job_at_its_time_limit_ends_timeout_with_its_resume_point_kept(slurm, parallax_home, engine):
    run_id, job_id = launch(parallax_home, *SLEEPER, "--devices", "cpu", "--epochs", "1000", "--slurm-time", "1",
                            "--max-requeues", "0")
    run = wait_for(engine, run_id, ended, within_s=RUN_WITHIN_S + 120)
    assert run.status == "failed" and "TIMEOUT" in run.error and f"parallax resume {run_id}" in run.error
    assert epochs_of(engine, run_id)
    assert (run_folder(engine, run_id) / "resume.pt").is_file()


def test_the_form_gets_the_partitions_with_their_free_nodes(slurm):
    from trainer_backend.control.slurm_status import Partition, partitions

    assert partitions() == [Partition("test", default=True, nodes=2, free_nodes=2, gpus=0, free_gpus=0)]


def test_without_a_controller_slurm_is_not_offered_in_one_line(monkeypatch, tmp_path):
    from trainer_backend.control.slurm_status import partitions

    (tmp_path / "slurm.conf").write_text("ClusterName=none\nSlurmctldHost=nowhere(127.0.0.1)\nSlurmctldPort=9\n"
                                         "NodeName=x CPUs=1\nPartitionName=p Nodes=x\n")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    reason = partitions()
    assert isinstance(reason, str) and reason.startswith("sinfo failed:") and "\n" not in reason
