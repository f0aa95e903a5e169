"""The in-memory dataset the training loop reads: whole batches gathered at once, as stored.

Batches leave the loader as stored pixels (uint8, or float16 for scaled multi-band sources): a
quarter (or half) of float32's bytes to copy to the device. ``Normalisation`` turns them into the
model's float32 input there, in one fused multiply-add (``trainer_backend/engine/inputs.py`` calls it).
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from trainer_backend.datasets.base import DecodedPool

# A constant channel (e.g. an all-zero band) has std 0; this floor keeps normalisation finite.
MIN_STD = 1e-6


class Normalisation:
    """Stored pixels -> (x / full_scale - mean) / std per channel, as ``x * scale + shift`` in float32,
    on whatever device the pixels are on (the constants are copied there once)."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor, *, stored_dtype: torch.dtype):
        channels = len(mean)
        # uint8's full scale 255 is folded into scale; float16 pixels are stored in [0, 1] already.
        unit = 1.0 / 255.0 if stored_dtype == torch.uint8 else 1.0
        self.scale = (unit / std.float().clamp(min=MIN_STD)).view(channels, 1, 1)
        self.shift = (-mean.float() / std.float().clamp(min=MIN_STD)).view(channels, 1, 1)
        self._on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        device = pixels.device
        if device not in self._on_device:
            self._on_device[device] = (self.scale.to(device), self.shift.to(device))
        scale, shift = self._on_device[device]
        return torch.addcmul(shift, pixels.float(), scale)


class ImageTensorDataset(Dataset):
    """Images (N, C, H, W) uint8 or float16 in [0, 1] units, labels int64 (N,), per-channel mean/std.

    ``__getitems__`` is what ``DataLoader`` calls with a whole batch of indices: one gather per
    batch instead of one per image, returning the pixels as stored; ``normalise`` makes them the
    model's input. Use it with ``collate_fn=collate_batch``. ``num_classes`` sizes the confusion
    matrix evaluation counts (0 when unknown).
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
                 num_classes: int = 0):
        if images.dim() != 4 or images.dtype not in (torch.uint8, torch.float16):
            raise TypeError(f"images must be (N, C, H, W) uint8 or float16, got {images.dtype} {tuple(images.shape)}")
        channels = images.shape[1]
        if labels.shape != (len(images),):
            raise ValueError(f"labels must have shape ({len(images)},), got {tuple(labels.shape)}")
        if mean.shape != (channels,) or std.shape != (channels,):
            raise ValueError(f"mean and std must have shape ({channels},)")
        self.images = images
        self.labels = labels.to(torch.int64)
        self.mean = mean.to(torch.float32)
        self.std = std.to(torch.float32)
        self.num_classes = num_classes
        self.normalise = Normalisation(self.mean, self.std, stored_dtype=images.dtype)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.labels[index]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        batch = torch.as_tensor(indices, dtype=torch.int64)
        return self.images.index_select(0, batch), self.labels.index_select(0, batch)


def collate_batch(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``DataLoader`` collate_fn for ``ImageTensorDataset``: ``__getitems__`` already made the batch."""
    return batch


def split_datasets(pool: DecodedPool, train_indices, val_indices) -> tuple[ImageTensorDataset, ImageTensorDataset]:
    """Train and val datasets, both normalised with the training images' per-channel mean/std."""
    train_idx = torch.as_tensor(train_indices, dtype=torch.int64)
    val_idx = torch.as_tensor(val_indices, dtype=torch.int64)
    mean, std = channel_mean_std(pool, train_idx)
    return subset(pool, train_idx, mean, std), subset(pool, val_idx, mean, std)


def subset(pool: DecodedPool, indices: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> ImageTensorDataset:
    return ImageTensorDataset(pool.images.index_select(0, indices), pool.labels.index_select(0, indices), mean, std,
                              num_classes=len(pool.class_names))


def channel_mean_std(pool: DecodedPool, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    height, width = pool.images.shape[-2:]
    count = len(indices) * height * width
    mean = pool.pixel_sums[indices].sum(0) / count
    variance = (pool.pixel_sq_sums[indices].sum(0) / count - mean.square()).clamp(min=0.0)
    return mean.float(), variance.sqrt().float()
