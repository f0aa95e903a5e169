"""Every strategy Parallax trains with, by name: the one place a name becomes the class that runs it.

    strategy_class("ddp")                    # DistributedStrategy
    make_strategy(config, rank, in_chans=3, store_host="127.0.0.1", store_port=29500)

The class is the one the strategy's spec names (``contract.strategy_specs``, torch-free, what the
dashboard and the CLI offer), imported when first asked for: torch.distributed.pipelining is imported
by pipelines only. An unknown name fails with the names allowed, never falls back to another strategy.
"""

from __future__ import annotations

import importlib

from contract.config import RunConfig
from contract.strategy_specs import spec
from trainer_backend.rank.strategies.base import Strategy


def strategy_class(name: str) -> type[Strategy]:
    """The class that runs strategy ``name``; ValueError naming the strategies there are for any other name."""
    module, _, class_name = spec(name).implementation.partition(":")
    return getattr(importlib.import_module(module), class_name)


def make_strategy(config: RunConfig, rank: int = 0, *, in_chans: int = 3, store_host: str = "",
                  store_port: int = 0) -> Strategy:
    """The strategy of ``config`` for ``rank`` (the store is where distributed ranks meet)."""
    return strategy_class(config.strategy)(config, rank, in_chans=in_chans, store_host=store_host,
                                           store_port=store_port)
