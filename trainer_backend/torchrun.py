"""Join the world torchrun started instead of spawning one: runs across machines.

    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint node0:29400 --rdzv-id exp-1 \\
        -m trainer_backend run --strategy ddp --devices cuda --model resnet50 --epochs 10

Every process torchrun starts runs ``python -m trainer_backend run``. Under ddp, fsdp and pp each
joins torchrun's world (``init_process_group`` by ``env://``) on ``cuda:LOCAL_RANK``, or on the CPU
with ``cores // LOCAL_WORLD_SIZE`` threads, and trains its part with the same per-rank code as a
spawned run (``trainer.train_process``), so the metrics are the same global ones. The world comes
from torchrun; ``--devices`` only says which kind of device. Global rank 0 alone writes the
database: one run for the whole job with its world size, machines and their hosts, and torchrun's
job id (``--rdzv-id``), by which a job restarted under ``--max-restarts N`` finds its run again and
resumes it from the last finished epoch (``resume``). A new job (its first attempt) always starts a
run of its own, even under a job id and training used before (the default id is "none"), unless
``--resume-job`` asks it to take over that earlier run where it was lost or failed.

Reading torchrun's environment imports nothing heavy: a strategy that cannot join is refused at once.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from typing import Mapping

from .config import DISTRIBUTED, ConfigError, RunConfig, cuda_device_count, parse_devices

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class TorchrunWorld:
    """This process's place in the world torchrun started, as its environment tells it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    job_id: str
    restart_count: int
    max_restarts: int

    @property
    def restarts_left(self) -> int:
        return max(0, self.max_restarts - self.restart_count)

    def joined_by(self, config: RunConfig) -> bool:
        """Whether this run takes part in the world (the others run alone, or are refused)."""
        return config.strategy in DISTRIBUTED or self.world_size > 1


def torchrun_world(environ: Mapping[str, str] | None = None) -> TorchrunWorld | None:
    """The world torchrun started this process in, or None outside torchrun."""
    env = os.environ if environ is None else environ
    if not all(env.get(name) for name in TORCHRUN_ENV):
        return None

    def number(name: str, default: str) -> int:
        raw = env.get(name) or default
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"torchrun's environment has {name}={raw!r}, which is not a whole number") from None

    world_size = number("WORLD_SIZE", "1")
    return TorchrunWorld(
        rank=number("RANK", "0"), world_size=world_size, local_rank=number("LOCAL_RANK", "0"),
        local_world_size=number("LOCAL_WORLD_SIZE", str(world_size)), node_rank=number("GROUP_RANK", "0"),
        job_id=env.get("TORCHELASTIC_RUN_ID") or "none",
        restart_count=number("TORCHELASTIC_RESTART_COUNT", "0"), max_restarts=number("TORCHELASTIC_MAX_RESTARTS", "0"),
    )


def values_for_world(values: dict, world: TorchrunWorld) -> dict:
    """Config values (flags, --config) for a run under torchrun: ddp, fsdp and pp get one device of
    the kind --devices names per process of the world, so that the checks that depend on it (the
    batch divides over it) hold for torchrun's world and not for the length of --devices. Until every
    process has joined and said which device it has (``joined_config``), GPUs stand in as cuda:0 on
    a machine each, which passes the checks that only the real world can answer."""
    strategy = values.get("strategy") or RunConfig.strategy
    check_joinable(strategy, world)
    if strategy not in DISTRIBUTED:
        return values  # a world of one: it runs as it would without torchrun
    kinds = {device.split(":")[0] for device in parse_devices(values.get("devices") or RunConfig.devices)}
    if len(kinds) > 1:
        return values  # RunConfig names the mix
    size = world.world_size
    if kinds == {"cpu"}:
        return {**values, "devices": ["cpu"] * size, "nodes": 1}
    return {**values, "devices": ["cuda:0"] * size, "nodes": size}


def check_joinable(strategy: str, world: TorchrunWorld) -> None:
    """Refuse a strategy that cannot join torchrun's world, naming what can."""
    if strategy not in DISTRIBUTED and world.world_size > 1:
        raise ConfigError(
            "strategy", f"strategy {strategy} runs in one process and cannot join torchrun's world of "
            f"{world.world_size} processes: use --strategy ddp, fsdp or pp under torchrun, or run {strategy} "
            "without torchrun")
    if strategy == "pp" and world.world_size < 2:
        raise ConfigError(
            "strategy", "strategy pp needs at least 2 processes, one per stage, and torchrun started 1: "
            "use --nproc-per-node 2 or more")


def local_device(config: RunConfig, world: TorchrunWorld) -> str:
    """cuda:LOCAL_RANK when the config asks for GPUs, else the CPU."""
    if not config.uses_cuda:
        return "cpu"
    available = cuda_device_count()
    if world.local_rank >= available:
        raise ConfigError(
            "devices", f"torchrun started {world.local_world_size} processes on {socket.gethostname()}, which has "
            f"{available} GPU(s), so cuda:{world.local_rank} does not exist: use --nproc-per-node {available} or "
            "fewer (or --devices cpu)")
    return f"cuda:{world.local_rank}"


def joined_config(config: RunConfig, devices: list[str] | tuple[str, ...], nodes: int) -> RunConfig:
    """The config the world trains: one device per process in rank order, over ``nodes`` machines.
    Raises ConfigError where the world does not fit it (a batch that does not divide over it)."""
    return config.replace(devices=tuple(devices), nodes=nodes)


def world_note(joined: RunConfig, world: TorchrunWorld, hosts: list[str]) -> str:
    kind = "GPU" if joined.uses_cuda else "CPU"
    machines = ", ".join(dict.fromkeys(hosts))
    return (f"Started by torchrun (job {world.job_id}): {joined.world_size} processes on {joined.nodes} machine(s) "
            f"({machines}), one {kind} device each. The world comes from torchrun (--nnodes, --nproc-per-node); "
            f"--devices only chose {kind} devices.")


def refuse(world: TorchrunWorld, exc: Exception) -> int:
    """One line per machine (its first process says it), and the exit code of bad input."""
    if world.local_rank == 0:
        print(f"error: {exc}", file=sys.stderr, flush=True)
    return 2


def run_in_world(config: RunConfig, world: TorchrunWorld, *, db_url: str | None = None, echo: bool = True,
                 resume_job: bool = False) -> int:
    """Join torchrun's world and train this process's part of the job; returns the exit code."""
    try:
        check_joinable(config.strategy, world)
        device = local_device(config, world)
    except ConfigError as exc:
        return refuse(world, exc)
    from .lifecycle import RunCancelled, install_cancel_handler

    if world.rank == 0:
        install_cancel_handler()  # a cancel from the dashboard or `cancel` reaches rank 0
    try:
        return _join(config, world, device, db_url, echo, resume_job)
    except (RunCancelled, KeyboardInterrupt):
        return 1  # torchrun (or the user) stopped the job before this run existed


def _join(config: RunConfig, world: TorchrunWorld, device: str, db_url: str | None, echo: bool, resume_job: bool) -> int:
    import torch
    import torch.distributed as dist

    from db.settings import database_url

    from .strategies import collective_timeout

    timeout = collective_timeout()
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # The agent's store outlives a restart, with the last attempt's keys in it; taken as they
        # are, the processes of a restarted job meet stale peers and hang (pytorch#135712).
        # Each attempt keeps to keys of its own.
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world.world_size,
                              is_master=False, timeout=timeout)
        dist.init_process_group(backend, store=dist.PrefixStore(f"parallax/attempt-{world.restart_count}", store),
                                rank=world.rank, world_size=world.world_size, timeout=timeout)
    else:
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
    try:
        members: list = [None] * world.world_size
        dist.all_gather_object(members, (socket.gethostname(), world.node_rank, device, world.restart_count))
        by_node = {node: host for host, node, _, _ in members}
        hosts = [by_node[node] for node in sorted(by_node)]
        # Each machine's agent counts restarts of its own, so any count above 0 means a restart.
        restarted = any(count > 0 for _, _, _, count in members)
        try:
            joined = joined_config(config, [d for _, _, d, _ in members], nodes=len(hosts))
        except ConfigError as exc:
            return refuse(world, exc)  # every process reaches the same verdict
        url = database_url(db_url)
        if world.rank == 0:
            return _lead(joined, world, hosts, url, echo, restarted, resume_job)
        return _follow(joined, world, url, resume_job)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _tell(decision: tuple | None) -> tuple:
    """Rank 0 tells every process what to do: ("train", run_id, 0, run folder name) or
    ("stop", run_id, exit code, None). The folder's name comes from rank 0, the one process that
    opens the database: a machine of the job that has no copy of it still keys its files alike."""
    import torch.distributed as dist

    holder = [decision]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def _follow(joined: RunConfig, world: TorchrunWorld, url: str, resume_job: bool) -> int:
    from .trainer import train_process

    action, run_id, code, folder_name = _tell(None)
    if action == "stop":
        return code
    train_process(world.rank, joined.to_dict(), run_id, url, echo=False,
                  resumable=world.max_restarts > 0 or resume_job, folder_name=folder_name)
    return 0


def _lead(joined: RunConfig, world: TorchrunWorld, hosts: list[str], url: str, echo: bool, restarted: bool,
          resume_job: bool) -> int:
    from db import make_engine, store
    from db.folders import run_folder_name

    from .runner import USER_ERRORS, _announce, preflight, run_notes

    try:
        info = preflight(joined)
        notes = [world_note(joined, world, hosts), *run_notes(joined, info)]
        engine = make_engine(url)
        run_id, status = _open_run(engine, joined, world, hosts, notes, restarted, resume_job)
        folder_name = run_folder_name(engine, run_id)
    except USER_ERRORS as exc:
        _tell(("stop", None, 2, None))
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except BaseException:
        _tell(("stop", None, 1, None))
        raise
    if status != "running":
        # A restart of a job whose run has ended (cancelled, say): nothing to resume, and exit
        # code 0 for a run that ended on purpose, so torchrun does not restart it again.
        code = 0 if status in ("completed", "cancelled") else 1
        _tell(("stop", run_id, code, None))
        print(f"run_id={run_id} status={status}", flush=True)
        return code
    _tell(("train", run_id, 0, folder_name))
    if echo:
        _announce(run_id, joined, info, notes)
    status = _train_and_record(engine, run_id, url, joined, world, echo, folder_name, resume_job)
    run = store.get_run(engine, run_id)
    if status not in ("completed", "running"):
        print(f"error: {run.error or ''}", file=sys.stderr, flush=True)
    elif status == "running":
        print(f"run_id={run_id} attempt {world.restart_count + 1} stopped; torchrun may restart the job "
              f"({world.restarts_left} restart(s) left)", file=sys.stderr, flush=True)
    print(f"run_id={run_id} status={status}", flush=True)
    return 0 if status == "completed" else 1


def _open_run(engine, joined: RunConfig, world: TorchrunWorld, hosts: list[str], notes: list[str],
              restarted: bool, resume_job: bool = False) -> tuple[int, str]:
    """The job's run: the one an earlier attempt of this job left unfinished, else a new one.
    (run id, status); a restart of a job whose run has ended gets that run and its status.

    Only a restarted attempt carries on in an earlier run: a new job, under a job id and training
    used before, would otherwise mix its epochs into a run that ended long ago (or into one that a
    job still running owns). ``resume_job`` asks a new job to take over a lost or failed run."""
    from db import elastic, store
    from db import lifecycle as state

    pid, host = os.getpid(), socket.gethostname()
    if resume_job and not restarted:
        state.mark_lost_runs(engine)  # a run whose job died is lost, and may be taken over
    found = elastic.find_job_run(engine, world.job_id)
    # The same job id with the same training is the same job (the world may have changed size).
    same = found is not None and same_training(store.get_run(engine, found[0]).config, joined.to_dict())
    if same and (restarted or resume_job):
        run_id, status = found
        statuses = elastic.RESUMABLE_STATUSES if restarted else elastic.TAKEOVER_STATUSES
        if elastic.resume_job_run(engine, run_id, pid=pid, host=host, nodes=len(hosts), hosts=hosts, statuses=statuses):
            store.add_notes(engine, run_id, notes)
            _forget_failures(engine, run_id)
            return run_id, "running"
        if restarted:
            return run_id, store.get_run(engine, run_id).status
        raise ValueError(f"--resume-job: run {run_id} of torchrun job {world.job_id} is {status}; only a run that was "
                         f"{' or '.join(elastic.TAKEOVER_STATUSES)} is taken over (leave out --resume-job to start a new run)")
    if resume_job and not restarted:
        raise ValueError(f"--resume-job: no run of torchrun job {world.job_id} (--rdzv-id) with this training to take "
                         "over; leave out --resume-job to start a new run")
    # Started at once: the job's processes are already running on every machine, so it does
    # not wait in this machine's queue.
    run_id = store.create_run(engine, joined.to_dict(), status="running", notes=notes, world_size=joined.world_size)
    store.set_process(engine, run_id, pid=pid, host=host)
    elastic.record_job(engine, run_id, elastic_run_id=world.job_id, nodes=len(hosts), hosts=hosts)
    return run_id, "running"


def same_training(stored: dict, joined: dict) -> bool:
    """Whether two configs train the same thing, whatever world they were given."""
    ignored = ("devices", "nodes")
    return {k: v for k, v in stored.items() if k not in ignored} == {k: v for k, v in joined.items() if k not in ignored}


def _forget_failures(engine, run_id: int) -> None:
    """A new attempt's failures are its own: drop the tracebacks the previous one left here."""
    from db.folders import run_folder

    for path in run_folder(engine, run_id, create=True).glob("rank*.failure.json"):
        path.unlink(missing_ok=True)


def _train_and_record(engine, run_id: int, url: str, joined: RunConfig, world: TorchrunWorld, echo: bool,
                      folder_name: str, resume_job: bool) -> str:
    """Rank 0 trains its part and records how the attempt ended; returns the run's status."""
    from db import lifecycle as state
    from db import store

    from .lifecycle import Heartbeat, RunCancelled
    from .trainer import train_process

    started = time.time()
    try:
        with Heartbeat(engine, run_id):
            train_process(0, joined.to_dict(), run_id, url, echo=echo, resumable=world.max_restarts > 0 or resume_job,
                          folder_name=folder_name)
        state.finish(engine, run_id, "completed")
    except KeyboardInterrupt:
        state.finish(engine, run_id, "cancelled", error="cancelled by the user (Ctrl-C)")
    except RunCancelled:
        # `cancel` marks the run cancelled before it signals; any other SIGTERM is torchrun
        # stopping the job, which it does when another of its processes has failed.
        if store.get_run(engine, run_id).status != "cancelled":
            _attempt_failed(engine, run_id, world, _failure_cause(folder_name, started) or (
                "torchrun stopped rank 0 (SIGTERM), most likely because another process of the job failed; "
                "torchrun's output names it"))
    except Exception as exc:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # torchrun's SIGTERM must not cut the record short
        import traceback

        own = f"rank 0 raised an exception:\n{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}"
        _attempt_failed(engine, run_id, world, _failure_cause(folder_name, started) or own)
    status = store.get_run(engine, run_id).status
    if status != "completed":
        # Recorded: from here on torchrun's SIGTERM may end this process at once, even if
        # leaving a process group whose peers are gone would hang.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return status


def _failure_cause(folder_name: str, since: float) -> str | None:
    """The first failure of this attempt among the ranks on this machine (a rank that fails makes
    its peers fail mid-collective; the first one is the cause)."""
    from db.folders import named_run_folder

    from .runner import _with_oom_hint
    from .trainer import read_rank_failures

    failures = [f for f in read_rank_failures(named_run_folder(folder_name)) if f["time"] >= since]
    if not failures:
        return None
    first = min(failures, key=lambda f: f["time"])
    return _with_oom_hint(f"rank {first['rank']} raised an exception:\n{first['traceback']}")


def _attempt_failed(engine, run_id: int, world: TorchrunWorld, cause: str) -> None:
    """With restarts left the run stays running for the restarted job to resume; else it failed."""
    from db import lifecycle as state
    from db import store

    if world.restarts_left:
        summary = next((line for line in reversed(cause.strip().splitlines()) if line.strip()), cause)
        store.add_notes(engine, run_id, [
            f"Attempt {world.restart_count + 1} of the torchrun job stopped ({summary.strip()}); torchrun restarts "
            f"it ({world.restarts_left} restart(s) left) and it resumes from its last finished epoch."])
    else:
        state.finish(engine, run_id, "failed", error=cause)
