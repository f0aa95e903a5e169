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
                        aspect: tuple[float, float] = CROP_ASPECT) -> torch.Tensor:
    """Each image: a random box of ``area`` of the image at an aspect ratio in ``aspect``, lying
    wholly inside the image, resized back to the image's size (bilinear)."""
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
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)
