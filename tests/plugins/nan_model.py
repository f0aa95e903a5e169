"""Test plugin (PARALLAX_PLUGINS=tests.plugins.nan_model): a tiny network whose training loss turns NaN at a
chosen step, to check what ``--on-nonfinite`` does with it.

    PARALLAX_TEST_NAN_STEP=30   the training step (counted over the run, from 1) whose logits are NaN
    PARALLAX_TEST_NAN_RANK=1    on which rank (default 0)

Only that one step's output is NaN: under ``skip`` the next steps are finite again, under ``warn`` the NaN
gradients it leaves in the weights keep every later loss NaN."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from timm.models import register_model
from torch import nn

from tests.plugins.tiny_net import TinyNet


class NanAtStep(TinyNet):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.steps = 0

    def forward(self, x):
        out = super().forward(x)
        # A training step's forward: not validation, nor the FLOP count's or the estimate's batch of two.
        if self.training and torch.is_grad_enabled() and x.device.type != "meta" and x.shape[0] > 2:
            self.steps += 1
            rank = dist.get_rank() if dist.is_initialized() else 0
            if (self.steps == int(os.environ.get("PARALLAX_TEST_NAN_STEP", "30"))
                    and rank == int(os.environ.get("PARALLAX_TEST_NAN_RANK", "0"))):
                out = out * float("nan")
        return out


@register_model
def parallax_nan_at_step(pretrained: bool = False, **kwargs) -> nn.Module:
    return NanAtStep(**kwargs)
