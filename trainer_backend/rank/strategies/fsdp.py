"""``fsdp``: FSDP2, parameters, gradients and optimizer state sharded over the processes."""

from __future__ import annotations

from torch import nn

from contract.config import RunConfig
from trainer_backend.rank.models import flatten_sequential
from trainer_backend.rank.strategies import placements
from trainer_backend.rank.strategies.base import Strategy
from trainer_backend.rank.strategies.checkpoints import Sharded
from trainer_backend.rank.strategies.data_shards import ShardedModel
from trainer_backend.rank.strategies.process_group import ProcessGroup
from trainer_backend.rank.strategies.replica_sync import ShardedReplicas


class FullyShardedStrategy(Strategy):
    """FSDP2: ``fully_shard`` on every block and on the root, over a 1-D device mesh."""

    name = "fsdp"
    comm_measure = "hook"
    memory_placement = staticmethod(placements.sharded)

    def __init__(self, config: RunConfig, rank: int = 0, *, store_host: str = "", store_port: int = 0, **given):
        super().__init__(config, rank, **given)
        self.group = ProcessGroup(config, rank, self.input_device, store_host, store_port)
        self.shards = ShardedModel(rank, self.world_size)
        self.sync = ShardedReplicas()
        self.checkpoints = Sharded(self.is_main)

    def wrap(self, model: nn.Module) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        model = model.to(self.input_device)
        mesh = init_device_mesh(self.input_device.type, (self.world_size,))
        blocks = sharded_blocks(model)
        for block in blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        self.rank_clock.watch_fsdp(model, blocks)  # the gathers and reduce-scatters happen in FSDP's hooks
        return model  # fully_shard changes the module in place


def sharded_blocks(model: nn.Module) -> list[nn.Module]:
    """The units FSDP shards one by one: the model's sequential layers that hold parameters."""
    return [layer for layer in flatten_sequential(model) if any(True for _ in layer.parameters())]
