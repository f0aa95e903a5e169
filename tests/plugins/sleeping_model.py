"""Test plugin (PARALLAX_PLUGINS=tests.plugins.sleeping_model): a timm-registered model that
spends each training step asleep, for tests that need a run to go on while they act on it (cancel
it, kill a rank or the dashboard, lock the database, fill the log's disk), or only need a run to
exist. Its epochs pass at a steady pace, about STEP_S per step, whatever else loads the machine,
and cost next to no CPU: a real model would burn a core for as long as the test waits. While the file that
PARALLAX_TEST_SLOW_WHILE names exists, each step takes SLOW_STEP_S more (under every strategy, model parallel's
stages included): a run that must still be going when a
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


def slow_while_held(module: nn.Module, _inputs) -> None:
    """Before the first layer's forward: model parallel runs the stages, never the model's own forward."""
    held = os.environ.get(SLOW_WHILE)
    if module.training and held and os.path.exists(held):
        time.sleep(SLOW_STEP_S)


class SleepsEachStep(TinyNet):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if os.environ.get(SLOW_WHILE):
            self.body[0].register_forward_pre_hook(slow_while_held)

    def forward(self, x):
        if self.training:
            time.sleep(STEP_S)
        return super().forward(x)


@register_model
def parallax_sleeps_each_step(pretrained: bool = False, **kwargs) -> nn.Module:
    return SleepsEachStep(**kwargs)
