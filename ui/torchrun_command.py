"""The torchrun command that trains a Launch form's config across machines. Built here, never run.

    torchrun_command(config, nodes=2, procs_per_node=4, endpoint="node0:29400", job_id="parallax-1a2b3c4d")
    # 'torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint node0:29400
    #  --rdzv-id parallax-1a2b3c4d -m trainer_backend run --dataset digits --model resnet18 --strategy ddp ...'

The same command runs on every machine; its flags parse back (``python -m trainer_backend run``'s
parser) into the form's own ``RunConfig``. Bad values raise ``ConfigError`` naming the field.
"""

from __future__ import annotations

import shlex
import uuid
from dataclasses import fields

from contract.config import MAX_NODES, ConfigError, RunConfig
from contract.fields import FIELDS, SET_BY_LAUNCH, SET_BY_TORCHRUN
from contract.world import TorchrunWorld, check_joinable, joined_config

ALWAYS_SHOWN = ("dataset", "model", "strategy", "devices")  # the rest only where they differ from the defaults
MAX_PROCS_PER_NODE = 1024


def new_job_id() -> str:
    """A fresh rendezvous id: torchrun tells jobs apart by it, and a restarted job finds its run by it."""
    return f"parallax-{uuid.uuid4().hex[:8]}"


def config_flags(config: RunConfig) -> list[str]:
    """``trainer_backend run`` flags that give back ``config``."""
    default = RunConfig()
    flags: list[str] = []
    for field in fields(RunConfig):
        name, value = field.name, getattr(config, field.name)
        if name in SET_BY_TORCHRUN or name in SET_BY_LAUNCH or (name not in ALWAYS_SHOWN and value == getattr(default, name)):
            continue
        flag = FIELDS[name].flag
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{flag[2:]}")
        elif isinstance(value, tuple):
            flags += [flag, ",".join(str(item) for item in value)]
        elif value is not None:
            flags += [flag, str(value)]
    return flags


def parse_endpoint(endpoint: str) -> str:
    """'host:port' with a port torchrun can listen on; returns it stripped."""
    text = str(endpoint).strip()
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535 or any(c.isspace() for c in text):
        raise ConfigError(
            "endpoint", f"rendezvous endpoint {endpoint!r} is not allowed: use HOST:PORT, a machine every node "
            "reaches and a free port on it, e.g. node0:29400")
    return text


def _whole(name: str, label: str, value, high: int, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(name, f"{label} {value!r} is not allowed: use a whole number from {low} to {high}")
    return value


def torchrun_command(config: RunConfig, *, nodes: int, procs_per_node: int, endpoint: str, job_id: str,
                     max_restarts: int = 0) -> str:
    """The command to run on each of ``nodes`` machines, quoted for a POSIX shell."""
    _whole("nodes", "nodes", nodes, MAX_NODES)
    _whole("procs_per_node", "processes per node", procs_per_node, MAX_PROCS_PER_NODE)
    _whole("max_restarts", "restarts", max_restarts, 100, low=0)
    endpoint = parse_endpoint(endpoint)
    job_id = str(job_id).strip()
    if not job_id or any(c.isspace() for c in job_id):
        raise ConfigError("job_id", f"job id {job_id!r} is not allowed: use one word, unique to this job, e.g. {new_job_id()}")
    world_size = nodes * procs_per_node
    check_joinable(config.strategy, TorchrunWorld(rank=0, world_size=world_size, local_rank=0, local_world_size=procs_per_node,
                                         node_rank=0, job_id=job_id, restart_count=0, max_restarts=max_restarts))
    # The world the processes will build: does the batch divide over it, and so on.
    per_node = [f"cuda:{i}" for i in range(procs_per_node)] if config.uses_cuda else ["cpu"] * procs_per_node
    joined_config(config, per_node * nodes, nodes=nodes)
    restarts = ["--max-restarts", str(max_restarts)] if max_restarts else []
    # Each machine's agent counts restarts of its own; the agents' shared store would then mix
    # attempts (pytorch#135712). Without it, rank 0 serves a fresh store for every attempt.
    unshared = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 " if max_restarts and nodes > 1 else ""
    # torchrun starts each rank as `python -m trainer_backend` in the folder it was started from: the ranks
    # leave that folder off their import path, so that packages of its own (db/, ui/) cannot stand in for ours.
    return "PYTHONSAFEPATH=1 " + unshared + shlex.join([
        "torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(procs_per_node), "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint, "--rdzv-id", job_id, *restarts,
        "-m", "trainer_backend", "run", *config_flags(config),
    ])
