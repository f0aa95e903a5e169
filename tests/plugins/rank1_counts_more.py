"""Test plugin (PARALLAX_PLUGINS=tests.plugins.rank1_counts_more): validation as two ranks' different
cuDNN kernels could see it. Every rank's count of correct images is pinned to 100 (no epoch after
the first improves on it), and from epoch 2 on rank 1 counts one more: on its own numbers rank 1
alone would find epoch 2 better and start gathering the full state dict (a collective)."""

from __future__ import annotations

import trainer_backend.rank.trainer as trainer

_validate = trainer.validate
_calls = {"n": 0}


def validate(model, loader, strategy, **kwargs):
    totals = _validate(model, loader, strategy, **kwargs)
    _calls["n"] += 1
    totals[1] = 100 + (1 if strategy.rank == 1 and _calls["n"] >= 2 else 0)
    return totals


trainer.validate = validate
