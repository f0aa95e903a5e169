"""Test plugin (PARALLAX_PLUGINS=tests.plugins.slow_last_stage): a tiny network of layers in sequence (so that mp
and pp split it), whose last layers queue ``GPU_SLEEP_CYCLES`` of sleep on their GPU's stream at each training
step: the last stage's work ends long after the host has queued it, so a host read of its results guarded by an
event on another GPU's stream (the first stage's, the current device under mp) comes before they land, every
time, rather than only when a race is lost.

    PARALLAX_TEST_NAN_STEP=30   the training step (counted over the run, from 1) whose output is NaN (0: none)
"""

from __future__ import annotations

import os

import torch
from timm.models import register_model
from torch import nn

GPU_SLEEP_CYCLES = 50_000_000  # about 30 ms on a GPU at 1.5-2 GHz


class GpuSleep(nn.Module):
    def forward(self, x):
        if self.training and x.is_cuda:
            with torch.cuda.device(x.device):
                torch.cuda._sleep(GPU_SLEEP_CYCLES)
        return x


class NanAtStep(nn.Module):
    def __init__(self):
        super().__init__()
        self.steps = 0

    def forward(self, x):
        if self.training and torch.is_grad_enabled() and x.device.type != "meta" and x.shape[0] > 2:
            self.steps += 1
            if self.steps == int(os.environ.get("PARALLAX_TEST_NAN_STEP", "0")):
                x = x * float("nan")
        return x


class SlowLastStage(nn.Sequential):
    def __init__(self, num_classes: int = 10, in_chans: int = 3, **_):
        super().__init__(nn.Conv2d(in_chans, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, num_classes), GpuSleep(), NanAtStep())


@register_model
def parallax_slow_last_stage(pretrained: bool = False, **kwargs) -> nn.Module:
    return SlowLastStage(**kwargs)
