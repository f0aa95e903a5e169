"""Test plugin (PARALLAX_PLUGINS=tests.plugins.sleeping_model): a timm-registered model that
spends each training step asleep, for tests that need a run to go on while they act on it (cancel
it, kill a rank or the dashboard, lock the database, fill the log's disk), or only need a run to
exist. Its epochs pass at a steady pace, about STEP_S per step, whatever else loads the machine,
and cost next to no CPU: a real model would burn a core for as long as the test waits."""

from __future__ import annotations

import time

from timm.models import register_model
from torch import nn

from tests.plugins.tiny_net import TinyNet

STEP_S = 0.05


class SleepsEachStep(TinyNet):
    def forward(self, x):
        if self.training:
            time.sleep(STEP_S)
        return super().forward(x)


@register_model
def parallax_sleeps_each_step(pretrained: bool = False, **kwargs) -> nn.Module:
    return SleepsEachStep(**kwargs)
