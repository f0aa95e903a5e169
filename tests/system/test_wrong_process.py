"""The wrong process: a cancel that must find the run's own process (its pid since taken by another
run's supervisor), a rank stopped by SIGSTOP reported as the collective timeout it caused, data-loader
workers counted among the processes a machine may run, and a second supervisor for one queued run.
Real launched runs, real signals.

    .venv/bin/python -m pytest tests/system/test_wrong_process.py -q
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import db
from tests.support import DDP_ON_CPU, ROOT, SLEEPER, SLEEPER_DDP, SLEEPER_ENV, run_cli, run_dir
from db import run_state as state
from db import store
from db.connection import session_scope
from db.tables import Run
from tests.nvml_machines import fake_nvml  # noqa: F401
from sqlalchemy import update
from tests.system.test_checked_input import own_session_processes
from tests.trainer_backend.control.test_cli_bad_input import assert_nothing_left
from tests.trainer_backend.control.test_lifecycle import MODEL, assert_group_gone, export, launch, training_started, wait_for
from contract.config import cpu_cores
from trainer_backend.control.lifecycle import group_members


def engine_of(home):
    return db.make_engine(f"sqlite:///{home / 'parallax.db'}")


def steps_done(home, run_id) -> int:
    run = export(home, run_id)
    return len(run["epochs"]) * 10_000 + (run["progress"]["step"] or 0)


def test_cancelling_a_dead_run_whose_pid_another_runs_supervisor_took_leaves_that_run_training(parallax_home):
    engine = engine_of(parallax_home)
    other = launch(parallax_home, *SLEEPER, "--epochs", "200", env_extra=SLEEPER_ENV)
    supervisor = wait_for(parallax_home, other, training_started, what="training under way")["pid"]
    try:
        before = steps_done(parallax_home, other)  # read now: a reader marks a run with a reused pid lost
        dead = []
        for recorded_start in (True, False):  # a run recorded with its process's start, and one from before
            run_id = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": "single",
                                               "devices": ["cpu"]}, status="running")
            with subprocess.Popen(["sleep", "60"]) as process:  # the run's own process, which then dies
                store.set_process(engine, run_id, pid=process.pid, host=socket.gethostname())
                process.kill()
            assert store.get_run(engine, run_id).measurements.get(state.PROCESS_START_KEY) or not recorded_start
            with session_scope(engine) as session:  # the system gives its pid to the other run's supervisor
                values = {"pid": supervisor} if recorded_start else {"pid": supervisor, "measurements": {}}
                session.execute(update(Run).where(Run.id == run_id).values(**values))
            dead.append(run_id)

        for run_id in dead:
            result = run_cli("cancel", str(run_id), home=parallax_home, timeout=60)
            assert result.returncode == 0 and result.stderr == "", result.stderr
            assert result.stdout.strip() == f"run_id={run_id} status=cancelled"
        time.sleep(3)
        assert group_members(supervisor), "the other run's processes were signalled"
        wait_for(parallax_home, other, lambda r: steps_done(parallax_home, other) > before, timeout_s=60,
                 what="more steps after the cancels")
        assert export(parallax_home, other)["status"] == "running"
    finally:
        run_cli("cancel", str(other), home=parallax_home, timeout=60)
        assert_group_gone(supervisor)


def test_a_dead_runs_pid_held_by_another_process_marks_it_lost_at_once(parallax_home):
    engine = engine_of(parallax_home)
    run_id = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": "single",
                                       "devices": ["cpu"]}, status="running")
    with subprocess.Popen(["sleep", "60"]) as process:
        store.set_process(engine, run_id, pid=process.pid, host=socket.gethostname())
        process.kill()
    with session_scope(engine) as session:  # its pid now another live process's (this one)
        session.execute(update(Run).where(Run.id == run_id).values(pid=os.getpid()))
    assert state.mark_lost_runs(engine) == [run_id]  # was: running for up to 10 minutes
    assert "is gone without recording how the run ended" in store.get_run(engine, run_id).error


def test_a_resumed_torchrun_job_records_its_new_process_with_its_pid(parallax_home):
    from db import elastic

    engine = engine_of(parallax_home)
    run_id = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": "ddp",
                                       "devices": ["cpu", "cpu"]}, status="running")
    with subprocess.Popen(["sleep", "60"]) as process:  # the first attempt's rank 0, which then dies
        store.set_process(engine, run_id, pid=process.pid, host=socket.gethostname())
        process.kill()
    # The restarted attempt's rank 0 (this process) takes the still running run over, its start
    # with its pid: a reader between two writes would have taken the new pid for a reused one.
    assert elastic.resume_job_run(engine, run_id, pid=os.getpid(), host=socket.gethostname(), nodes=1,
                                  hosts=[socket.gethostname()])
    assert store.get_run(engine, run_id).measurements[state.PROCESS_START_KEY] == state.process_start(os.getpid())
    assert state.mark_lost_runs(engine) == []


def test_a_rank_stopped_by_sigstop_fails_the_run_as_the_collective_timeout(parallax_home):
    timeout = {"PARALLAX_COLLECTIVE_TIMEOUT_S": "5", **SLEEPER_ENV}
    run_id = launch(parallax_home, *SLEEPER_DDP, "--epochs", "100", env_extra=timeout)
    run = wait_for(parallax_home, run_id, lambda r: len(r["epochs"]) >= 1, what="epoch 1")
    rank1 = int((run_dir(parallax_home, run_id) / "rank1.pid").read_text())
    os.kill(rank1, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        run = wait_for(parallax_home, run_id, lambda r: r["status"] != "running", timeout_s=90, what="the end")
        took_s = time.monotonic() - stopped_at
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rank1, signal.SIGCONT)
    assert run["status"] == "failed"
    headline = run["error"].splitlines()[0]
    assert headline.startswith("collective timeout: rank 1 did not arrive at a collective within 5 s "
                               "(PARALLAX_COLLECTIVE_TIMEOUT_S); rank 0 stopped waiting"), headline
    assert "SIGKILL" not in run["error"]
    # RELIABILITY.md: within about 10 s of the hang (5 s timeout). Was 37 s: torch's join waited
    # 30 s for the stopped rank to act on SIGTERM, then killed it. Bounded loosely for a busy machine.
    print(f"stopped rank to failed run: {took_s:.1f} s")
    assert took_s < 25, took_s
    assert_group_gone(run["pid"])


def test_sixty_four_loader_workers_on_two_cores_are_refused_before_any_starts(parallax_home):
    env = {**os.environ, "PARALLAX_HOME": str(parallax_home), "PYTHONUNBUFFERED": "1"}
    env.pop("PARALLAX_MAX_CPU_PROCESSES", None)
    most = 4 * cpu_cores()
    for command in ("run", "launch"):
        process = subprocess.Popen([sys.executable, "-m", "trainer_backend", command, "--num-workers", "64",
                                    *MODEL, "--epochs", "1"],
                                   cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
        try:
            out, err = process.communicate(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        assert process.returncode == 2 and out == "", out + err
        assert err.strip() == (
            f"error: num_workers 64 is not allowed here: 1 training process with 64 loader workers for training "
            f"and 64 for validation make 129 processes on one machine, more than the {most} allowed (4 per core, "
            f"{cpu_cores()} cores; PARALLAX_MAX_CPU_PROCESSES sets another limit): use at most {(most - 1) // 2} "
            f"loader worker{'s' if (most - 1) // 2 != 1 else ''} per process")
        assert own_session_processes(process.pid) == []
        assert_nothing_left(parallax_home)


def test_ddp_counts_each_ranks_loader_workers(parallax_home):
    result = run_cli("run", *MODEL, *DDP_ON_CPU, "--num-workers", "2", "--epochs", "1", home=parallax_home, timeout=60,
                     env_extra={"PARALLAX_MAX_CPU_PROCESSES": "9"})
    assert result.returncode == 2
    assert ("2 training processes, each with 2 loader workers for training and 2 for validation make 10 processes "
            "on one machine, more than the 9 allowed (set by PARALLAX_MAX_CPU_PROCESSES): use at most 1 loader "
            "worker per process") in result.stderr


def test_a_second_supervisor_that_loses_the_claim_leaves_the_run_to_the_winner(parallax_home):
    blocker = launch(parallax_home, *SLEEPER, "--epochs", "200", env_extra=SLEEPER_ENV)
    wait_for(parallax_home, blocker, training_started, what="the first run training")
    run_id = launch(parallax_home, *MODEL, "--image-size", "16", "--epochs", "1")
    assert export(parallax_home, run_id)["status"] == "queued"
    env = {**os.environ, "PARALLAX_HOME": str(parallax_home), "PYTHONUNBUFFERED": "1",
           "PARALLAX_DB_URL": f"sqlite:///{parallax_home / 'parallax.db'}"}
    # A second supervisor for the same queued run (started by hand, or by a launcher retried).
    second = subprocess.Popen([sys.executable, "-m", "trainer_backend", "supervisor", str(run_id)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        time.sleep(3)  # both workers wait in the queue
        assert run_cli("cancel", str(blocker), home=parallax_home, timeout=60).returncode == 0
        out, _ = second.communicate(timeout=90)  # was: waited forever, or cancelled the run under the winner
        run = wait_for(parallax_home, run_id, lambda r: r["status"] not in ("queued", "running"), timeout_s=120,
                       what="the end")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(second.pid, signal.SIGKILL)
    assert run["status"] == "completed", run["error"]
    assert [e["epoch"] for e in run["epochs"]] == [1]
    # One of the two won (the launched one, usually); the other said so and touched nothing.
    log = (run_dir(parallax_home, run_id) / "run.log").read_text()
    lost = f"run {run_id} is already running in process {run['pid']}"
    assert (lost in out) != (lost in log), out + log
    assert ("status=completed" in out) == (lost in log)


@pytest.mark.processes  # the full form asks the backend's inspector, a child process
def test_the_launch_form_names_too_many_loader_workers_under_their_field(parallax_home, fake_nvml, monkeypatch):  # noqa: F811
    from tests.nvml_machines import pin_cuda_count
    from tests.pages.test_every_page import column_with, launch_button, open_page, texts

    fake_nvml(None)  # a CPU machine, whatever this one has
    pin_cuda_count(monkeypatch, 0)
    monkeypatch.setenv("PARALLAX_MAX_CPU_PROCESSES", "9")
    at = open_page("pages/launch.py")
    at.number_input(key="num_workers").set_value(5).run()
    assert texts(column_with(at, "Data-loader workers per process").error) == [
        "num_workers 5 is not allowed here: 1 training process with 5 loader workers for training and 5 for "
        "validation make 11 processes on one machine, more than the 9 allowed (set by PARALLAX_MAX_CPU_PROCESSES): "
        "use at most 4 loader workers per process"]
    assert launch_button(at).disabled
    at.number_input(key="num_workers").set_value(4).run()
    assert not at.error and not launch_button(at).disabled
