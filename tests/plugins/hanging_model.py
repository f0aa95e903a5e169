"""Test plugin (PARALLAX_PLUGINS=tests.plugins.hanging_model): a timm-registered model whose DDP
rank 1 stops in the first training step of epoch 2 and never comes back, as a deadlocked or
stalled process would, to check how a hang in a collective ends the run."""

from __future__ import annotations

import time

import torch.distributed as dist
from timm.models import register_model
from torch import nn


class HangsOnRank1(nn.Module):
    def __init__(self, num_classes: int = 10, in_chans: int = 3, **_):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(in_chans, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(8, num_classes)
        self.epochs_started = 0

    def train(self, mode: bool = True):
        self.epochs_started += mode  # the training loop switches to train mode once per epoch
        return super().train(mode)

    def forward(self, x):
        if self.training and self.epochs_started >= 2 and dist.is_initialized() and dist.get_rank() == 1:
            while True:
                time.sleep(60)
        return self.head(self.body(x))


@register_model
def parallax_hangs_on_rank1(pretrained: bool = False, **kwargs) -> nn.Module:
    return HangsOnRank1(**kwargs)
