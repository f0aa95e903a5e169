"""Parallel strategies: one small class each, behind one protocol, one module each.

A strategy owns what differs between single-device, DataParallel, DistributedDataParallel,
model-parallel, pipeline and fully sharded training: where inputs and labels go, how the model is
wrapped, how a step and an evaluation run, and how numbers are summed across processes. Where a
collective does not apply (one process), it is a no-op, so the training loop has no strategy branches.
These modules know devices and collectives only: the loops (``rank.loop``) run steps over a strategy,
never the reverse.

    base           Strategy (``single``): nine methods, and what every strategy shares (autocast, optimizer_step)
    dp             DataParallelStrategy          ddp   DistributedStrategy
    mp             ModelParallelStrategy         fsdp  FullyShardedStrategy (FSDP2)
    pp             PipelineStrategy (torch.distributed.pipelining; imported only by pipelines)
    registry       strategy name -> the class its spec names (contract.strategy_specs), and ``make_strategy``
    The helpers a strategy owns, one job each:
    process_group  the run's process group (ddp, fsdp and pp share it), or a group of one; collective_timeout
    data_shards    which data each process reads
    replica_sync   gradient reduction deferred, the gradient norm clipped, buffers shared; ``unwrap``
    checkpoints    the checkpoint's and the resume point's state, gathered on rank 0
    placements     where the estimate before launch puts the run's memory (rank/forecast/)
"""

from trainer_backend.rank.strategies.base import Step, Strategy, autocast, optimizer_step, synchronize
from trainer_backend.rank.strategies.checkpoints import on_cpu
from trainer_backend.rank.strategies.ddp import DistributedStrategy
from trainer_backend.rank.strategies.dp import AutocastDataParallel, DataParallelStrategy
from trainer_backend.rank.strategies.fsdp import FullyShardedStrategy, sharded_blocks
from trainer_backend.rank.strategies.mp import ModelParallelStrategy
from trainer_backend.rank.strategies.process_group import (COLLECTIVE_TIMEOUT_ENV, DEFAULT_COLLECTIVE_TIMEOUT_S,
                                                             RENDEZVOUS_TIMEOUT, collective_timeout)
from trainer_backend.rank.strategies.replica_sync import unwrap

__all__ = ["COLLECTIVE_TIMEOUT_ENV", "DEFAULT_COLLECTIVE_TIMEOUT_S", "RENDEZVOUS_TIMEOUT", "AutocastDataParallel",
           "DataParallelStrategy", "DistributedStrategy", "FullyShardedStrategy", "ModelParallelStrategy", "Step",
           "Strategy", "autocast", "collective_timeout", "on_cpu", "optimizer_step", "sharded_blocks", "synchronize",
           "unwrap"]
