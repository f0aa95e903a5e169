"""Background runs with real processes on CPU: launch, cancel, crashes, lost runs, the queue,
and a launcher that dies while its run goes on."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support import ROOT, SLEEPER, SLEEPER_DDP, SLEEPER_ENV, run_cli, run_dir
from db import run_state as state
from db import make_engine, store
from trainer_backend.control.lifecycle import group_members
from trainer_backend.supervisor.liveness import can_start

# timm's tiny test ResNet, for the runs other files start: these tests are about processes, not learning.
MODEL = ("--dataset", "digits", "--model", "test_resnet")


def export(home, run_id) -> dict:
    """What any reader sees: dead runs are marked lost first (in-process, to poll cheaply)."""
    engine = make_engine(f"sqlite:///{home / 'parallax.db'}")
    state.mark_lost_runs(engine)
    return store.export_run(engine, run_id)


def export_cli(home, run_id) -> dict:
    result = run_cli("export", str(run_id), home=home, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def launch(home, *flags, env_extra=None) -> int:
    result = run_cli("launch", *flags, home=home, timeout=60, env_extra=env_extra)
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip().splitlines()[-1]
    assert line.endswith("status=queued"), line
    return int(line.split()[0].split("=")[1])


def wait_for(home, run_id, predicate, timeout_s=120.0, what="condition") -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = export(home, run_id)
        if predicate(run):
            return run
        time.sleep(0.5)
    raise AssertionError(f"run {run_id}: {what} not reached in {timeout_s} s; last state {run['status']}: {run['error']}")


def training_started(run) -> bool:
    return run["status"] == "running" and (run["progress"]["step"] or 0) >= 1


def assert_group_gone(pgid, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert group_members(pgid) == [], f"processes of run group {pgid} still alive: {group_members(pgid)}"


def test_launched_ddp_run_reports_progress_and_cancel_ends_every_process(parallax_home):
    run_cli("list", home=parallax_home, timeout=60)  # the CLI's server is up: what is timed is the launch alone
    start = time.monotonic()
    run_id = launch(parallax_home, *SLEEPER_DDP, "--epochs", "50", env_extra=SLEEPER_ENV)
    assert time.monotonic() - start < 10, "launch must return within seconds"
    run = wait_for(parallax_home, run_id, training_started, what="training under way")
    assert run["pid"] and run["heartbeat_at"] and run["progress"]["total_steps"] >= 1
    pgid = run["pid"]
    assert len(group_members(pgid)) >= 3  # supervisor + 2 ranks

    start = time.monotonic()
    result = run_cli("cancel", str(run_id), home=parallax_home, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"run_id={run_id} status=cancelled"
    assert time.monotonic() - start < 10
    assert_group_gone(pgid)
    run = export(parallax_home, run_id)
    assert run["status"] == "cancelled" and run["finished_at"]
    log = (run_dir(parallax_home, run_id) / "run.log").read_text()
    assert "ddp on cpu,cpu" in log or "DDP on CPU" in log


def test_a_cancel_that_can_only_mark_the_run_still_stops_it(parallax_home):
    # What `cancel` does from another host sharing the database: it marks the run and cannot
    # signal it. The run's heartbeat (every 5 s) must see the mark and stop the process.
    run_id = launch(parallax_home, *SLEEPER, "--epochs", "200", env_extra=SLEEPER_ENV)
    run = wait_for(parallax_home, run_id, training_started, what="training under way")
    engine = make_engine(f"sqlite:///{parallax_home / 'parallax.db'}")
    assert state.finish(engine, run_id, "cancelled", error="cancelled by the user")
    marked = time.monotonic()
    assert_group_gone(run["pid"], timeout_s=15)
    assert time.monotonic() - marked < 15
    run = export(parallax_home, run_id)
    assert run["status"] == "cancelled" and run["error"] == "cancelled by the user"
    assert len(run["epochs"]) < 200
    assert [e["epoch"] for e in run["epochs"]] == list(range(1, len(run["epochs"]) + 1))


def test_a_rank_killed_by_a_signal_fails_the_run_naming_rank_and_signal(parallax_home):
    run_id = launch(parallax_home, *SLEEPER_DDP, "--epochs", "50", env_extra=SLEEPER_ENV)
    run = wait_for(parallax_home, run_id, training_started, what="training under way")
    rank1 = int((run_dir(parallax_home, run_id) / "rank1.pid").read_text())
    os.kill(rank1, signal.SIGKILL)
    run = wait_for(parallax_home, run_id, lambda r: r["status"] != "running", timeout_s=60, what="the end")
    assert run["status"] == "failed"
    assert "rank 1" in run["error"] and "SIGKILL" in run["error"]
    assert_group_gone(run["pid"])


def test_killing_the_whole_group_makes_the_run_lost_on_the_next_read(parallax_home):
    run_id = launch(parallax_home, *SLEEPER_DDP, "--epochs", "50", env_extra=SLEEPER_ENV)
    run = wait_for(parallax_home, run_id, training_started, what="training under way")
    os.killpg(run["pid"], signal.SIGKILL)
    assert_group_gone(run["pid"])
    run = export_cli(parallax_home, run_id)
    assert run["status"] == "lost" and "gone" in run["error"]


def test_an_exception_in_rank_1_fails_the_run_with_its_traceback(parallax_home):
    result = run_cli(
        "run", "--dataset", "digits", "--model", "parallax_fails_on_rank1", "--strategy", "ddp",
        "--devices", "cpu,cpu", "--epochs", "1", "--batch-size", "64",
        home=parallax_home, env_extra={"PARALLAX_PLUGINS": "tests.plugins.failing_model"},
    )
    assert result.returncode == 1
    run_id = int(result.stdout.strip().splitlines()[-1].split()[0].split("=")[1])
    assert result.stdout.strip().endswith("status=failed")
    run = export(parallax_home, run_id)
    assert run["status"] == "failed"
    assert run["error"].startswith("rank 1 raised")
    assert "deliberate failure in rank 1" in run["error"] and "Traceback" in run["error"]


def test_a_second_cpu_run_waits_queued_then_runs(parallax_home):
    first = launch(parallax_home, *SLEEPER, "--epochs", "4", env_extra=SLEEPER_ENV)
    second = launch(parallax_home, *SLEEPER, "--epochs", "1", env_extra=SLEEPER_ENV)
    wait_for(parallax_home, first, lambda r: r["status"] == "running", what="first running")
    assert export(parallax_home, second)["status"] == "queued"
    done = wait_for(parallax_home, second, lambda r: r["status"] not in ("queued", "running"), timeout_s=240, what="second done")
    first_run = export(parallax_home, first)
    assert first_run["status"] == done["status"] == "completed"
    assert done["started_at"] >= first_run["finished_at"]
    assert len(done["epochs"]) == 1


def test_the_run_outlives_the_process_that_launched_it(parallax_home):
    """A dashboard restart must not take its runs with it: kill the launcher, the run goes on."""
    launcher = subprocess.Popen(
        [sys.executable, "-c",
         "import time; from contract.config import RunConfig; from trainer_backend.control.lifecycle import launch;"
         "print(launch(RunConfig(model='parallax_sleeps_each_step', image_size=16, epochs=5)), flush=True);"
         "time.sleep(600)"],
        cwd=ROOT, env={**os.environ, "PARALLAX_HOME": str(parallax_home), **SLEEPER_ENV}, stdout=subprocess.PIPE,
        text=True,
    )
    run_id = int(launcher.stdout.readline())
    wait_for(parallax_home, run_id, lambda r: r["status"] == "running", what="running")
    # Killed at once: the run is claimed before its supervisor imports the training code (seconds), so five
    # epochs still lie ahead of it.
    launcher.kill()
    launcher.wait()
    assert export(parallax_home, run_id)["status"] == "running"  # it outlived the launcher, not finished first
    run = wait_for(parallax_home, run_id, lambda r: r["status"] != "running", timeout_s=180, what="the end")
    assert run["status"] == "completed" and len(run["epochs"]) == 5


def active(run_id, status, devices, host=None):
    return state.ActiveRun(run_id, status, tuple(devices), None, host, None, None)


@pytest.mark.parametrize(
    "runs, run_id, slots, expected",
    [
        ([active(1, "running", ["cuda:0"]), active(2, "queued", ["cuda:1"])], 2, 1, True),
        ([active(1, "running", ["cuda:0", "cuda:1"]), active(2, "queued", ["cuda:1"])], 2, 1, False),
        ([active(1, "queued", ["cuda:0"]), active(2, "queued", ["cuda:0"])], 2, 1, False),  # launch order
        ([active(1, "running", ["cpu"]), active(2, "queued", ["cpu", "cpu"])], 2, 1, False),
        ([active(1, "running", ["cpu"]), active(2, "queued", ["cpu"])], 2, 2, True),
        ([active(1, "running", ["cuda:0"]), active(2, "queued", ["cpu"])], 2, 1, True),
        # A shared database: another machine's cuda:0 and CPU slots are not this one's.
        ([active(1, "running", ["cuda:0"], "node-a"), active(2, "queued", ["cuda:0"], "node-b")], 2, 1, True),
        ([active(1, "running", ["cpu"], "node-a"), active(2, "queued", ["cpu"], "node-b")], 2, 1, True),
        ([active(1, "running", ["cpu"], "node-b"), active(2, "queued", ["cpu"], "node-b")], 2, 1, False),
    ],
)
def test_queue_rule(runs, run_id, slots, expected):
    assert can_start(run_id, runs, slots) is expected


def test_two_runs_at_once_keep_their_own_ports_logs_and_checkpoints(parallax_home):
    """With two CPU slots, two DDP runs train side by side while a reader polls the database."""
    slots = {"PARALLAX_CPU_RUNS": "2"}
    first = launch(parallax_home, *SLEEPER_DDP, "--epochs", "3", env_extra={**slots, **SLEEPER_ENV})
    second = launch(parallax_home, *SLEEPER_DDP, "--epochs", "3", env_extra={**slots, **SLEEPER_ENV})
    seen_together, reads = False, 0
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        runs = [export(parallax_home, first), export(parallax_home, second)]  # raises on "database is locked"
        reads += 1
        seen_together |= all(r["status"] == "running" for r in runs)
        if all(r["status"] not in ("queued", "running") for r in runs):
            break
        time.sleep(0.2)
    assert [r["status"] for r in runs] == ["completed", "completed"], [r["error"] for r in runs]
    assert seen_together and reads > 10
    assert all(len(r["epochs"]) == 3 for r in runs)
    folders = [run_dir(parallax_home, run_id) for run_id in (first, second)]
    for folder, run_id in zip(folders, (first, second)):
        assert (folder / "best.pt").exists()
        # The supervisor prints its last line just after it records the end: give it a moment.
        line, log_deadline = f"run_id={run_id} status=completed", time.monotonic() + 10
        while line not in (folder / "run.log").read_text() and time.monotonic() < log_deadline:
            time.sleep(0.1)
        assert line in (folder / "run.log").read_text()


def test_out_of_memory_suggests_a_smaller_batch(parallax_home):
    result = run_cli(
        "run", "--dataset", "digits", "--model", "parallax_out_of_memory", "--epochs", "1",
        home=parallax_home, env_extra={"PARALLAX_PLUGINS": "tests.plugins.failing_model"},
    )
    assert result.returncode == 1 and result.stdout.strip().endswith("status=failed")
    assert "try a smaller --batch-size" in result.stderr
    run_id = int(result.stdout.strip().splitlines()[-1].split()[0].split("=")[1])
    assert export(parallax_home, run_id)["error"].startswith("out of memory: try a smaller --batch-size")


TWO_RUNS_IN_ONE_PROCESS = r"""
import os, sys
from contract.config import RunConfig
from trainer_backend.rank.plugins import load_plugins
from trainer_backend.supervisor.runner import execute_run
load_plugins()  # PARALLAX_PLUGINS: the sleeping model
for home in sys.argv[1:]:
    os.environ["PARALLAX_HOME"] = home
    config = RunConfig(dataset="digits", model="parallax_sleeps_each_step", image_size=16, strategy="ddp",
                       devices=("cpu", "cpu"), epochs=1, batch_size=64)
    print(execute_run(config, echo=False)[1], flush=True)
"""


def test_a_second_run_in_one_process_gives_its_ranks_its_own_environment(tmp_path):
    # CPU ranks are forked from a server started with the process's first run; the second run's
    # ranks must still write under the second run's PARALLAX_HOME.
    homes = [tmp_path / "first", tmp_path / "second"]
    process = subprocess.Popen([sys.executable, "-c", TWO_RUNS_IN_ONE_PROCESS, *map(str, homes)], cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT), **SLEEPER_ENV}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=240)
    finally:  # the fork server and its ranks too
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0 and out.split() == ["completed", "completed"], out + err[-3000:]
    for home in homes:
        assert (run_dir(home, 1) / "best.pt").is_file()
        assert (run_dir(home, 1) / "rank1.pid").is_file()
