"""Which rank of a distributed job this process is, and the key its ranks find their one run by.

Every rank calls ``parallax.init``; rank 0 creates the run (or resumes it) and the others join it: they
wait for a running script run with their job's key whose heartbeat is younger than their own process.
The key is, in order of preference:

- ``PARALLAX_RUN_GROUP``, where set (the same value on every rank): for launchers this cannot recognise;
- torchrun's job id (``TORCHELASTIC_RUN_ID``: ``--rdzv-id``, or the id ``--standalone`` makes) with the
  rendezvous address (``MASTER_ADDR``:``MASTER_PORT``);
- on one machine, that address with the host name and the parent process (torchrun's agent, or the
  process that called ``mp.spawn``): the ranks of one job share it, and no other job on the machine does.

A job across machines without a torchrun job id needs ``PARALLAX_RUN_GROUP`` (or ``id=``).

The rank is ``torch.distributed``'s where a process group exists (``mp.spawn`` scripts often set no
``RANK``), else ``RANK``, else 0. torch is never imported here: only asked if the script already has it.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
from dataclasses import dataclass

GROUP_ENV = "PARALLAX_RUN_GROUP"


@dataclass(frozen=True)
class RankInfo:
    rank: int
    local_rank: int
    world_size: int
    node: int  # the machine's node rank in a torchrun job (GROUP_RANK), 0 elsewhere

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int, environ) -> int:
    raw = environ.get(name)
    try:
        return int(raw) if raw not in (None, "") else default
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a whole number; torchrun and mp.spawn set it to one") from None


def rank_info(environ=os.environ) -> RankInfo:
    """This process's place in its job (rank 0 of 1 outside any)."""
    rank, world_size = _env_int("RANK", 0, environ), _env_int("WORLD_SIZE", 1, environ)
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        rank, world_size = distributed.get_rank(), distributed.get_world_size()
    return RankInfo(rank=rank, local_rank=_env_int("LOCAL_RANK", rank, environ), world_size=world_size,
                    node=_env_int("GROUP_RANK", 0, environ))


def group_key(info: RankInfo, environ=os.environ) -> str:
    """The key the ranks of this job share (see the module's docstring); "" for a job of one process."""
    if environ.get(GROUP_ENV):
        parts = ["group", environ[GROUP_ENV]]
    elif info.world_size <= 1:
        return ""
    else:
        address = f"{environ.get('MASTER_ADDR', '')}:{environ.get('MASTER_PORT', '')}"
        job = environ.get("TORCHELASTIC_RUN_ID", "")
        if job and job != "none":
            parts = ["torchrun", job, address]
        else:
            parts = ["machine", socket.gethostname(), str(os.getppid()), address]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]
