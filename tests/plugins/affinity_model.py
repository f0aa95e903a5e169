"""Test plugin (PARALLAX_PLUGINS=tests.plugins.affinity_model): a timm-registered model that, at its first
training forward, writes the CPU cores its process may run on (``os.sched_getaffinity``) to
``$PARALLAX_TEST_AFFINITY_DIR/rank<RANK>.json``, for a test to see what Slurm gave each rank."""

from __future__ import annotations

import json
import os
from pathlib import Path

from timm.models import register_model
from torch import nn

from tests.plugins.tiny_net import TinyNet


class ReportsAffinity(TinyNet):
    reported = False

    def forward(self, x):
        if self.training and not self.reported:
            self.reported = True
            path = Path(os.environ["PARALLAX_TEST_AFFINITY_DIR"], f"rank{os.environ.get('RANK', '0')}.json")
            path.write_text(json.dumps({"cores": sorted(os.sched_getaffinity(0)),
                                        "node": os.environ.get("SLURMD_NODENAME")}))
        return super().forward(x)


@register_model
def parallax_reports_affinity(pretrained: bool = False, **kwargs) -> nn.Module:
    return ReportsAffinity(**kwargs)
