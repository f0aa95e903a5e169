"""The world torchrun started this process in, as its environment tells it, and the checks that
need only that: which strategies can join it, the devices and machines a config gets in it.

    world = torchrun_world()            # None outside torchrun
    if world is not None and world.joined_by(config):
        ...                             # trainer_backend.supervisor.torchrun.run_in_world(config, world)

Imports neither torch nor the database: the command line refuses a strategy that cannot join at
once, and the dashboard's Launch form checks its torchrun command with the same rules.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass
from collections.abc import Mapping

from contract.config import ConfigError, RunConfig, cuda_device_count, parse_devices
from contract.strategy_specs import find, spec

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# The run a Slurm job trains: recorded (queued) when it was submitted (control/slurm_job.py), named by the job's
# script to every process of the job, torchrun's or, for single, dp and mp, the one task's.
SUBMITTED_RUN_ENV = "PARALLAX_RUN_ID"


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
        return spec(config.strategy).distributed or self.world_size > 1


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
    known = find(strategy)
    if known is None or not known.distributed:
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
    known = find(strategy)  # not validated yet: an unknown one is refused as one process, or by RunConfig
    if not (known and known.distributed) and world.world_size > 1:
        raise ConfigError(
            "strategy", f"strategy {strategy} runs in one process and cannot join torchrun's world of "
            f"{world.world_size} processes: use --strategy ddp, fsdp or pp under torchrun, or run {strategy} "
            "without torchrun")
    if known and known.distributed and known.staged and world.world_size < 2:  # a process per stage
        raise ConfigError(
            "strategy", f"strategy {strategy} needs at least 2 processes, one per stage, and torchrun started 1: "
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


REFUSAL_GRACE_S = 10.0  # what the machine's first process gets to say why, on a busy machine


def refuse(world: TorchrunWorld, exc: Exception) -> int:
    """One line per machine (its first process says it), and the exit code of bad input."""
    if world.local_rank == 0:
        print(f"error: {exc}", file=sys.stderr, flush=True)
    else:
        # torchrun stops every process of the machine when the first one exits: one that left before
        # the machine's first process had printed would take the only line with it.
        time.sleep(REFUSAL_GRACE_S)
    return 2
