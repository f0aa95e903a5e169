"""A loader's batch -> the model's input, on the device: normalise, augment, memory format.

The loader hands over pixels as stored (uint8, a quarter of float32's bytes, pinned on CUDA);
everything that makes floats of them happens here, once per batch, on the device the model
reads from. Every strategy's loops (training, validation, BatchNorm re-estimation, the
pipeline's own) reach it through ``Strategy.to_device``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from trainer_backend.rank.augment import STORED_CROP_AREA, BatchAugment, centre_crop, random_resized_crop
from contract.config import RunConfig


def device_augmentations(config: RunConfig) -> tuple[tuple[str, ...], bool]:
    """The augmentations a run applies to its training batches on the device, and whether it crops
    them from a larger stored size (the random-resized crop, which then stands for "crop")."""
    names = () if config.augment == "none" else tuple(config.augment.split(","))
    cropping = config.stored_size > config.image_size
    if cropping:  # the crop from the stored size is the random-resized crop; another would crop twice
        names = tuple(name for name in names if name != "crop")
    return names, cropping


def crops_on_device(config: RunConfig) -> bool:
    """Whether the run crops its batches on the device: ``affine_grid``, a matrix product, in the thread
    that takes them (which the memory estimate counts a cuBLAS workspace for)."""
    names, cropping = device_augmentations(config)
    return cropping or "crop" in names


class DeviceInputs:
    """``train_size`` (set when the cache stores images larger than they train at): training
    batches get a random-resized crop to it (timm's defaults), validation batches a centre crop."""

    def __init__(self, normalise: Callable[[torch.Tensor], torch.Tensor], device: torch.device, *,
                 augment: BatchAugment | None = None, channels_last: bool = False, train_size: int | None = None,
                 crop_generator: torch.Generator | None = None):
        self.normalise, self.device, self.augment, self.channels_last = normalise, device, augment, channels_last
        self.train_size, self.crop_generator = train_size, crop_generator

    @classmethod
    def for_run(cls, config: RunConfig, normalise, device: torch.device, rank: int = 0) -> DeviceInputs:
        names, cropping = device_augmentations(config)
        # Each rank draws its own augmentations; one seed per rank keeps a run repeatable.
        augment = BatchAugment(names, seed=config.seed + rank, device=device) if names else None
        generator = None
        if cropping:
            generator = torch.Generator(device=device)
            generator.manual_seed(config.seed + rank)
        return cls(normalise, device, augment=augment, channels_last=config.channels_last,
                   train_size=config.image_size if cropping else None, crop_generator=generator)

    def generator_states(self) -> list[torch.Tensor]:
        """Where the augmentation and crop generators are in their draws (CPU tensors), for a resume point: a
        resumed epoch then draws what an uninterrupted one would."""
        return [generator.get_state() for generator in self._generators()]

    def set_generator_states(self, states: list[torch.Tensor]) -> None:
        generators = self._generators()
        if len(states) == len(generators):  # a resume point of the same run: the same augmentations
            for generator, state in zip(generators, states):
                generator.set_state(state)

    def _generators(self) -> list[torch.Generator]:
        return [g for g in (self.augment.generator if self.augment is not None else None, self.crop_generator)
                if g is not None]

    def __call__(self, pixels: torch.Tensor, *, train: bool = False) -> torch.Tensor:
        images = self.normalise(pixels.to(self.device, non_blocking=True))
        if self.train_size is not None:
            images = (random_resized_crop(images, self.crop_generator, area=STORED_CROP_AREA, size=self.train_size)
                      if train else centre_crop(images, self.train_size))
        if train and self.augment is not None:
            images = self.augment(images)
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images
