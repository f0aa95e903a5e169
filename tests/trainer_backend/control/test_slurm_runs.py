"""Runs on a real Slurm cluster (two slurmd on this machine, tests/slurm_cluster.py), submitted from the command
line: a 1-node and a 2-node DDP run (one rank per node, gloo on CPU) complete with every epoch; single and mp
runs, one process each, are one-task jobs without torchrun that requeue, cancel and resume alike; a failing job
fails with its reason and Slurm's exit code; cancels while pending and while running; a requeued job resumes
and records each epoch once; a sweep is one job array, two tasks at a time, each started as its strategy needs
(single's one process, ddp's torchrun); any number of readers cost one squeue per interval; a job stopped by its
time limit ends TIMEOUT with its resume point kept; a search of 3 trials is one job array, 2 at a time, its driver
following each trial to its end.

The jobs run at once. Each scenario below (``@scenario``) is what one test did alone: it submits its job, acts
on it (cancels, requeues, signals) and asserts as it goes. The module's fixture starts every scenario in a
thread of its own when the first test asks for it, and each test waits for its scenario's outcome, so it fails
with that scenario's own assertion. The test cluster declares more CPUs than the machine has, so no job waits
for another, and the time-limit job's minute overlaps the others' work instead of adding to it. Each scenario
has its own database (in the module's home), as each test had; the in-process poll (``watch_slurm_runs``,
``queue``) goes through ``POLLS``, which the poll's cost test holds while it counts squeue calls.

Each job trains the sleeping test model (tests/plugins/sleeping_model.py): its epochs pass at a steady pace
whatever else loads the machine. Every wait is bounded; the fixture stops the scenarios and cancels every job
of the cluster when the module ends, whether its tests passed or not.
"""

from __future__ import annotations

import functools
import re
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest

from contract.config import RunConfig
from db import dispose_engines, make_engine, store
from db.folders import run_folder
from db.searches import list_searches, trial_runs
from tests.slurm_cluster import SlurmCluster
from tests.support import SLEEPER, run_cli, start_engine_server
from trainer_backend.control import slurm_status
from trainer_backend.control.slurm_job import LOG_FILE, SCRIPT_FILE, slurm_info, submit_array
from trainer_backend.control.slurm_status import queue, watch_slurm_runs

pytestmark = pytest.mark.processes

PLUGINS = "tests.plugins.sleeping_model,tests.plugins.failing_model"
SLOW_WHILE = "PARALLAX_TEST_SLOW_WHILE"  # tests/plugins/sleeping_model.py's: its steps are slow while the file is there
ON_SLURM = ("--where", "slurm", "--strategy", "ddp", "--batch-size", "64")
RUN_WITHIN_S = 300.0  # a job's processes import torch and timm on a shared 2-core machine
SCENARIO_WITHIN_S = 900.0  # a whole scenario: each of its waits is bounded on its own, this bounds the test's wait
POLL_EVERY_S = 0.5

POLLS = threading.Lock()  # held by the poll's cost test while it counts: no scenario polls meanwhile
STOP = threading.Event()  # set when the module ends: a scenario still waiting gives up
SCENARIOS = {}


def scenario(function=None, /, **params):
    """Register ``function(s: Scenario, **params)`` as a scenario started with the module (``@scenario`` or
    ``@scenario(name=..., nodes=...)``: one per set of parameters)."""
    def register(function):
        name = params.pop("name", function.__name__)
        SCENARIOS[name] = functools.partial(function, **params)
        return function
    return register(function) if function is not None else register


@dataclass
class Scenario:
    """One scenario's cluster, and its own database in the module's home (``PARALLAX_HOME``)."""

    cluster: SlurmCluster
    home: Path
    name: str

    @functools.cached_property
    def url(self) -> str:
        return f"sqlite:///{self.home / self.name}.db"

    @functools.cached_property
    def engine(self):
        return make_engine(self.url)

    def cli(self, *args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return run_cli(*args, home=self.home, timeout=120,
                       env_extra={"PARALLAX_PLUGINS": PLUGINS, "PARALLAX_DB_URL": self.url, **(env_extra or {})})

    @functools.cached_property
    def slow(self) -> Path:
        """While this file exists, the sleeping model's steps are slow (tests/plugins/sleeping_model.py)."""
        return self.home / f"{self.name}.slow"

    def launch(self, *args: str, slow: bool = False) -> tuple[int, str]:
        """Launch on the cluster; ``slow``: the run's steps slow until ``self.slow`` is removed, so that it is
        still going when this test acts on it however busy the machine."""
        if slow:
            self.slow.touch()
        result = self.cli("launch", *ON_SLURM, *args, env_extra={SLOW_WHILE: str(self.slow)} if slow else None)
        assert result.returncode == 0, result.stderr
        fields = dict(part.split("=", 1) for part in result.stdout.split())
        return int(fields["run_id"]), fields["slurm_job"]

    def wait_for(self, run_id: int, done, *, within_s: float = RUN_WITHIN_S, what: str = "the run"):
        """Poll the run (and Slurm, as the dashboard does) until ``done(run)``; the run then."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline and not STOP.is_set():
            with POLLS:
                watch_slurm_runs(self.engine, interval_s=1.0)
            run = store.get_run(self.engine, run_id)
            if done(run):
                return run
            time.sleep(POLL_EVERY_S)
        run = store.get_run(self.engine, run_id)
        raise AssertionError(f"{what} not reached within {within_s:g} s: run {run_id} is {run.status} ({run.error})")

    def epochs(self, run_id: int) -> list[int]:
        return [row["epoch"] for row in store.read_epoch_metrics(self.engine, [run_id])]

    def squeue_state(self, job_id: str) -> str:
        result = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=self.cluster.env,
                                capture_output=True, text=True, timeout=60)
        return result.stdout.strip()


def ended(run) -> bool:
    return run.status not in ("queued", "running")


@pytest.fixture(scope="module")
def scenarios(slurm_cluster, tmp_path_factory):
    """Every scenario started at once, each in a thread: {name: its Future}. At the end every job of the
    cluster is cancelled, the scenarios told to stop waiting, and their threads joined."""
    home = tmp_path_factory.mktemp("slurm-home")
    with pytest.MonkeyPatch.context() as patch, ThreadPoolExecutor(len(SCENARIOS), "slurm-scenario") as pool:
        patch.setenv("SLURM_CONF", str(slurm_cluster.conf))
        patch.setenv("PARALLAX_HOME", str(home))
        patch.setenv("PARALLAX_PLUGINS", PLUGINS)
        patch.delenv("PARALLAX_DB_URL", raising=False)
        slurm_status.forget_queue()
        start_engine_server()  # here, before the threads: starting it swaps os.environ for a moment
        STOP.clear()
        futures = {name: pool.submit(timed, name, run, Scenario(slurm_cluster, home, name))
                   for name, run in SCENARIOS.items()}
        try:
            yield futures
        finally:
            STOP.set()
            slurm_cluster.cancel_all()
            for future in futures.values():  # a scenario's commands and waits are bounded: so is this
                future.exception()
            slurm_cluster.cancel_all()
            dispose_engines()


def timed(name: str, run, s: Scenario) -> None:
    started = time.monotonic()
    try:
        run(s)
    finally:
        print(f"scenario {name}: {time.monotonic() - started:.0f} s")


def outcome(scenarios: dict[str, Future], name: str) -> None:
    """Wait for scenario ``name``; its failure (an assertion, a bound reached) fails the test."""
    scenarios[name].result(timeout=SCENARIO_WITHIN_S)


# Before the scenarios start: both nodes are free.
@pytest.fixture
def slurm(slurm_cluster, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    return slurm_cluster


def test_the_form_gets_the_partitions_with_their_free_nodes(slurm):
    from trainer_backend.control.slurm_status import Partition, partitions

    assert partitions() == [Partition("test", default=True, nodes=2, free_nodes=2, gpus=0, free_gpus=0)]


# The first test that asks for the scenarios starts them; the tests that need no job of theirs run meanwhile.
def test_many_runs_and_readers_cost_one_squeue_per_interval(scenarios, slurm_cluster, tmp_path):
    """20 pending runs in a database of their own, read by 2 threads while the scenarios' jobs go on (their
    polls wait meanwhile: every squeue this process runs is counted)."""
    url = f"sqlite:///{tmp_path / 'poll.db'}"
    engine = make_engine(url)
    base = RunConfig(dataset="digits", model="parallax_sleeps_each_step", image_size=16, where="slurm",
                     strategy="ddp", batch_size=64, slurm_extra=("--begin=now+1hour",))
    run_ids = [submit_array([base.replace(seed=seed)], db_url=url)[0] for seed in range(20)]
    try:
        interval_s, readers, seen = 2.0, 2, []
        with POLLS:
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
            calls = slurm_status.squeue_calls - calls_before
        assert calls == 3  # at 0, interval and 2 × interval
        assert len(seen) > 20 and all(set(s) == set(run_ids) for s in seen)
        assert {job.reason for job in seen[-1].values()} == {"BeginTime"}
    finally:
        jobs = [slurm_info(store.get_run(engine, r))["job_id"] for r in run_ids]
        subprocess.run(["scancel", *jobs], env=slurm_cluster.env, capture_output=True, timeout=30)


def test_without_a_controller_slurm_is_not_offered_in_one_line(monkeypatch, tmp_path):
    from trainer_backend.control.slurm_status import partitions

    (tmp_path / "slurm.conf").write_text("ClusterName=none\nSlurmctldHost=nowhere(127.0.0.1)\nSlurmctldPort=9\n"
                                         "NodeName=x CPUs=1\nPartitionName=p Nodes=x\n")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    reason = partitions()
    assert isinstance(reason, str) and reason.startswith("sinfo failed:") and "\n" not in reason


@scenario(name="1-node", nodes=1, devices="cpu")
@scenario(name="2-node", nodes=2, devices="cpu,cpu")
def a_run_submitted_from_the_cli(s: Scenario, nodes: int, devices: str):
    submitted, submitted_at = time.monotonic(), time.time()
    run_id, job_id = s.launch(*SLEEPER, "--devices", devices, "--slurm-nodes", str(nodes), "--epochs", "2")
    run = store.get_run(s.engine, run_id)
    folder = run_folder(s.engine, run_id)
    assert run.status == "queued" and slurm_info(run)["job_id"] == job_id
    script = (folder / SCRIPT_FILE).read_text()
    assert f"#SBATCH --job-name=parallax-{run_id}" in script and f"#SBATCH --nodes={nodes}" in script
    assert (folder / LOG_FILE).exists()  # from submission, for the Run page's tail
    first_epoch = s.wait_for(run_id, lambda r: s.epochs(run_id) or ended(r), what="a first epoch")
    log = (folder / LOG_FILE).read_text()
    started_at = datetime.strptime(log.split(" at ", 1)[1].split()[0], "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=timezone.utc).timestamp()
    print(f"submit to first epoch ({nodes} node(s)): {time.monotonic() - submitted:.1f} s, of which the batch script "
          f"started after {started_at - submitted_at:.0f} s (the launch command included)")
    run = s.wait_for(run_id, ended)
    assert first_epoch and run.status == "completed", run.error
    assert s.epochs(run_id) == [1, 2]
    assert run.nodes == nodes and run.world_size == nodes and run.config["where"] == "slurm"
    assert run.elastic_run_id == job_id  # torchrun's --rdzv-id is the job id
    assert f"run {run_id}, job {job_id}, attempt 1" in (folder / LOG_FILE).read_text()


@pytest.mark.parametrize("nodes", ["1-node", "2-node"])
def test_a_run_submitted_from_the_cli_trains_every_epoch_on_its_nodes(scenarios, nodes):
    outcome(scenarios, nodes)


@scenario
def a_failing_job(s: Scenario):
    run_id, job_id = s.launch("--dataset", "digits", "--model", "parallax_fails_on_rank1", "--image-size", "16",
                              "--devices", "cpu,cpu", "--slurm-nodes", "2", "--epochs", "1")
    run = s.wait_for(run_id, ended)
    assert run.status == "failed" and "deliberate failure in rank 1" in run.error
    deadline = time.monotonic() + 60
    while True:
        with POLLS:
            job = queue(interval_s=0).get(job_id)
        if job is None or job.ended or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert job is not None and job.state == "FAILED" and job.exit_code not in (None, 0), job  # srun's status


def test_a_failing_job_fails_with_the_runs_reason_and_slurms_exit_code(scenarios):
    outcome(scenarios, "a_failing_job")


@scenario
def a_pending_job_cancelled(s: Scenario):
    run_id, job_id = s.launch(*SLEEPER, "--devices", "cpu", "--slurm-extra=--begin=now+1hour")
    with POLLS:
        job = queue(interval_s=0)[job_id]
        assert job.state == "PENDING" and job.reason == "BeginTime"
        assert watch_slurm_runs(s.engine, interval_s=0)[run_id].reason == "BeginTime"
    cancelled = s.cli("cancel", str(run_id))
    assert cancelled.returncode == 0 and "status=cancelled" in cancelled.stdout, cancelled.stderr
    assert s.squeue_state(job_id) in ("", "CANCELLED")


def test_a_pending_job_is_cancelled_and_leaves_the_queue(scenarios):
    outcome(scenarios, "a_pending_job_cancelled")


@scenario
def a_running_job_cancelled_then_resumed(s: Scenario):
    run_id, job_id = s.launch(*SLEEPER, "--devices", "cpu,cpu", "--slurm-nodes", "2", "--epochs", "30")
    s.wait_for(run_id, lambda r: s.epochs(run_id) or ended(r), what="a first epoch")
    started = time.monotonic()
    cancelled = s.cli("cancel", str(run_id))
    assert cancelled.returncode == 0 and "status=cancelled" in cancelled.stdout, cancelled.stderr
    assert time.monotonic() - started < 60
    deadline = time.monotonic() + 60
    while s.squeue_state(job_id) not in ("", "CANCELLED", "FAILED", "COMPLETED") and time.monotonic() < deadline:
        time.sleep(1)
    assert s.squeue_state(job_id) in ("", "CANCELLED", "FAILED", "COMPLETED")
    run = store.get_run(s.engine, run_id)
    done = s.epochs(run_id)
    assert run.status == "cancelled" and 1 <= len(done) < 30
    resumed = s.cli("resume", str(run_id))
    assert resumed.returncode == 0 and "status=queued" in resumed.stdout, resumed.stderr
    new_job = slurm_info(store.get_run(s.engine, run_id))["job_id"]
    assert new_job != job_id
    run = s.wait_for(run_id, ended)
    assert run.status == "completed", run.error
    assert s.epochs(run_id) == list(range(1, 31))  # each recorded once


def test_a_running_job_is_cancelled_within_its_bound_and_resumed_by_a_new_job(scenarios):
    outcome(scenarios, "a_running_job_cancelled_then_resumed")


def signalled_after(s: Scenario, epochs: int, recorded: int, *command: str) -> tuple[int, str]:
    """A 2-node DDP run of ``epochs`` epochs, and ``command`` with its job id once ``recorded`` epochs are
    recorded: (run id, job id). The run's steps are slow until then, so that it is still going when the command
    comes, however busy the machine."""
    run_id, job_id = s.launch(*SLEEPER, "--devices", "cpu,cpu", "--slurm-nodes", "2", "--epochs", str(epochs),
                              slow=True)
    s.wait_for(run_id, lambda r: len(s.epochs(run_id)) >= recorded or ended(r), what=f"{recorded} epoch(s)")
    done = subprocess.run([*command, job_id], env=s.cluster.env, capture_output=True, text=True, timeout=30)
    s.slow.unlink()
    assert done.returncode == 0, done.stderr
    return run_id, job_id


@scenario
def a_requeued_job(s: Scenario):
    run_id, job_id = signalled_after(s, 6, 2, "scontrol", "requeue")
    # Slurm holds a requeued job back (BeginTime) for a while; a user in a hurry releases it as here.
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=s.cluster.env,
                   capture_output=True, timeout=30)
    run = s.wait_for(run_id, ended)
    assert run.status == "completed", run.error
    assert s.epochs(run_id) == [1, 2, 3, 4, 5, 6]
    assert any("requeued" in note and job_id in note for note in run.notes), run.notes
    assert "attempt 2" in (run_folder(s.engine, run_id) / LOG_FILE).read_text()
    # The requeue's SIGTERM (as a preemption's) stopped the ranks at a step; the requeued job went on from the next.
    (stopped,) = [re.fullmatch(r"The job was told to stop \(SIGTERM from Slurm: a preemption, a requeue, the time "
                               r"limit or scancel\) and stopped after step (\d+) of epoch (\d+), its resume point "
                               r"saved there\.", note)
                  for note in run.notes if note.startswith("The job was told to stop")] or [None]
    assert stopped is not None, run.notes
    step, epoch = int(stopped.group(1)), int(stopped.group(2))
    assert epoch >= 3 and any(note.startswith(f"Resumed at step {step + 1} of epoch {epoch}") for note in run.notes), \
        run.notes


def test_a_requeued_job_resumes_and_records_each_epoch_once(scenarios):
    outcome(scenarios, "a_requeued_job")


@scenario
def a_job_warned_with_usr1(s: Scenario):
    """Slurm's warning before the time limit or a preemption, sent as Slurm sends it (to the batch script)."""
    run_id, job_id = signalled_after(s, 8, 1, "scancel", "--signal=USR1", "--batch")
    run = s.wait_for(run_id, ended)
    assert run.status == "completed", run.error
    assert s.epochs(run_id) == list(range(1, 9))
    log = (run_folder(s.engine, run_id) / LOG_FILE).read_text()
    assert f"requeueing job {job_id}" in log and "attempt 2" in log, log[-2000:]


def test_usr1_stops_the_ranks_then_the_job_requeues_itself_and_the_run_resumes(scenarios):
    outcome(scenarios, "a_job_warned_with_usr1")


@scenario
def a_single_run_warned_with_usr1(s: Scenario):
    """The most common cluster job, one process: a one-task job without torchrun, which Slurm's warning stops at a
    step and requeues, and which resumes there, as a ddp job does."""
    run_id, job_id = s.launch(*SLEEPER, "--strategy", "single", "--devices", "cpu", "--epochs", "8", slow=True)
    folder = run_folder(s.engine, run_id)
    script = (folder / SCRIPT_FILE).read_text()
    assert "--ntasks=1 " in script and "torch.distributed.run" not in script, script
    assert store.get_run(s.engine, run_id).world_size == 1
    s.wait_for(run_id, lambda r: s.epochs(run_id) or ended(r), what="a first epoch")
    with POLLS:
        job = watch_slurm_runs(s.engine, interval_s=0)[run_id]  # what the Run page shows of the job
    assert job.state == "RUNNING", job
    warned = subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=s.cluster.env, capture_output=True,
                            text=True, timeout=30)
    assert warned.returncode == 0, warned.stderr
    s.slow.unlink()
    run = s.wait_for(run_id, ended)
    assert run.status == "completed", run.error
    assert s.epochs(run_id) == list(range(1, 9))  # each once
    assert run.elastic_run_id == job_id and run.world_size == 1 and run.config["strategy"] == "single"
    log = (folder / LOG_FILE).read_text()
    assert f"requeueing job {job_id}" in log and "attempt 2" in log, log[-3000:]
    assert any(note.startswith(f"Slurm job {job_id} runs single as one task") for note in run.notes), run.notes
    assert any(re.fullmatch(r"The job was told to stop and stopped after step \d+ of epoch \d+, its resume point "
                            r"saved there\.", note) for note in run.notes), run.notes


def test_a_single_run_is_a_one_task_job_that_slurms_warning_requeues_and_resumes(scenarios):
    outcome(scenarios, "a_single_run_warned_with_usr1")


@scenario
def an_mp_run_cancelled_then_resumed(s: Scenario):
    run_id, job_id = s.launch(*SLEEPER, "--strategy", "mp", "--devices", "cpu,cpu", "--epochs", "30", slow=True)
    s.wait_for(run_id, lambda r: s.epochs(run_id) or ended(r), what="a first epoch")
    cancelled = s.cli("cancel", str(run_id))
    s.slow.unlink()
    assert cancelled.returncode == 0 and "status=cancelled" in cancelled.stdout, cancelled.stderr
    deadline = time.monotonic() + 60
    while s.squeue_state(job_id) not in ("", "CANCELLED", "FAILED", "COMPLETED") and time.monotonic() < deadline:
        time.sleep(1)
    assert s.squeue_state(job_id) in ("", "CANCELLED", "FAILED", "COMPLETED")
    run = store.get_run(s.engine, run_id)
    assert run.status == "cancelled" and 1 <= len(s.epochs(run_id)) < 30
    assert "not requeued" in (run_folder(s.engine, run_id) / LOG_FILE).read_text()
    resumed = s.cli("resume", str(run_id), "--devices", "cpu,cpu")
    assert resumed.returncode == 0 and "status=queued" in resumed.stdout, resumed.stderr
    assert slurm_info(store.get_run(s.engine, run_id))["job_id"] != job_id
    run = s.wait_for(run_id, ended)
    assert run.status == "completed", run.error
    assert s.epochs(run_id) == list(range(1, 31)) and run.world_size == 1


def test_an_mp_run_on_slurm_is_cancelled_and_resumed_by_a_new_job(scenarios):
    outcome(scenarios, "an_mp_run_cancelled_then_resumed")


@scenario
def a_sweep_as_one_array(s: Scenario):
    base = RunConfig(dataset="digits", model="parallax_sleeps_each_step", image_size=16, where="slurm",
                     strategy="ddp", batch_size=64, epochs=2)
    # single first, as a sweep lists it: each task starts as its own strategy needs, one process or torchrun's.
    strategies = ["single", "ddp", "single", "ddp"]
    sweep_id = store.create_sweep(s.engine, base.to_dict(), strategies)
    run_ids = submit_array([base.replace(seed=seed, strategy=strategy) for seed, strategy in enumerate(strategies)],
                           db_url=s.url, sweep_id=sweep_id, array_limit=2)
    array_ids = {slurm_info(store.get_run(s.engine, r))["array_job_id"] for r in run_ids}
    assert len(array_ids) == 1
    most_running = 0
    deadline = time.monotonic() + 2 * RUN_WITHIN_S
    while time.monotonic() < deadline and not STOP.is_set():
        with POLLS:
            watch_slurm_runs(s.engine, interval_s=1.0)
        statuses = [store.get_run(s.engine, r).status for r in run_ids]
        running = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%F"], env=s.cluster.env,
                                 capture_output=True, text=True, timeout=60).stdout.split()
        most_running = max(most_running, sum(job in array_ids for job in running))  # the array's tasks only
        if all(status not in ("queued", "running") for status in statuses):
            break
        time.sleep(POLL_EVERY_S)
    assert statuses == ["completed"] * 4, [store.get_run(s.engine, r).error for r in run_ids]
    assert most_running == 2
    assert all(s.epochs(r) == [1, 2] for r in run_ids)


def test_a_sweep_is_one_job_array_running_two_at_a_time(scenarios):
    outcome(scenarios, "a_sweep_as_one_array")


@scenario
def a_search_as_one_array(s: Scenario):
    """A search of 3 trials, 2 at once: one job array, each task a trial's run, the driver following them."""
    finished: dict = {}
    driver = threading.Thread(target=lambda: finished.update(result=run_cli(
        "search", *ON_SLURM, *SLEEPER, "--devices", "cpu", "--epochs", "2", "--param", "lr=0.001,0.003,0.01",
        "--sampler", "grid", "--trials", "3", "--at-once", "2", home=s.home, timeout=2 * RUN_WITHIN_S,
        env_extra={"PARALLAX_PLUGINS": PLUGINS, "PARALLAX_DB_URL": s.url})))
    driver.start()
    most_running, arrays = 0, set()
    while driver.is_alive() and not STOP.is_set():
        runs = trial_runs(s.engine, 1) if list_searches(s.engine) else {}
        # A run is recorded before sbatch answers, and its job's ids after: read where they are there.
        arrays = {(slurm_info(store.get_run(s.engine, r["id"])) or {}).get("array_job_id")
                  for r in runs.values()} - {None}
        running = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%F"], env=s.cluster.env,
                                 capture_output=True, text=True, timeout=60).stdout.split()
        most_running = max(most_running, sum(job in arrays for job in running))
        time.sleep(POLL_EVERY_S)
    driver.join()
    result = finished["result"]
    assert result.returncode == 0, result.stdout + result.stderr
    runs = trial_runs(s.engine, 1)
    assert len(arrays) == 1 and len(runs) == 3
    assert [run["status"] for _, run in sorted(runs.items())] == ["completed"] * 3
    assert sorted(run["config"]["lr"] for run in runs.values()) == [0.001, 0.003, 0.01]  # the grid, each once
    assert most_running == 2
    assert all(s.epochs(run["id"]) == [1, 2] for run in runs.values())
    assert result.stdout.splitlines()[-1] == "search_id=1 status=finished"


def test_a_search_is_one_job_array_its_driver_follows_two_at_a_time(scenarios):
    outcome(scenarios, "a_search_as_one_array")


@scenario
def a_job_at_its_time_limit(s: Scenario):
    # Two minutes: the job must record an epoch before its limit while every other scenario's ranks start
    # on the same two cores (one minute, Slurm's floor, was missed there once); the scenarios run at once,
    # so the longer limit adds nothing to the module's time.
    run_id, job_id = s.launch(*SLEEPER, "--devices", "cpu", "--epochs", "1000", "--slurm-time", "2",
                              "--max-requeues", "0")
    run = s.wait_for(run_id, ended, within_s=RUN_WITHIN_S + 180)
    assert run.status == "failed" and "TIMEOUT" in run.error and f"parallax resume {run_id}" in run.error
    assert s.epochs(run_id)
    assert (run_folder(s.engine, run_id) / "resume.pt").is_file()


def test_a_job_at_its_time_limit_ends_timeout_with_its_resume_point_kept(scenarios):
    outcome(scenarios, "a_job_at_its_time_limit")
