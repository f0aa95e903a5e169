"""Parallel strategies: one small class each, behind one protocol, one module each.

A strategy owns what differs between single-device, DataParallel, DistributedDataParallel,
model-parallel, pipeline and fully sharded training: where inputs and labels go, how the model is
wrapped, how the data is sharded, and how numbers are summed across processes. Where a collective does
not apply (one process), it is a no-op, so the training loop has no strategy branches. These modules
know devices and collectives only: the loops (``engine.loop``) run steps over a strategy, never the
reverse.

    base      Strategy (``single``) and what every strategy shares
    dp        DataParallelStrategy          ddp   DistributedStrategy
    mp        ModelParallelStrategy         fsdp  FullyShardedStrategy (FSDP2)
    pp        PipelineStrategy (torch.distributed.pipelining; imported only by pipelines)
    registry  strategy name -> the class its spec names (contract.strategy_specs), and ``make_strategy``
"""

from trainer_backend.engine.strategies.base import (
                                                    COLLECTIVE_TIMEOUT_ENV,
                                                    DEFAULT_COLLECTIVE_TIMEOUT_S,
                                                    RENDEZVOUS_TIMEOUT,
                                                    Strategy,
                                                    autocast,
                                                    collective_timeout,
                                                    on_cpu,
                                                    synchronize,
)
from trainer_backend.engine.strategies.ddp import DistributedStrategy
from trainer_backend.engine.strategies.dp import AutocastDataParallel, DataParallelStrategy
from trainer_backend.engine.strategies.fsdp import FullyShardedStrategy, sharded_blocks
from trainer_backend.engine.strategies.mp import ModelParallelStrategy

__all__ = ["COLLECTIVE_TIMEOUT_ENV", "DEFAULT_COLLECTIVE_TIMEOUT_S", "RENDEZVOUS_TIMEOUT", "AutocastDataParallel",
           "DataParallelStrategy", "DistributedStrategy", "FullyShardedStrategy", "ModelParallelStrategy", "Strategy",
           "autocast", "collective_timeout", "on_cpu", "sharded_blocks", "synchronize"]
