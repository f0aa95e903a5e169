"""``ddp``: DistributedDataParallel, one process per device, gradients all-reduced."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DistributedSampler, Sampler

from contract.config import RunConfig, threads_per_process
from trainer_backend.engine.strategies.base import RENDEZVOUS_TIMEOUT, Strategy, collective_timeout


class DistributedStrategy(Strategy):
    """One process per device; the store is the run's own TCPStore, so two runs never share a port."""

    name = "ddp"
    comm_measure = "hook"

    @classmethod
    def create(cls, config: RunConfig, rank: int = 0, *, in_chans: int = 3, store_host: str = "",
               store_port: int = 0) -> Strategy:
        return cls(config, rank, store_host, store_port)

    def __init__(self, config: RunConfig, rank: int, store_host: str = "", store_port: int = 0):
        super().__init__(config, rank)
        self.world_size = len(config.devices)
        self.input_device = self.output_device = torch.device(config.devices[rank])
        self.store_host, self.store_port = store_host, store_port

    def setup(self) -> None:
        super().setup()
        # Spawned workers inherit every core's worth of threads; N of them oversubscribe the CPU,
        # and on GPUs that CPU is what launches kernels and feeds the loaders.
        torch.set_num_threads(threads_per_process(self.config))
        if dist.is_initialized():
            return  # torchrun started this process and it has joined torchrun's world already
        backend = "nccl" if self.input_device.type == "cuda" else "gloo"
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
                                device_id=self.input_device if self.input_device.type == "cuda" else None)

    @staticmethod
    def memory_placement(plan) -> list:
        """A full replica per process on its share of the batch, and DDP's gradient buckets
        (bucket_cap_mb 25, together as large as the gradients) for the all-reduce."""
        devices = []
        for label in plan.labels():
            device = plan.whole(label, plan.config.per_device_batch)
            device.comm = device.gradients
            devices.append(device)
        return devices

    def wrap(self, model: nn.Module) -> nn.Module:
        model = model.to(self.input_device)
        ids = [self.input_device.index] if self.input_device.type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids)
        ddp.register_comm_hook(None, self.rank_clock.allreduce_hook)  # the same all-reduce, timed
        self.rank_clock.watch_forward_sync(ddp)
        return ddp

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module

    def no_grad_sync(self, model: nn.Module):
        return model.no_sync()

    def train_sampler(self, dataset_len: int, seed: int) -> Sampler:
        # DistributedSampler only needs len(); pads the last shard so every rank takes the same
        # number of steps (DDP's all-reduce needs that).
        return DistributedSampler(
            range(dataset_len), num_replicas=self.world_size, rank=self.rank, shuffle=True, seed=seed
        )

    def val_indices(self, dataset_len: int) -> Iterable[int]:
        # Strided shards with no padding: each validation image is counted exactly once. Evaluation
        # runs on the unwrapped module, so unequal shard lengths need no matching collectives.
        return range(self.rank, dataset_len, self.world_size)

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
        dist.all_reduce(tensor, op=reduce_op)
        return tensor

    def barrier(self) -> None:
        if self.input_device.type == "cuda":
            dist.barrier(device_ids=[self.input_device.index])  # NCCL's barrier is an all-reduce on a device
        else:
            dist.barrier()

    def sync_buffers(self, model: nn.Module) -> None:
        # Each rank updated BatchNorm statistics with its own last batch; take rank 0's, which is
        # what the checkpoint saves, so the validation numbers describe the saved model.
        for buffer in self.unwrap(model).buffers():
            dist.broadcast(buffer, src=0)

    def teardown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        self._store = None  # a world of one stops serving its store here
