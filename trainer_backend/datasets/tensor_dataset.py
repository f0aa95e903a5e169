"""The in-memory dataset the training loop reads: whole batches are gathered and normalised at once."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from .base import DecodedPool

# A constant channel (e.g. an all-zero band) has std 0; this floor keeps normalisation finite.
MIN_STD = 1e-6


class ImageTensorDataset(Dataset):
    """Images (N, C, H, W) uint8 or float16 in [0, 1] units, labels int64 (N,), per-channel mean/std.

    ``__getitems__`` is what ``DataLoader`` calls with a whole batch of indices: one gather and one
    normalisation per batch instead of one per image. Use it with ``collate_fn=collate_batch``.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean: torch.Tensor, std: torch.Tensor):
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
        # Normalising is x * scale + shift; uint8's 1/255 is folded into scale.
        unit = 1.0 / 255.0 if images.dtype == torch.uint8 else 1.0
        self._scale = (unit / self.std.clamp(min=MIN_STD)).view(channels, 1, 1)
        self._shift = (-self.mean / self.std.clamp(min=MIN_STD)).view(channels, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._normalise(self.images[index]), self.labels[index]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        batch = torch.as_tensor(indices, dtype=torch.int64)
        return self._normalise(self.images.index_select(0, batch)), self.labels.index_select(0, batch)

    def _normalise(self, pixels: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(self._shift, pixels.float(), self._scale)


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
    return ImageTensorDataset(pool.images.index_select(0, indices), pool.labels.index_select(0, indices), mean, std)


def channel_mean_std(pool: DecodedPool, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    height, width = pool.images.shape[-2:]
    count = len(indices) * height * width
    mean = pool.pixel_sums[indices].sum(0) / count
    variance = (pool.pixel_sq_sums[indices].sum(0) / count - mean.square()).clamp(min=0.0)
    return mean.float(), variance.sqrt().float()
