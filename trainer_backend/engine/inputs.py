"""A loader's batch -> the model's input, on the device: normalise, augment, memory format.

The loader hands over pixels as stored (uint8, a quarter of float32's bytes, pinned on CUDA);
everything that makes floats of them happens here, once per batch, on the device the model
reads from. Every strategy's loops (training, validation, BatchNorm re-estimation, the
pipeline's own) reach it through ``Strategy.to_device``.
"""

from __future__ import annotations

from typing import Callable

import torch

from trainer_backend.engine.augment import BatchAugment
from trainer_backend.contract.config import RunConfig


class DeviceInputs:
    def __init__(self, normalise: Callable[[torch.Tensor], torch.Tensor], device: torch.device, *,
                 augment: BatchAugment | None = None, channels_last: bool = False):
        self.normalise, self.device, self.augment, self.channels_last = normalise, device, augment, channels_last

    @classmethod
    def for_run(cls, config: RunConfig, normalise, device: torch.device, rank: int = 0) -> DeviceInputs:
        names = () if config.augment == "none" else tuple(config.augment.split(","))
        # Each rank draws its own augmentations; one seed per rank keeps a run repeatable.
        augment = BatchAugment(names, seed=config.seed + rank, device=device) if names else None
        return cls(normalise, device, augment=augment, channels_last=config.channels_last)

    def __call__(self, pixels: torch.Tensor, *, train: bool = False) -> torch.Tensor:
        images = self.normalise(pixels.to(self.device, non_blocking=True))
        if train and self.augment is not None:
            images = self.augment(images)
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images
