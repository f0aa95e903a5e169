"""Test plugin (PARALLAX_PLUGINS=tests.plugins.sleeping_model): a timm-registered model that
spends each training step asleep, for tests that need a run to go on while they act on it (cancel
it, kill a rank or the dashboard, lock the database, fill the log's disk), or only need a run to
exist. Its epochs pass at a steady pace, about STEP_S per step, whatever else loads the machine,
and cost next to no CPU: a real model would burn a core for as long as the test waits. While the file that
PARALLAX_TEST_SLOW_WHILE names exists, each step takes SLOW_STEP_S instead: a run that must still be going when a
busy machine's test gets round to acting on it, and fast again once the test has acted."""

from __future__ import annotations

import os
import time

from timm.models import register_model
from torch import nn

from tests.plugins.tiny_net import TinyNet

STEP_S = 0.05
SLOW_STEP_S = 0.5
SLOW_WHILE = "PARALLAX_TEST_SLOW_WHILE"


def step_s() -> float:
    held = os.environ.get(SLOW_WHILE)
    return SLOW_STEP_S if held and os.path.exists(held) else STEP_S


class SleepsEachStep(TinyNet):
    def forward(self, x):
        if self.training:
            time.sleep(step_s())
        return super().forward(x)


@register_model
def parallax_sleeps_each_step(pretrained: bool = False, **kwargs) -> nn.Module:
    return SleepsEachStep(**kwargs)
