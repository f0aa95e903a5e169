"""Test plugin (PARALLAX_PLUGINS=tests.plugins.stop_asking_model): a timm-registered model that, in a torchrun
job's first attempt, asks the job to stop (as the Slurm batch script does on USR1: rank/stopping.py) at its
``PARALLAX_TEST_ASK_AT``-th training forward. The asking layer comes first, so that it runs in every strategy
(under pp, on the first stage, once per microbatch)."""

from __future__ import annotations

import os

from timm.models import register_model
from torch import nn

from contract.environment import parallax_home
from trainer_backend.rank.stopping import STOP_FILE
from tests.plugins.tiny_net import TinyNet


class AsksToStop(nn.Module):
    def __init__(self):
        super().__init__()
        self.forwards = 0

    def forward(self, x):
        if self.training and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
            self.forwards += 1
            if self.forwards == int(os.environ["PARALLAX_TEST_ASK_AT"]):
                # This run's folder: the one whose rank 0 started last (a home may hold other runs' folders).
                pids = list((parallax_home() / "runs").rglob("run-*/rank0.pid"))
                folder = max(pids, key=lambda pid: pid.stat().st_mtime).parent
                (folder / STOP_FILE).touch()
        return x


class AsksToStopNet(TinyNet):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.body.insert(0, AsksToStop())


@register_model
def parallax_asks_to_stop(pretrained: bool = False, **kwargs) -> nn.Module:
    return AsksToStopNet(**kwargs)
