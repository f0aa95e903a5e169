"""``ddp``: DistributedDataParallel, one process per device, gradients all-reduced."""

from __future__ import annotations

from torch import nn

from contract.config import RunConfig
from trainer_backend.rank.strategies import placements
from trainer_backend.rank.strategies.base import Strategy
from trainer_backend.rank.strategies.data_shards import RankShards
from trainer_backend.rank.strategies.process_group import ProcessGroup
from trainer_backend.rank.strategies.replica_sync import Replicas


class DistributedStrategy(Strategy):
    """One process per device, each with a full replica and its shard of every batch."""

    name = "ddp"
    comm_measure = "hook"
    memory_placement = staticmethod(placements.replicas)

    def __init__(self, config: RunConfig, rank: int = 0, *, store_host: str = "", store_port: int = 0, **given):
        super().__init__(config, rank, **given)
        self.group = ProcessGroup(config, rank, self.input_device, store_host, store_port)
        self.shards = RankShards(rank, self.world_size)
        self.sync = Replicas()

    def wrap(self, model: nn.Module) -> nn.Module:
        model = model.to(self.input_device)
        ids = [self.input_device.index] if self.input_device.type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids)
        ddp.register_comm_hook(None, self.rank_clock.allreduce_hook)  # the same all-reduce, timed
        self.rank_clock.watch_forward_sync(ddp)
        return ddp
