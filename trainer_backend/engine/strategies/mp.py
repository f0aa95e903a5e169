"""``mp``: naive model parallel, the model's layers in stages over devices, one process."""

from __future__ import annotations

import torch
from torch import nn

from contract.config import RunConfig
from trainer_backend.engine.models import StagedModel, split_into_stages
from trainer_backend.engine.strategies.base import Strategy


class ModelParallelStrategy(Strategy):
    name = "mp"

    @classmethod
    def create(cls, config: RunConfig, rank: int = 0, *, in_chans: int = 3, store_host: str = "",
               store_port: int = 0) -> Strategy:
        return cls(config, rank, in_chans=in_chans)

    def __init__(self, config: RunConfig, rank: int = 0, *, in_chans: int = 3):
        super().__init__(config, rank)
        self.stage_devices = [torch.device(d) for d in config.devices]
        self.input_device, self.output_device = self.stage_devices[0], self.stage_devices[-1]
        self.in_chans = in_chans

    @property
    def devices(self) -> list[torch.device]:
        return list(dict.fromkeys(self.stage_devices))

    @staticmethod
    def memory_placement(plan) -> list:
        """Stage i (its layers' parameters, gradients, optimizer state) on device i, each training
        on the whole batch; stages sharing one device (CPU) are one step of the whole model."""
        config = plan.config
        if len(set(config.devices)) == 1:
            return [plan.whole(config.devices[0], config.batch_size)]
        # One process: its thread crops the batches on the first stage's GPU.
        return [plan.stage_memory(label, i, config.batch_size, takes_input=i == 0)[0]
                for i, label in enumerate(config.devices)]

    def wrap(self, model: nn.Module) -> nn.Module:
        stages = split_into_stages(
            model, len(self.stage_devices), in_chans=self.in_chans,
            image_size=self.config.image_size, name=self.config.model,
        )
        return StagedModel(stages, self.stage_devices, source=model)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model  # StagedModel runs the stages in order; its source holds timm's names

    def checkpoint_module(self, model: nn.Module) -> nn.Module:
        return model.source
