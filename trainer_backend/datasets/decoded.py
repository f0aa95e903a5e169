"""Pieces every dataset source shares: the decoded pool and batch resizing (and the error users see, from errors.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from trainer_backend.datasets.errors import DatasetError  # noqa: F401  (re-exported: the pools' users raise it)

# Images are summed and resized this many at a time, so a 60,000-image set never needs a
# float32 copy of itself in memory; large images go fewer at a time (CHUNK_FLOAT_BYTES).
CHUNK_IMAGES = 2048
CHUNK_FLOAT_BYTES = 64 * 2**20


@dataclass(frozen=True)
class DecodedPool:
    """Every image of a dataset, decoded once and resized, before the train/val split.

    ``images`` is (N, C, S, S): uint8 for 8-bit sources, float16 in [0, 1] for scaled ones.
    ``pixel_sums``/``pixel_sq_sums`` (N, C) float64 hold each image's per-channel sum of values
    and of squared values in [0, 1] units, so the mean/std of any split is a cheap sum. The last
    ``num_test`` images are the dataset's official test split. A cached pool's images are mapped
    read-only from ``path`` (cache.py); a pool just decoded in memory has no path.
    """

    images: torch.Tensor
    labels: torch.Tensor
    class_names: tuple[str, ...]
    warnings: tuple[str, ...]
    pixel_sums: torch.Tensor
    pixel_sq_sums: torch.Tensor
    num_test: int = 0
    path: Path | None = None


def make_pool(images: torch.Tensor, labels, class_names, warnings=()) -> DecodedPool:
    """Wrap decoded images with their labels and per-image channel sums."""
    labels = torch.as_tensor(labels, dtype=torch.int64)
    if images.dtype not in (torch.uint8, torch.float16) or images.dim() != 4:
        raise TypeError(f"images must be (N, C, H, W) uint8 or float16, got {images.dtype} {tuple(images.shape)}")
    if len(images) != len(labels):
        raise ValueError(f"{len(images)} images but {len(labels)} labels")
    sums, sq_sums = per_image_channel_sums(images)
    return DecodedPool(images.contiguous(), labels, tuple(class_names), tuple(warnings), sums, sq_sums)


def as_unit_float(images: torch.Tensor) -> torch.Tensor:
    """Stored pixels as float32 in [0, 1]."""
    if images.dtype == torch.uint8:
        return images.float().div_(255.0)
    return images.float()


def chunk_images(images: torch.Tensor) -> int:
    """How many of ``images`` to turn into float32 at a time."""
    per_image = max(1, images[:1].numel() * 4)
    return max(1, min(CHUNK_IMAGES, CHUNK_FLOAT_BYTES // per_image))


def per_image_channel_sums(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each image's per-channel sum of values and of squares, in [0, 1] units, as float64 (N, C).

    Summed in float32 along one contiguous axis, several times faster than float64 over two axes;
    float32's rounding over one image (a relative 1e-7 per step) is far below what a mean/std needs."""
    sums, sq_sums = [], []
    step = chunk_images(images)
    full_scale = 255.0 if images.dtype == torch.uint8 else 1.0
    for start in range(0, len(images), step):
        chunk = images[start:start + step]
        values = chunk.reshape(len(chunk), chunk.shape[1], -1).float()
        sums.append(values.sum(-1).double() / full_scale)
        sq_sums.append(values.square_().sum(-1).double() / full_scale**2)
    channels = images.shape[1]
    empty = torch.zeros(0, channels, dtype=torch.float64)
    return torch.cat(sums) if sums else empty, torch.cat(sq_sums) if sq_sums else empty


def resize_unit_images(images: torch.Tensor, size: int) -> torch.Tensor:
    """Resize float (N, C, H, W) images in [0, 1] to size x size.

    Antialiasing matters only when shrinking (64x64 EuroSAT to 32x32), where plain bilinear
    sampling would drop three of every four pixels and alias.
    """
    if images.shape[-2:] == (size, size):
        return images
    resized = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    return resized.clamp_(0.0, 1.0)


def resize_uint8_images(images: torch.Tensor, size: int, max_value: float = 255.0) -> torch.Tensor:
    """Resize integer (N, C, H, W) images whose full scale is ``max_value``; returns uint8 (full scale 255)."""
    if images.shape[-2:] == (size, size) and max_value == 255.0 and images.dtype == torch.uint8:
        return images.contiguous()
    out = torch.empty(len(images), images.shape[1], size, size, dtype=torch.uint8)
    for start in range(0, len(images), CHUNK_IMAGES):
        chunk = images[start:start + CHUNK_IMAGES].float().div_(max_value).clamp_(0.0, 1.0)
        out[start:start + CHUNK_IMAGES] = to_uint8(resize_unit_images(chunk, size))
    return out


def to_uint8(unit_images: torch.Tensor) -> torch.Tensor:
    return unit_images.mul(255.0).round_().clamp_(0, 255).to(torch.uint8)
