"""Test plugin (PARALLAX_PLUGINS=tests.plugins.failing_model): timm-registered models that fail
on purpose — inside DDP rank 1 on its second step, in rank 1's second epoch of a torchrun job's
first attempt (whose first epoch it holds a second), or with CUDA's out-of-memory error — to check
how a crash is recorded."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from timm.models import register_model
from torch import nn

from tests.plugins.tiny_net import TinyNet

FAILURE = "deliberate failure in rank 1 (test plugin)"


class FailsOnRank1(TinyNet):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.steps = 0

    def forward(self, x):
        if self.training:
            self.steps += 1
            if dist.is_initialized() and dist.get_rank() == 1 and self.steps == 2:
                raise RuntimeError(FAILURE)
        return super().forward(x)


@register_model
def parallax_fails_on_rank1(pretrained: bool = False, **kwargs) -> nn.Module:
    return FailsOnRank1(**kwargs)


class RunsOutOfMemory(FailsOnRank1):
    """Raises the error CUDA raises when a batch does not fit, on the first training step."""

    def forward(self, x):
        if self.training:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (test plugin)")
        return TinyNet.forward(self, x)  # not FailsOnRank1's, which fails on its own terms


@register_model
def parallax_out_of_memory(pretrained: bool = False, **kwargs) -> nn.Module:
    return RunsOutOfMemory(**kwargs)


class FailsOnRank1InEpoch2Once(FailsOnRank1):
    """Under torchrun: rank 1 fails in its second epoch on the job's first attempt only, so a job
    started with --max-restarts 1 fails once and then finishes. The first attempt's first epoch
    lasts at least EPOCH1_S (its ranks wait at its start), so a sampler at a fraction of that has
    sampled it several times however fast or loaded the machine is."""

    EPOCH1_S = 1.0

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.epochs_started = 0

    def train(self, mode: bool = True):
        if mode:
            self.epochs_started += 1  # the training loop switches to train mode once per epoch
            if self.epochs_started == 1 and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
                time.sleep(self.EPOCH1_S)
        return super().train(mode)

    def forward(self, x):
        if (self.training and self.epochs_started == 2 and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0"
                and dist.is_initialized() and dist.get_rank() == 1):
            raise RuntimeError(FAILURE)
        return TinyNet.forward(self, x)  # not FailsOnRank1's, which fails on its own terms


@register_model
def parallax_fails_in_epoch2_once(pretrained: bool = False, **kwargs) -> nn.Module:
    return FailsOnRank1InEpoch2Once(**kwargs)
