"""Test plugin (PARALLAX_PLUGINS=tests.plugins.stop_asking_model): a timm-registered model whose rank 1, in a
torchrun job's first attempt, asks the job to stop (as the Slurm batch script does on USR1: engine/stopping.py)
at its ``ASK_AT``-th training step of epoch 2."""

from __future__ import annotations

import os

import torch.distributed as dist
from timm.models import register_model
from torch import nn

from contract.environment import parallax_home
from trainer_backend.engine.stopping import STOP_FILE
from tests.plugins.tiny_net import TinyNet

ASK_AT = 7


class AsksToStopInEpoch2(TinyNet):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.epochs_started = self.steps = 0

    def train(self, mode: bool = True):
        if mode:
            self.epochs_started += 1  # the training loop switches to train mode once per epoch
            self.steps = 0
        return super().train(mode)

    def forward(self, x):
        if self.training:
            self.steps += 1
            if (self.epochs_started == 2 and self.steps == ASK_AT and dist.is_initialized() and dist.get_rank() == 1
                    and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0"):
                (folder,) = [p for p in (parallax_home() / "runs").rglob("run-*") if p.is_dir()]
                (folder / STOP_FILE).touch()
        return super().forward(x)


@register_model
def parallax_asks_stop_in_epoch2(pretrained: bool = False, **kwargs) -> nn.Module:
    return AsksToStopInEpoch2(**kwargs)
