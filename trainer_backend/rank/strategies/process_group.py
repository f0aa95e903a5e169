"""The collectives a strategy's processes share: one process group per run for the strategies that run a process
per device (ddp, fsdp, pp), and a group of one, where every collective is a no-op, for the others.

    group = ProcessGroup(config, rank, device, store_host, store_port)
    group.join()                          # threads, the run's own TCPStore, init_process_group
    group.all_reduce(tensor, "max"); group.barrier()
    group.leave()

Also how long a rank waits in a collective (``collective_timeout``).
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from contract.config import RunConfig, threads_per_process
from contract.environment import seconds_from_env

COLLECTIVE_TIMEOUT_ENV = "PARALLAX_COLLECTIVE_TIMEOUT_S"
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0
# Rendezvous waits for every rank to start (imports, data loading): never shorter than this.
RENDEZVOUS_TIMEOUT = datetime.timedelta(minutes=10)


def collective_timeout() -> datetime.timedelta:
    """How long a rank waits in a collective for the others before the run fails:
    ``PARALLAX_COLLECTIVE_TIMEOUT_S`` seconds, default 600. gloo raises in the waiting rank
    when it passes; NCCL's watchdog tears the waiting process down."""
    return datetime.timedelta(seconds=seconds_from_env(COLLECTIVE_TIMEOUT_ENV, DEFAULT_COLLECTIVE_TIMEOUT_S))


class LocalGroup:
    """One process: nothing to join, and every collective is a no-op."""

    def join(self) -> None:
        pass

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        return tensor

    def barrier(self) -> None:
        """Wait for every process of the run."""

    def leave(self) -> None:
        pass


class ProcessGroup:
    """One process per device; the store is the run's own TCPStore, so two runs never share a port."""

    def __init__(self, config: RunConfig, rank: int, device: torch.device, store_host: str = "", store_port: int = 0):
        self.config, self.rank, self.device = config, rank, device
        self.world_size = len(config.devices)
        self.store_host, self.store_port = store_host, store_port
        self._store = None

    def join(self) -> None:
        # Spawned workers inherit every core's worth of threads; N of them oversubscribe the CPU,
        # and on GPUs that CPU is what launches kernels and feeds the loaders.
        torch.set_num_threads(threads_per_process(self.config))
        if dist.is_initialized():
            return  # torchrun started this process and it has joined torchrun's world already
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        timeout = collective_timeout()
        if self.world_size == 1 and not self.store_port:
            # A world of one is not spawned: the process serves its own store and forms a process
            # group of one, so DDP and FSDP wrap and reduce exactly as they do over several ranks.
            self._store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timeout, wait_for_workers=False)
        elif not self.store_port:
            # Connecting to port 0 would wait in C++ for a store nobody serves, deaf to signals.
            raise RuntimeError(f"rank {self.rank} of {self.world_size} was started without the run's rendezvous store")
        else:
            self._store = dist.TCPStore(self.store_host, self.store_port, None, False,
                                        timeout=max(timeout, RENDEZVOUS_TIMEOUT))
        # Bound to the rank's GPU: NCCL then makes its context and communicator there, and a collective
        # that names no device (a barrier, FSDP's and the pipeline's first) runs there too, not on
        # GPU rank % count, which under --devices 1,0 or 2,3 belongs to another rank or another user.
        dist.init_process_group(backend, store=self._store, rank=self.rank, world_size=self.world_size, timeout=timeout,
                                device_id=self.device if self.device.type == "cuda" else None)

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
        dist.all_reduce(tensor, op=reduce_op)
        return tensor

    def barrier(self) -> None:
        """Wait for every process of the run."""
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index])  # NCCL's barrier is an all-reduce on a device
        else:
            dist.barrier()

    def leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        self._store = None  # a world of one stops serving its store here
