"""Every strategy Parallax trains with, by name: the one place a name becomes the class that runs it.

    strategy_class("ddp")                    # DistributedStrategy
    make_strategy(config, rank, in_chans=3, store_host="127.0.0.1", store_port=29500)

An unknown name fails with the names allowed, never falls back to another strategy. The names and their
descriptions are the config's (``STRATEGIES``, torch-free, what the dashboard and the CLI offer).
"""

from __future__ import annotations

from trainer_backend.contract.config import STRATEGIES, RunConfig
from trainer_backend.engine.strategies import (
    DataParallelStrategy,
    DistributedStrategy,
    FullyShardedStrategy,
    ModelParallelStrategy,
    Strategy,
)

CLASSES: dict[str, type[Strategy]] = {"single": Strategy, "dp": DataParallelStrategy, "ddp": DistributedStrategy,
                                      "mp": ModelParallelStrategy, "fsdp": FullyShardedStrategy}


def strategy_class(name: str) -> type[Strategy]:
    """The class that runs strategy ``name``; ValueError naming the strategies there are for any other name."""
    if name == "pp":
        from trainer_backend.engine.strategies.pp import (
            PipelineStrategy,  # torch.distributed.pipelining: imported by pipelines only
        )

        return PipelineStrategy
    if name not in CLASSES:
        raise ValueError(f"unknown strategy {name[:40]!r}: use one of {', '.join(STRATEGIES)}")
    return CLASSES[name]


def make_strategy(config: RunConfig, rank: int = 0, *, in_chans: int = 3, store_host: str = "",
                  store_port: int = 0) -> Strategy:
    """The strategy of ``config`` for ``rank`` (the store is where distributed ranks meet)."""
    return strategy_class(config.strategy).create(config, rank, in_chans=in_chans, store_host=store_host,
                                                  store_port=store_port)
