"""Test plugin (PARALLAX_PLUGINS=tests.plugins.sleeping_model): a timm-registered model that
spends each training step asleep, for tests that need a run to go on while they act on it (cancel
it, kill a rank or the dashboard, lock the database, fill the log's disk), or only need a run to
exist. Its epochs pass at a steady pace, about STEP_S per step, whatever else loads the machine,
and cost next to no CPU: a real model would burn a core for as long as the test waits."""

from __future__ import annotations

import time

from timm.models import register_model
from torch import nn

STEP_S = 0.05


class SleepsEachStep(nn.Module):
    def __init__(self, num_classes: int = 10, in_chans: int = 3, **_):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(in_chans, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(8, num_classes)

    def forward(self, x):
        if self.training:
            time.sleep(STEP_S)
        return self.head(self.body(x))


@register_model
def parallax_sleeps_each_step(pretrained: bool = False, **kwargs) -> nn.Module:
    return SleepsEachStep(**kwargs)
