"""Training-batch augmentation on the device, a whole batch per call.

    augment = BatchAugment(("flip", "crop"), seed=0, device=torch.device("cuda:0"))
    images = augment(images)          # (N, C, H, W) float, same shape, labels untouched

Done per batch on the device rather than per image in the loader, so the cached loader stays a
single gather: a random horizontal flip is one ``torch.where`` over a per-image mask, and a
random-resized crop is one ``affine_grid`` + ``grid_sample`` with a per-image scale and shift.
Random numbers come from the augmentation's own generator on the device (no host sync, and the
loader's shuffle and the model's initialisation are the same with or without augmentation).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# torchvision's RandomResizedCrop samples 8-100 % of the area; at the 8-64 px this engine often
# trains at, a crop below about a third of the image keeps too few pixels of the object.
CROP_AREA = (0.35, 1.0)
CROP_ASPECT = (3 / 4, 4 / 3)
# From a stored size larger than the training size (ImageNet recipes): timm's defaults, crops of
# 8-100 % of the area for training, and for validation the centre 87.5 % of the side.
STORED_CROP_AREA = (0.08, 1.0)
CENTRE_CROP_FRACTION = 0.875


class BatchAugment:
    """The augmentations named in ``names`` (any of "flip", "crop"), applied in that order."""

    def __init__(self, names: tuple[str, ...], *, seed: int, device: torch.device):
        self.names = tuple(names)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        for name in self.names:
            images = random_flip(images, self.generator) if name == "flip" else random_resized_crop(images, self.generator)
        return images


def random_flip(images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Each image mirrored left-right with probability 1/2."""
    flip = torch.rand(len(images), device=images.device, generator=generator) < 0.5
    return torch.where(flip.view(-1, 1, 1, 1), images.flip(-1), images)


def random_resized_crop(images: torch.Tensor, generator: torch.Generator | None = None,
                        area: tuple[float, float] = CROP_AREA,
                        aspect: tuple[float, float] = CROP_ASPECT, size: int | None = None) -> torch.Tensor:
    """Each image: a random box of ``area`` of the image at an aspect ratio in ``aspect``, lying
    wholly inside the image, resized to ``size`` x ``size`` (default: the image's own size; bilinear)."""
    n, device = len(images), images.device

    def uniform(low: float, high: float) -> torch.Tensor:
        return torch.rand(n, device=device, generator=generator) * (high - low) + low

    box_area = uniform(*area)
    ratio = torch.exp(uniform(math.log(aspect[0]), math.log(aspect[1])))
    # Width and height as fractions of the image's; a box wider (or taller) than the image is cut
    # to it, which keeps every sample point inside.
    width = torch.sqrt(box_area * ratio).clamp(max=1.0)
    height = torch.sqrt(box_area / ratio).clamp(max=1.0)
    # Centres in affine_grid's [-1, 1] coordinates, so that the box [c - w, c + w] stays in [-1, 1].
    centre_x = (uniform(0.0, 1.0) * 2 - 1) * (1 - width)
    centre_y = (uniform(0.0, 1.0) * 2 - 1) * (1 - height)
    theta = torch.zeros(n, 2, 3, device=device, dtype=images.dtype)
    theta[:, 0, 0], theta[:, 0, 2] = width, centre_x
    theta[:, 1, 1], theta[:, 1, 2] = height, centre_y
    return sample_boxes(images, theta, size)


def centre_crop(images: torch.Tensor, size: int, fraction: float = CENTRE_CROP_FRACTION) -> torch.Tensor:
    """The centre ``fraction`` of each image's side, resized to ``size`` x ``size`` (timm's validation crop)."""
    # Shrinking by more than 2x would alias with plain bilinear sampling: average whole pixel blocks first.
    factor = int(fraction * images.shape[-1] // (2 * size))
    if factor > 1:
        images = F.avg_pool2d(images, factor)
    theta = torch.zeros(len(images), 2, 3, device=images.device, dtype=images.dtype)
    theta[:, 0, 0] = theta[:, 1, 1] = fraction
    return sample_boxes(images, theta, size)


def sample_boxes(images: torch.Tensor, theta: torch.Tensor, size: int | None) -> torch.Tensor:
    """Bilinear samples of each image's box (affine_grid's ``theta``) at ``size`` x ``size`` (default: its own).
    A training crop's box varies per image, so it is not smoothed first: a box over 2x the output
    aliases a little, as torchvision's tensor RandomResizedCrop without antialias does."""
    shape = list(images.shape) if size is None else [len(images), images.shape[1], size, size]
    grid = F.affine_grid(theta, shape, align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)
