"""``mp``: naive model parallel, the model's layers in stages over devices, one process."""

from __future__ import annotations

import torch
from torch import nn

from contract.config import RunConfig
from trainer_backend.rank.models import StagedModel, split_into_stages
from trainer_backend.rank.strategies import placements
from trainer_backend.rank.strategies.base import Strategy
from trainer_backend.rank.strategies.checkpoints import WholeModel


class ModelParallelStrategy(Strategy):
    name = "mp"
    memory_placement = staticmethod(placements.model_stages)

    def __init__(self, config: RunConfig, rank: int = 0, *, in_chans: int = 3, **given):
        super().__init__(config, rank, **given)
        self.stage_devices = [torch.device(d) for d in config.devices]
        self.input_device, self.output_device = self.stage_devices[0], self.stage_devices[-1]
        self.devices = list(dict.fromkeys(self.stage_devices))
        self.in_chans = in_chans
        # StagedModel runs the stages in order; its source holds timm's names, which a checkpoint keeps.
        self.checkpoints = WholeModel(self.is_main, named=lambda model: model.source)

    def wrap(self, model: nn.Module) -> nn.Module:
        stages = split_into_stages(
            model, len(self.stage_devices), in_chans=self.in_chans,
            image_size=self.config.image_size, name=self.config.model,
        )
        return StagedModel(stages, self.stage_devices, source=model)
