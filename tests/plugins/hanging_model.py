"""Test plugin (PARALLAX_PLUGINS=tests.plugins.hanging_model): a timm-registered model whose DDP
rank 1 stops in the first training step of epoch 2 and never comes back, as a deadlocked or
stalled process would, to check how a hang in a collective ends the run."""

from __future__ import annotations

import time

import torch.distributed as dist
from timm.models import register_model
from torch import nn

from tests.plugins.tiny_net import TinyNet


class HangsOnRank1(TinyNet):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.epochs_started = 0

    def train(self, mode: bool = True):
        self.epochs_started += mode  # the training loop switches to train mode once per epoch
        return super().train(mode)

    def forward(self, x):
        if self.training and self.epochs_started >= 2 and dist.is_initialized() and dist.get_rank() == 1:
            while True:
                time.sleep(60)
        return super().forward(x)


@register_model
def parallax_hangs_on_rank1(pretrained: bool = False, **kwargs) -> nn.Module:
    return HangsOnRank1(**kwargs)
