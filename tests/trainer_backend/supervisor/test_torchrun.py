"""Runs started by torchrun: real torchrun agents (``python -m torch.distributed.run``) in real
subprocesses, gloo on CPU, one SQLite file; and the pure pieces that read torchrun's world.

    .venv/bin/python -m pytest tests/trainer_backend/supervisor/test_torchrun.py -q
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from tests.support import ROOT, evaluate_checkpoint, run_cli
from db import store, system_metrics
from contract.config import ConfigError, RunConfig
from trainer_backend.telemetry import sampler as sampler_module
from trainer_backend.telemetry.energy import RaplPackages
from trainer_backend.supervisor import torchrun as torchrun_supervisor
from trainer_backend.supervisor.liveness import install_cancel_handler
from contract.world import TorchrunWorld, check_joinable, joined_config, torchrun_world, values_for_world

TINY = ("--dataset", "digits", "--model", "test_resnet", "--image-size", "16", "--epochs", "2")
DIGITS_TRAIN, DIGITS_VAL = 1437, 360
TIMEOUT_S = 180
SAMPLE_S = 0.2


def free_port() -> int:
    """A port the OS had free a moment ago, for the c10d rendezvous (torch's own tests do the same)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_agent(home, agent_flags: list[str], run_flags: list[str], env_extra: dict | None = None,
                cores: set[int] | None = None) -> subprocess.Popen:
    """A torchrun agent; ``cores`` confines it and its workers to those cores, as a machine of its own."""
    env = {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    env.pop("PARALLAX_DB_URL", None)
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", *agent_flags, "-m", "trainer_backend", "run", *run_flags],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
    )


def finish(agents: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    try:
        outputs = [agent.communicate(timeout=TIMEOUT_S) for agent in agents]
        return [(agent.returncode, *output) for agent, output in zip(agents, outputs)]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()


def runs_of(home) -> list[dict]:
    listed = run_cli("list", home=home).stdout.strip().splitlines()
    ids = [line.split()[0].split("=")[1] for line in listed]
    return [json.loads(run_cli("export", run_id, home=home).stdout) for run_id in ids]


def assert_sampled_every(run: dict, interval_s: float, *, at_least: int = 5) -> None:
    samples = run["system"]
    assert len(samples) >= at_least, samples
    gaps = sorted(b["t_s"] - a["t_s"] for a, b in zip(samples, samples[1:]))
    assert interval_s * 0.75 <= gaps[len(gaps) // 2] <= interval_s * 2  # 2 busy cores: allow a late sample
    assert all(0 <= s["host_cpu_pct"] <= 100 and s["host_memory_mb"] > 0 and s["gpus"] == [] for s in samples)


def test_two_agents_make_one_run_across_two_nodes_with_global_metrics(parallax_home):
    job = f"parallax-test-{uuid.uuid4().hex[:8]}"
    agent_flags = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", job]
    # Each "machine" gets a core of its own: otherwise each would size its threads to both cores
    # and the two would oversubscribe them (4 threads on 2 cores made each epoch 5-10x slower).
    cores = sorted(os.sched_getaffinity(0))
    agents = [start_agent(parallax_home, agent_flags, [*TINY, "--strategy", "ddp", "--devices", "cpu", "--batch-size", "64"],
                          env_extra={"PARALLAX_SAMPLE_S": str(SAMPLE_S)}, cores={cores[node % len(cores)]})
              for node in range(2)]
    results = finish(agents)
    for agent, (_, out, err) in zip(agents, results):
        assert agent.returncode == 0, out + err
    printed = "".join(out for _, out, _ in results)
    assert printed.count("status=completed") == 1  # rank 0 alone reports

    (run,) = runs_of(parallax_home)
    assert run["status"] == "completed" and run["error"] is None
    assert run["world_size"] == 2 and run["nodes"] == 2 and run["hosts"] == [socket.gethostname()] * 2
    assert run["elastic_run_id"] == job and run["host"] == socket.gethostname() and run["pid"] > 0
    assert run["config"]["devices"] == ["cpu", "cpu"] and run["config"]["nodes"] == 2
    assert any("Started by torchrun" in note and "2 processes on 2 machine(s)" in note for note in run["notes"])
    assert [e["epoch"] for e in run["epochs"]] == [1, 2]
    for epoch in run["epochs"]:
        # The global batch: both ranks' images (the sampler pads the shorter shard by one).
        assert DIGITS_TRAIN <= round(epoch["images_per_s"] * epoch["train_time_s"]) <= DIGITS_TRAIN + 1
        assert set(epoch["peak_memory_mb"]) == {"rank0:cpu", "rank1:cpu"}
    # One process on this machine evaluates the saved weights over the whole split.
    checkpoint, accuracy, loss, images = evaluate_checkpoint(parallax_home, {**run, "config": {**run["config"], "nodes": 1}})
    recorded = run["epochs"][checkpoint["epoch"] - 1]
    assert images == DIGITS_VAL
    assert accuracy == recorded["val_acc"] == checkpoint["val_acc"]  # the whole split, counted once
    assert loss == pytest.approx(recorded["val_loss"], rel=1e-4)
    # Every machine is sampled, each at the interval: rank 0's by rank 0, the other by its local
    # rank 0, whose samples reach rank 0 through torchrun's store and are written with its own.
    by_node: dict[int, list[dict]] = {}
    for sample in run["system"]:
        by_node.setdefault(sample["node"], []).append(sample)
    assert sorted(by_node) == [0, 1]
    t_end_s = run["epochs"][-1]["extra"]["t_end_s"]
    for node, samples in by_node.items():
        assert_sampled_every({"system": samples}, SAMPLE_S)
        # The node's own rank, in the run's time (the other machine's wall times made the run's t_s).
        assert {tuple(p["rank"] for p in s["processes"]) for s in samples} == {(node,)}, samples
        assert all(-1 < s["t_s"] < t_end_s + 10 and s["processes"][0]["rss_mb"] > 50 for s in samples), samples
        during = [s for s in samples if run["epochs"][0]["extra"]["t_end_s"] - run["epochs"][0]["train_time_s"]
                  <= s["t_s"] <= t_end_s]
        assert len(during) >= 3, (node, samples)
    assert {s["host"] for s in run["system"]} == {socket.gethostname()}  # both "machines" are this one
    assert not any("system samp" in note.lower() for note in run["notes"]), run["notes"]  # nothing missing
    # Each machine meters itself (its local rank 0) and rank 0 sums them; where RAPL cannot be read
    # (as on most machines without root) no machine has a reading, and the notes say why for each.
    machines = [f"node {node} ({socket.gethostname()})" for node in (0, 1)]
    if RaplPackages().domains:
        assert all(set(e["extra"]["energy_j"]) == {"node0:cpu_package", "node1:cpu_package"}
                   and e["extra"]["energy_j_per_image"] > 0 for e in run["epochs"]), run["epochs"]
    else:
        assert all(e["extra"]["energy_j"] == {} and e["extra"]["energy_j_per_image"] is None for e in run["epochs"])
        for machine in machines:
            assert any(note.startswith(f"{machine}: Energy per image is not recorded") and "cpu_package: RAPL is not"
                       in note for note in run["notes"]), (machine, run["notes"])
    assert not any("spans machines" in note for note in run["notes"]), run["notes"]


def test_a_restarted_job_resumes_its_run_from_the_last_finished_epoch(parallax_home):
    flags = ["--dataset", "digits", "--model", "parallax_fails_in_epoch2_once", "--image-size", "16", "--epochs", "3",
             "--strategy", "ddp"]
    plugin = {"PARALLAX_PLUGINS": "tests.plugins.failing_model"}
    agent = start_agent(parallax_home, ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1"],
                        [*flags, "--devices", "cpu"], env_extra={**plugin, "PARALLAX_SAMPLE_S": str(SAMPLE_S)})
    ((code, out, err),) = finish([agent])
    assert code == 0, out + err
    assert "deliberate failure in rank 1" in err  # the first attempt really failed

    (run,) = runs_of(parallax_home)
    assert run["status"] == "completed" and run["error"] is None
    assert [e["epoch"] for e in run["epochs"]] == [1, 2, 3]
    for epoch in (1, 2, 3):  # epoch 1 was trained (and printed) once, not again after the restart
        assert out.count(f"epoch {epoch}/3 ") == 1, out
    assert "Resumed at epoch 2 after restart 1 of the torchrun job, from the checkpoint of epoch 1." in run["notes"]
    assert any(note.startswith("Attempt 1 of the torchrun job stopped (RuntimeError: deliberate failure in rank 1")
               for note in run["notes"]), run["notes"]
    # The attempt that failed wrote its system samples as it stopped (it lasted less than the
    # sampler's flush interval, so none had been written before): those of epoch 1 sample both
    # ranks. (A sample after it may hold rank 0 alone: rank 1 fails as soon as epoch 2 starts.)
    first_attempt = [s for s in run["system"] if s["t_s"] <= run["epochs"][0]["extra"]["t_end_s"]]
    assert first_attempt and all([p["rank"] for p in s["processes"]] == [0, 1] for s in first_attempt), \
        (run["system"], run["notes"], err[-3000:])
    # Rank 0 samples both local ranks (each with its DataLoader workers summed in) at the interval.
    # The restarted attempt trains epochs 2 and 3 in well under a second: most samples are the first
    # attempt's, four or more over epoch 1 (the plugin holds it a second), then as many as rank 1
    # takes to fail. Four samples keep the median gap one inside an attempt, not the restart's.
    assert_sampled_every(run, SAMPLE_S, at_least=4)
    assert all({p["rank"] for p in s["processes"]} <= {0, 1} and all(p["rss_mb"] > 50 for p in s["processes"])
               for s in run["system"]), run["system"]
    assert max(sum(p["cpu_pct"] for p in s["processes"]) for s in run["system"]) > 20  # they trained
    assert not any(note.startswith("System samples") for note in run["notes"])  # one machine: all of it sampled

    # The same training spawned in one go (the model fails only under torchrun's first attempt):
    # resuming restored the weights, the optimizer and the shuffle, so every epoch matches.
    assert_matches_a_run_spawned_in_one_go(parallax_home, run, flags, plugin)


def assert_matches_a_run_spawned_in_one_go(home, run: dict, flags: list[str], env: dict[str, str]) -> None:
    """``flags`` spawned on two CPU processes in one go train epochs with ``run``'s losses and accuracies."""
    spawned = run_cli("run", *flags, "--devices", "cpu,cpu", home=home, env_extra=env)
    assert spawned.returncode == 0, spawned.stderr
    twin = next(r for r in runs_of(home) if r["run_id"] != run["run_id"])
    for resumed, straight in zip(run["epochs"], twin["epochs"], strict=True):
        for field in ("train_loss", "train_acc", "val_loss", "val_acc"):
            assert resumed[field] == pytest.approx(straight[field], rel=1e-5), (resumed["epoch"], field)


@pytest.mark.parametrize("machines", [1, 2])
def test_a_dataset_cache_that_takes_longer_than_the_collective_timeout_is_waited_for(own_data_dir, parallax_home,
                                                                                   machines):
    """Rank 0 builds the cache in its preflight; the other processes wait for its decision in
    torchrun's store, not in a collective bounded by PARALLAX_COLLECTIVE_TIMEOUT_S (here 12 s against
    a 20 s build, 8 s to spare for the processes' uneven starts; a shorter timeout is outlasted by rank
    0's own set-up after the build on two busy cores). With two
    machines, the other one's local rank 0 builds (here: waits on the cache's lock for) its own copy
    first, and rank 0 waits for it alike."""
    from tests.plugins.slow_cache_build import BUILD_S

    timeout_s = 12
    assert BUILD_S >= timeout_s + 8
    env = {"PARALLAX_PLUGINS": "tests.plugins.slow_cache_build", "PARALLAX_COLLECTIVE_TIMEOUT_S": str(timeout_s)}
    run_flags = [*TINY, "--strategy", "ddp", "--devices", "cpu", "--batch-size", "64"]
    if machines == 1:
        agents = [start_agent(parallax_home, ["--standalone", "--nproc-per-node", "2"], run_flags, env_extra=env)]
    else:
        agent_flags = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                       "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", f"parallax-test-{uuid.uuid4().hex[:8]}"]
        cores = sorted(os.sched_getaffinity(0))
        agents = [start_agent(parallax_home, agent_flags, run_flags, env_extra=env, cores={cores[node % len(cores)]})
                  for node in range(machines)]
    results = finish(agents)
    for code, out, err in results:
        assert code == 0, out + err
    errors = "".join(err for _, _, err in results)
    assert errors.count("slow cache build:") == 1, errors  # built once, by rank 0, within the run
    (run,) = runs_of(parallax_home)
    assert run["status"] == "completed" and run["world_size"] == 2, run["error"]
    assert [e["epoch"] for e in run["epochs"]] == [1, 2]


@pytest.mark.usefixtures("signals")
def test_torchruns_sigterm_after_a_failed_collective_keeps_the_attempts_samples(engine, monkeypatch):
    """A rank's failure often reaches rank 0 first as an error in a collective, and torchrun's
    SIGTERM follows while rank 0 writes what it sampled: the write finishes, and the attempt's
    failure names the collective's error, not the signal."""
    config = RunConfig.from_dict({"dataset": "digits", "model": "test_resnet", "strategy": "ddp",
                                  "devices": ["cpu", "cpu"], "epochs": 2})
    run_id = store.create_run(engine, config.to_dict(), status="running")

    def train_until_a_peer_is_gone(*args, **kwargs):
        time.sleep(1.5)  # the sampler (every 0.1 s) has taken several samples, however busy the machine
        raise RuntimeError("[gloo] Connection closed by peer")

    def write_as_torchrun_signals(self, rows):
        os.kill(os.getpid(), signal.SIGTERM)  # torchrun stops the job's other processes
        return write(self, rows)

    write = sampler_module.DatabaseSink.write
    monkeypatch.setattr(sampler_module.DatabaseSink, "write", write_as_torchrun_signals)
    monkeypatch.setattr(torchrun_supervisor, "train_rank", train_until_a_peer_is_gone)
    monkeypatch.setenv("PARALLAX_SAMPLE_S", "0.1")
    world = TorchrunWorld(rank=0, world_size=2, local_rank=0, local_world_size=2, node_rank=0, job_id="job",
                          restart_count=0, max_restarts=1)
    members = [torchrun_supervisor.Member(socket.gethostname(), 0, "cpu", 0, os.getpid()) for _ in range(2)]
    install_cancel_handler()
    status = torchrun_supervisor._train_and_record(
        engine, run_id, "", config, world, False, f"run-{run_id}", False, torchrun_supervisor.Sampling(0, members),
        uuid.uuid4().hex)
    assert status == "running"  # a restart is left: the run waits for it
    (note,) = [n for n in store.get_run(engine, run_id).notes if n.startswith("Attempt 1")]
    assert "Connection closed by peer" in note, note
    samples = system_metrics.read_samples(engine, [run_id])
    assert len(samples) >= 3 and all(p["rank"] in (0, 1) for s in samples for p in s["processes"]), samples


@pytest.mark.usefixtures("signals")
def test_a_slurm_sigterm_as_training_fails_does_not_cut_rank_0s_record_of_the_failure(engine, monkeypatch):
    """In a Slurm job a SIGTERM asks for a stop at a step and, where none comes within a grace, ends rank 0 as a
    cancel would (rank/stopping.py). One that comes as a peer's failure reaches rank 0 through a collective
    (srun stops the job's other tasks) asked for a stop no step will take: had it gone on to end rank 0 while
    rank 0 recorded the failure, the run would be left to Slurm's exit code, without the peer's reason."""
    from trainer_backend.rank import stopping
    from trainer_backend.supervisor.liveness import raise_cancelled

    config = RunConfig.from_dict({"dataset": "digits", "model": "test_resnet", "strategy": "ddp",
                                  "devices": ["cpu", "cpu"], "epochs": 2})
    run_id = store.create_run(engine, config.to_dict(), status="running")
    grace_s = 0.3

    def train_as_srun_stops_the_job(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # srun --kill-on-bad-exit, passed on by torchrun
        raise RuntimeError("[gloo] Connection closed by peer")

    def slow_failure_cause(folder_name, since):  # a loaded machine: the record outlasts the grace
        assert stopping._settled.is_set(), "the escalation is still armed as the failure is recorded"
        time.sleep(3 * grace_s)
        return "rank 1 raised an exception:\nRuntimeError: deliberate failure in rank 1"

    monkeypatch.setattr(torchrun_supervisor, "train_rank", train_as_srun_stops_the_job)
    monkeypatch.setattr(torchrun_supervisor, "_failure_cause", slow_failure_cause)
    world = TorchrunWorld(rank=0, world_size=2, local_rank=0, local_world_size=2, node_rank=0, job_id="job",
                          restart_count=0, max_restarts=0)
    members = [torchrun_supervisor.Member(socket.gethostname(), 0, "cpu", 0, os.getpid()) for _ in range(2)]
    stopping.stop_on_sigterm(raise_cancelled, grace_s=grace_s)
    status = torchrun_supervisor._train_and_record(
        engine, run_id, "", config, world, False, f"run-{run_id}", False, torchrun_supervisor.Sampling(0, members),
        uuid.uuid4().hex)
    time.sleep(2 * grace_s)  # no escalation left armed either
    run = store.get_run(engine, run_id)
    assert status == "failed" and run.status == "failed"
    assert "deliberate failure in rank 1" in run.error, run.error


@pytest.mark.usefixtures("signals")
def test_a_slurm_run_refused_before_it_trains_ends_failed_with_the_reason(engine, db_url, monkeypatch, tmp_path):
    """A Slurm job's one task (single) whose model file was edited while the job waited is refused by its
    preflight: the run ends failed with that reason (it was left to the poll, which knows only 'Slurm job N ended
    FAILED (exit code 2)'; the reason was in the job's log alone)."""
    from contract.model_source import with_model_source
    from trainer_backend.control.slurm_job import check_world

    net = tmp_path / "my_net.py"
    net.write_text("from tests.plugins.tiny_net import TinyNet as Net\n")
    config = with_model_source(RunConfig(dataset="digits", model=f"{net}:Net", image_size=16, epochs=1,
                                         where="slurm", strategy="single"))
    run_id = store.create_run(engine, config.to_dict(), status="queued")
    net.write_text(net.read_text() + "# edited while the job waited\n")
    monkeypatch.setenv("PARALLAX_RUN_ID", str(run_id))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert torchrun_supervisor.run_one_task_job(check_world(config), db_url=db_url, echo=False) == 2
    run = store.get_run(engine, run_id)
    assert run.status == "failed" and "its file changed after the run was launched" in run.error, run.error


def test_a_single_device_strategy_under_torchrun_is_refused_in_one_line(parallax_home):
    agent = start_agent(parallax_home, ["--standalone", "--nproc-per-node", "2"],
                        [*TINY, "--strategy", "single", "--devices", "cpu"])
    ((code, out, err),) = finish([agent])
    assert code != 0
    refusals = [line for line in err.splitlines() if line.startswith("error: ")]
    assert refusals == ["error: strategy single runs in one process and cannot join torchrun's world of 2 processes: "
                        "use --strategy ddp, fsdp or pp under torchrun, or run single without torchrun"], err[-3000:]
    assert "run_id=" not in out and runs_of(parallax_home) == []


# --- the pure parts -----------------------------------------------------------------------

ENV = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
       "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "exp-1",
       "TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "3"}


def test_torchrun_world_reads_torchruns_environment():
    assert torchrun_world({}) is None
    assert torchrun_world({k: v for k, v in ENV.items() if k != "MASTER_PORT"}) is None
    world = torchrun_world(ENV)
    assert world == TorchrunWorld(rank=3, world_size=4, local_rank=1, local_world_size=2, node_rank=1,
                                  job_id="exp-1", restart_count=1, max_restarts=3)
    assert world.restarts_left == 2
    with pytest.raises(ValueError, match="RANK='x'"):
        torchrun_world({**ENV, "RANK": "x"})


def test_which_strategies_join_and_what_the_world_trains():
    world = torchrun_world(ENV)
    check_joinable("fsdp", world)
    with pytest.raises(ConfigError, match="strategy mp runs in one process"):
        check_joinable("mp", world)
    solo = torchrun_world({**ENV, "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"})
    assert not solo.joined_by(RunConfig()) and solo.joined_by(RunConfig(strategy="ddp"))
    with pytest.raises(ConfigError, match="pp needs at least 2 processes"):
        check_joinable("pp", solo)
    # --devices names the kind; the world's size decides the count (and what the batch divides over).
    assert values_for_world({"strategy": "pp", "devices": "cpu"}, world) == {
        "strategy": "pp", "devices": ["cpu"] * 4, "nodes": 1}
    assert RunConfig.from_dict(values_for_world({"strategy": "ddp", "devices": "0"}, world)).world_size == 4
    assert values_for_world({"strategy": "single"}, solo) == {"strategy": "single"}
    # Each machine's own GPUs: indices repeat across machines, and the batch divides over the world.
    joined = joined_config(RunConfig(strategy="ddp", devices=("cpu",), batch_size=128), ["cpu"] * 4, nodes=2)
    assert joined.world_size == 4 and joined.per_device_batch == 32 and joined.processes_per_node == 2
    assert joined_config(RunConfig(strategy="ddp"), ["cuda:0", "cuda:1"] * 2, nodes=2).devices[2] == "cuda:0"
    with pytest.raises(ConfigError, match="must divide evenly over 4 DDP processes"):
        joined_config(RunConfig(strategy="ddp", batch_size=6), ["cpu"] * 4, nodes=2)
    with pytest.raises(ConfigError, match="nodes 2: only ddp, fsdp and pp"):
        RunConfig(strategy="single", nodes=2)


# --- a new job never takes over an earlier run of the same job id -----------------------------------


def test_a_new_job_under_a_used_job_id_starts_its_own_run_unless_asked_to_resume(parallax_home):
    """torchrun's default --rdzv-id is "none": every job started without one shares it."""
    from db import make_engine
    from db.connection import session_scope
    from db.tables import Run

    from PIL import Image

    folder = parallax_home / "tiny_set"  # ten 8-pixel images: the job's cost is its start-up
    for index, name in enumerate(("a", "b")):
        (folder / name).mkdir(parents=True)
        for i in range(5):
            Image.new("RGB", (8, 8), (90 * index, 40 * i, 10)).save(folder / name / f"{i}.png")
    flags = ["--dataset", str(folder), "--model", "test_resnet", "--image-size", "8", "--epochs", "1",
             "--strategy", "ddp", "--devices", "cpu"]

    def agent() -> list[str]:  # no --rdzv-id (--standalone would make up a random one)
        return ["--nnodes", "1", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]

    ((code, out, err),) = finish([start_agent(parallax_home, agent(), flags)])
    assert code == 0, out + err
    (first,) = runs_of(parallax_home)
    assert first["elastic_run_id"] == "none"
    # Its job died (the machine went down, say): readers mark such a run lost.
    with session_scope(make_engine(f"sqlite:///{parallax_home / 'parallax.db'}")) as session:
        session.get(Run, first["run_id"]).status = "lost"

    ((code, out, err),) = finish([start_agent(parallax_home, agent(), flags)])
    assert code == 0, out + err
    runs = {run["run_id"]: run for run in runs_of(parallax_home)}
    assert len(runs) == 2, "the new job took over the lost run"
    assert runs[first["run_id"]]["status"] == "lost" and len(runs[first["run_id"]]["epochs"]) == 1
    second = next(run for run_id, run in runs.items() if run_id != first["run_id"])
    assert second["status"] == "completed" and [e["epoch"] for e in second["epochs"]] == [1]

    # Asked to, a new job takes over the newest run of the job id, only if it was lost or failed.
    ((code, out, err),) = finish([start_agent(parallax_home, agent(), [*flags, "--resume-job"])])
    assert code != 0 and "run_id=" not in out
    assert [line for line in err.splitlines() if line.startswith("error: ")] == [
        f"error: --resume-job: run {second['run_id']} of torchrun job none is completed; only a run that was lost or "
        "failed is taken over (leave out --resume-job to start a new run)"]
    assert len(runs_of(parallax_home)) == 2


def test_only_a_restarted_attempt_or_resume_job_carries_on_in_an_earlier_run(parallax_home, db_url):
    """The decision itself, on a real database: which earlier run, if any, a job's rank 0 opens."""
    from db import dispose_engines, elastic, make_engine, store
    from trainer_backend.supervisor.torchrun import _open_run

    engine = make_engine(db_url)
    world = torchrun_world({**ENV, "RANK": "0", "TORCHELASTIC_RUN_ID": "job-a", "TORCHELASTIC_RESTART_COUNT": "0"})
    joined = RunConfig(strategy="ddp", devices=("cpu", "cpu"))

    def earlier(status: str) -> int:
        run_id = store.create_run(engine, joined.to_dict(), status="running")
        elastic.record_job(engine, run_id, elastic_run_id="job-a", nodes=1, hosts=["h"])
        if status != "running":
            store.set_status(engine, run_id, status)
        return run_id

    for status in ("running", "lost", "failed", "completed", "cancelled"):
        old = earlier(status)
        new_id, opened = _open_run(engine, joined, world, ["h"], [], restarted=False)
        assert new_id != old and opened == "running", status  # a new job: always a run of its own
        assert store.get_run(engine, old).status == status
        store.set_status(engine, new_id, "completed")
    old = earlier("running")
    assert _open_run(engine, joined, world, ["h"], [], restarted=True) == (old, "running")  # torchrun restarted it
    store.set_status(engine, old, "lost")
    assert _open_run(engine, joined, world, ["h"], [], restarted=False, resume_job=True) == (old, "running")
    dispose_engines()


def test_a_nan_stop_is_recorded_in_its_own_words_not_as_a_traceback(parallax_home, engine):
    """Every rank of a torchrun job raises TrainingDiverged at the same step (rank/divergence.py): the run's
    error is that one line, as for a spawned run, not rank 0's traceback."""
    from db.folders import run_folder, run_folder_name
    from trainer_backend.rank.divergence import TrainingDiverged
    from trainer_backend.rank.trainer import leave_failure_note

    run_id = store.create_run(engine, RunConfig().to_dict(), status="running")
    folder = run_folder(engine, run_id, create=True)
    reason = "loss became NaN at epoch 2 step 7 (lr 0.001); the run stopped there (--on-nonfinite stop)"
    try:
        raise TrainingDiverged(reason)
    except TrainingDiverged as exc:
        leave_failure_note(folder, 0, exc)
    assert torchrun_supervisor._failure_cause(run_folder_name(engine, run_id), since=0) == reason
