"""What Parallax reads from Slurm and writes for it, without a cluster: squeue's JSON of two Slurm versions,
the end a run is given for each final state, the rendered script (torchrun on every node, or one task for a
one-process strategy) and the job log's tail by byte offset."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from contract.config import RunConfig
from trainer_backend.control.slurm_job import read_job_log, render_script, sbatch_options
from trainer_backend.control.slurm_status import JobState, describe_end, parse_squeue_json

# Slurm 22.05: job_state a text, exit_code the raw wait status (exit 3 -> 768), a pending array as one record.
SQUEUE_22_05 = {"jobs": [
    {"job_id": 7, "job_state": "RUNNING", "state_reason": "None", "exit_code": 0, "array_job_id": 0},
    {"job_id": 8, "job_state": "FAILED", "state_reason": "NonZeroExitCode", "exit_code": 768, "array_job_id": 0},
    {"job_id": 9, "job_state": "PENDING", "state_reason": "Resources", "exit_code": 0, "array_job_id": 9,
     "array_task_id": None, "array_task_string": "2-3%2"},
    {"job_id": 10, "job_state": "RUNNING", "state_reason": "None", "exit_code": 0, "array_job_id": 9,
     "array_task_id": 0},
]}
# Slurm 23.02 and later: lists of flags, numbers as {"set", "infinite", "number"}, exit_code an object.
SQUEUE_24_05 = {"jobs": [
    {"job_id": 11, "job_state": ["PENDING"], "state_reason": "QOSMaxGRESPerUser",
     "exit_code": {"status": ["SUCCESS"], "return_code": {"set": True, "infinite": False, "number": 0}},
     "array_job_id": {"set": True, "infinite": False, "number": 0},
     "array_task_id": {"set": False, "infinite": False, "number": 0}},
    {"job_id": 12, "job_state": ["TIMEOUT"], "state_reason": "TimeLimit",
     "exit_code": {"status": ["SIGNALED"], "return_code": {"set": True, "infinite": False, "number": 0},
                   "signal": {"id": {"set": True, "infinite": False, "number": 15}, "name": "TERM"}},
     "array_job_id": {"set": True, "infinite": False, "number": 0}},
]}


def test_squeue_22_05_gives_states_reasons_exit_codes_and_array_tasks():
    jobs = parse_squeue_json(json.dumps(SQUEUE_22_05))
    assert jobs["7"] == JobState("7", "RUNNING", None, 0, None)
    assert jobs["8"].state == "FAILED" and jobs["8"].exit_code == 3 and jobs["8"].ended
    assert jobs["9_2"].state == jobs["9_3"].state == "PENDING" and jobs["9_3"].reason == "Resources"
    assert jobs["9_0"].state == "RUNNING" and "9" not in jobs


def test_squeue_of_later_versions_is_read_alike():
    jobs = parse_squeue_json(json.dumps(SQUEUE_24_05))
    assert jobs["11"] == JobState("11", "PENDING", "QOSMaxGRESPerUser", 0, None)
    assert jobs["12"].state == "TIMEOUT" and jobs["12"].signal == 15


def test_what_squeue_cannot_say_is_no_job_rather_than_an_error():
    assert parse_squeue_json("not json") == {} and parse_squeue_json("[1, 2]") == {}
    assert parse_squeue_json(json.dumps({"jobs": [{"job_state": "RUNNING"}, "odd"]})) == {}


def test_each_final_state_gives_the_run_an_end_that_names_it():
    assert describe_end(JobState("5", "TIMEOUT", "TimeLimit", 0, 15), "5", 3)[0] == "failed"
    assert "parallax resume 3" in describe_end(JobState("5", "TIMEOUT"), "5", 3)[1]
    assert describe_end(JobState("5", "CANCELLED"), "5", 3)[0] == "cancelled"
    assert describe_end(JobState("5", "FAILED", "NonZeroExitCode", 1), "5", 3) == (
        "failed", "Slurm job 5 ended FAILED (exit code 1; reason NonZeroExitCode)")
    assert describe_end(JobState("5", "NODE_FAIL"), "5", 3)[0] == "lost"
    status, error = describe_end(None, "5", 3)
    assert status == "lost" and "no longer knows it" in error


def test_the_script_asks_for_what_the_config_says_and_meets_at_the_first_nodes_address(tmp_path):
    config = RunConfig(where="slurm", strategy="ddp", devices="cuda", slurm_nodes=2, slurm_gpus_per_node=4,
                       slurm_partition="gpu", slurm_time="2:00:00", slurm_extra=("--exclusive",), max_requeues=2)
    script = render_script(config, [17], [tmp_path / "run-17"], job_name="parallax-17", output=tmp_path / "slurm.log")
    for line in ("#SBATCH --job-name=parallax-17", "#SBATCH --open-mode=append", "#SBATCH --requeue",
                 "#SBATCH --signal=B:USR1@120", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --gpus-per-node=4", "#SBATCH --partition=gpu", "#SBATCH --time=2:00:00",
                 "#SBATCH --exclusive", "MAX_REQUEUES=2", "srun --kill-on-bad-exit=1", "--nproc-per-node=4",
                 '--rdzv-id="$SLURM_JOB_ID"', "NodeAddr=", 'exit "$status"', "trap requeue USR1"):
        assert line in script, line
    assert sbatch_options(RunConfig(where="slurm", strategy="ddp"), job_name="j", output=Path("o"))[-1] == \
        "--cpus-per-task=1"  # one CPU process a node, no loader workers: one core


def test_a_gpu_job_asks_for_a_core_per_process_and_loader_worker_and_srun_is_given_them(tmp_path):
    """2 nodes x 4 GPUs with 2 loader workers each: 4 x (1 + 2) = 12 cores a node, in the header and on srun's
    line (since Slurm 22.05 a step does not inherit sbatch's --cpus-per-task: without it every rank, the torchrun
    agent and the loader workers would share one core)."""
    config = RunConfig(where="slurm", strategy="ddp", devices="cuda", slurm_nodes=2, slurm_gpus_per_node=4,
                       num_workers=2)
    script = render_script(config, [17], [tmp_path / "run-17"], job_name="parallax-17", output=tmp_path / "slurm.log")
    assert "#SBATCH --cpus-per-task=12" in script
    (srun,) = [line for line in script.splitlines() if line.startswith("srun ")]
    assert "--cpus-per-task=12" in srun.split()
    asked = config.replace(slurm_cpus_per_task=48)  # asked for by number: kept
    assert "--cpus-per-task=48" in sbatch_options(asked, job_name="j", output=Path("o"))


def test_a_cpu_request_under_a_core_per_process_is_refused_with_the_figure():
    import pytest

    from contract.config import ConfigError

    with pytest.raises(ConfigError, match=r"slurm_cpus_per_task 2 is not allowed: it gives each of the 4 GPU training "
                                          r"processes on a node less than one core; ask for at least 4, or 0 for what "
                                          r"the run needs \(12: 4 × \(1 \+ 2 loader workers\)\)"):
        RunConfig(where="slurm", strategy="ddp", devices="cuda", slurm_nodes=2, slurm_gpus_per_node=4, num_workers=2,
                  slurm_cpus_per_task=2)


def test_a_cluster_job_is_judged_by_its_nodes_not_by_this_machines_cores():
    """4 loader workers for each of 4 GPU ranks on each of 2 nodes make 36 processes a node, far more than this
    machine's cores allow a local run: on Slurm the nodes it asks for run them (20 cores each)."""
    from trainer_backend.control.slurm_job import check_world

    config = RunConfig(where="slurm", strategy="ddp", devices="cuda", slurm_nodes=2, slurm_gpus_per_node=4,
                       num_workers=4)
    cpu = RunConfig(where="slurm", strategy="ddp", devices=("cpu",) * 64, slurm_nodes=16)  # 4 a node
    assert check_world(config).world_size == 8 and check_world(cpu).world_size == 64

    from contract.slurm_options import cpus_per_node

    assert cpus_per_node(config) == 20 and cpus_per_node(cpu) == 4


@pytest.mark.parametrize("strategy, devices", [("single", "cuda"), ("dp", "cuda"), ("mp", "0,1")])
def test_a_one_process_strategy_is_a_one_task_job_without_torchrun(tmp_path, strategy, devices):
    config = RunConfig(where="slurm", strategy=strategy, devices=devices, slurm_gpus_per_node=2, max_requeues=2)
    script = render_script(config, [17], [tmp_path / "run-17"], job_name="parallax-17", output=tmp_path / "slurm.log")
    (srun,) = [line for line in script.splitlines() if line.startswith("srun ")]
    # One training process, whatever its GPUs: a core for it and one per loader worker, given to srun too.
    cpus = 1 + config.num_workers
    assert srun == (f"srun --kill-on-bad-exit=1 --ntasks=1 --cpus-per-task={cpus} {shlex.quote(sys.executable)} -m "
                    'trainer_backend run --config "$RUN_FOLDER/slurm-config.json" --quiet &')
    assert f"#SBATCH --cpus-per-task={cpus}" in script
    assert "torch.distributed.run" not in script and "rdzv" not in script and "head_address" not in script
    # What the views and the requeue rely on is the same script as ddp's: the job's lines, its log, its trap.
    for line in ("#SBATCH --job-name=parallax-17", "#SBATCH --requeue", "#SBATCH --signal=B:USR1@120",
                 "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=2", "MAX_REQUEUES=2",
                 "trap requeue USR1", "srun_pid=$!", 'exit "$status"', "export PARALLAX_RUN_ID="):
        assert line in script, line
    ddp = render_script(config.replace(strategy="ddp", devices="cuda"), [17], [tmp_path / "run-17"],
                        job_name="parallax-17", output=tmp_path / "slurm.log")
    assert "torch.distributed.run" in ddp and "--ntasks=1 " not in ddp
    # The same header but for the cores: ddp's node runs a process per GPU, this one process.
    assert script.split("\nsrun ")[0] == ddp.split("\nhead_node=")[0].replace(
        "One task per node, each a torchrun agent; they meet at the first node's address (c10d rendezvous).",
        f"One task: {strategy} trains in one process, without torchrun.").replace(
        f"--cpus-per-task={2 * cpus}", f"--cpus-per-task={cpus}")
    assert script.split(" --quiet &\n")[1] == ddp.split(" --quiet &\n")[1]


def test_a_sweeps_array_starts_each_task_as_its_own_strategy_needs(tmp_path):
    """A sweep of single, ddp and mp is one array: each task is started as its run needs, whichever comes first
    (one script, rendered from the first run's options, once ran every task as the first's strategy)."""
    base = RunConfig(where="slurm", strategy="single", devices="cpu")
    tasks = [base, base.replace(strategy="ddp", devices="cpu,cpu"), base.replace(strategy="mp", devices="cpu,cpu"),
             base.replace(strategy="ddp", devices=",".join(["cpu"] * 4))]
    script = render_script(base, [1, 2, 3, 4], [tmp_path / f"run-{i}" for i in range(1, 5)], job_name="sweep",
                           output=tmp_path / "sweep-%a.log", task_configs=tasks)
    assert "TASK_PROCESSES=(0 2 0 4)" in script
    alone, torchrun = script.split("if (( processes == 0 )); then\n")[1].split("\nelse\n")
    assert alone.startswith("srun --kill-on-bad-exit=1 --ntasks=1 ") and "torch.distributed.run" not in alone
    assert 'torch.distributed.run' in torchrun and '--nproc-per-node="$processes"' in torchrun
    assert subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True).returncode == 0
    uniform = render_script(base, [1, 2], [tmp_path / "a", tmp_path / "b"], job_name="sweep",
                            output=tmp_path / "sweep-%a.log", task_configs=[base, base.replace(seed=1)])
    assert "TASK_PROCESSES" not in uniform and "--ntasks=1 " in uniform


def test_the_log_is_tailed_from_a_byte_offset(tmp_path):
    log = tmp_path / "slurm.log"
    run = SimpleNamespace(measurements={"slurm": {"job_id": "4", "log": str(log)}})
    assert read_job_log(run, 0) == ("", 0)  # not there yet
    log.write_bytes(b"first\n")
    text, offset = read_job_log(run, 0)
    assert (text, offset) == ("first\n", 6)
    with open(log, "ab") as handle:
        handle.write(b"second\n")
    assert read_job_log(run, offset) == ("second\n", 13)
    assert read_job_log(run, 0, max_bytes=4) == ("ond\n", 13)
    assert read_job_log(SimpleNamespace(measurements={}), 5) == ("", 5)


def test_a_sqlite_home_is_refused_where_a_node_is_another_machine(monkeypatch, tmp_path):
    """A node elsewhere cannot exist on the test machine: its address is given at the edge (scontrol's answer)."""
    import pytest

    from contract.config import ConfigError
    from trainer_backend.control import slurm_job

    monkeypatch.setenv("PARALLAX_HOME", str(tmp_path))
    monkeypatch.delenv(slurm_job.SHARED_HOME_ENV, raising=False)
    monkeypatch.setattr(slurm_job, "node_addresses", lambda: {"n1": "127.0.0.1", "n7": "192.0.2.7"})
    with pytest.raises(ConfigError) as refused:
        slurm_job.check_database_reachable(f"sqlite:///{tmp_path}/parallax.db")
    assert "node n7 is not" in str(refused.value) and "PARALLAX_SHARED_HOME=1" in str(refused.value)
    slurm_job.check_database_reachable("postgresql://parallax@db.example/parallax")  # a server: taken
    monkeypatch.setenv(slurm_job.SHARED_HOME_ENV, "1")
    slurm_job.check_database_reachable(f"sqlite:///{tmp_path}/parallax.db")  # declared shared: taken
    monkeypatch.setattr(slurm_job, "node_addresses", lambda: {"n1": "127.0.0.1", "n2": "localhost"})
    monkeypatch.delenv(slurm_job.SHARED_HOME_ENV)
    slurm_job.check_database_reachable(f"sqlite:///{tmp_path}/parallax.db")  # every node is this machine


def test_the_world_a_job_trains_is_its_nodes_times_their_processes_and_a_bad_one_is_refused_before_submitting():
    import pytest

    from contract.config import ConfigError
    from trainer_backend.control.slurm_job import check_world

    gpus = RunConfig(where="slurm", strategy="ddp", devices="cuda", slurm_nodes=2, slurm_gpus_per_node=4)
    assert check_world(gpus).world_size == 8 and check_world(gpus.replace(slurm_nodes=1)).world_size == 4
    assert check_world(RunConfig(where="slurm", strategy="ddp", devices="cpu,cpu", slurm_nodes=2)).world_size == 2
    with pytest.raises(ConfigError) as refused:
        check_world(RunConfig(where="slurm", strategy="ddp", devices="cpu", batch_size=7, slurm_nodes=2))
    assert str(refused.value).startswith("on Slurm (2 node(s) × 1 process(es)): ")
