"""The in-memory dataset the training loop reads: whole batches gathered at once, as stored.

Batches leave the loader as stored pixels (uint8, or float16 for scaled multi-band sources): a
quarter (or half) of float32's bytes to copy to the device. ``Normalisation`` turns them into the
model's float32 input there, in one multiply and one add (``trainer_backend/rank/inputs.py`` calls it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from trainer_backend.datasets.decoded import DecodedPool

# A constant channel (e.g. an all-zero band) has std 0; this floor keeps normalisation finite.
MIN_STD = 1e-6
# A dataset whose two splits' stored pixels take at most this share of a GPU's free memory is kept on it
# whole under --data-on-device auto (trainer.keep_on_device), and the memory estimate counts it there.
DEVICE_DATA_SHARE = 0.10
# The host holds at most this many bytes of a split at once while it is copied onto a device.
COPY_CHUNK_BYTES = 64 * 2**20


def kept_on_device(stored_bytes: int, free_bytes: int, mode: str = "auto") -> bool:
    """Whether a CUDA run keeps ``stored_bytes`` of stored pixels on a GPU with ``free_bytes`` free:
    under ``mode`` "auto" where they take at most DEVICE_DATA_SHARE of it, "on" wherever they fit, "off" never."""
    if mode == "off":
        return False
    return stored_bytes <= (free_bytes if mode == "on" else DEVICE_DATA_SHARE * free_bytes)


def copied_without_waiting(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` (a CPU tensor) on ``device``, its copy queued behind the device's work, not waited for.

    A copy from pageable memory waits on the host for every kernel queued before it (the previous
    training step's), so the host could never queue a step ahead; copied from page-locked memory
    with ``non_blocking`` it is one more item in the stream's queue. The page-locked buffer is not
    reused before the copy has run (the allocator of pinned memory records the copy's stream)."""
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


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
            self._on_device[device] = (copied_without_waiting(self.scale, device),
                                       copied_without_waiting(self.shift, device))
        scale, shift = self._on_device[device]
        # A multiply and an add in place on the one float copy: on a CPU several times faster than
        # addcmul with these broadcast constants, and what a loader worker does to its batch row by
        # row (streaming.py), to the same bits.
        return pixels.to(torch.float32, copy=True).mul_(scale).add_(shift)


class ImageTensorDataset(Dataset):
    """Rows ``indices`` of images (N, C, H, W) uint8 or float16 in [0, 1] units, with their labels
    (int64, one per row chosen) and per-channel mean/std.

    ``images`` is the whole pool, usually mapped read-only from the cache file (cache.py): train
    and val are two index lists over it, never copies, and ``indices`` None means every row.
    ``__getitems__`` is what ``DataLoader`` calls with a whole batch of indices: one gather per
    batch instead of one per image, returning the pixels as stored; ``normalise`` makes them the
    model's input. Use it with ``collate_fn=collate_batch``. ``num_classes`` sizes the confusion
    matrix evaluation counts (0 when unknown). Pickled (a loader worker started by spawn), a mapped
    dataset carries its file's path and maps it again, not its pixels.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
                 num_classes: int = 0, indices: torch.Tensor | None = None, source: Path | None = None):
        if images.dim() != 4 or images.dtype not in (torch.uint8, torch.float16):
            raise TypeError(f"images must be (N, C, H, W) uint8 or float16, got {images.dtype} {tuple(images.shape)}")
        channels = images.shape[1]
        rows = len(images) if indices is None else len(indices)
        if labels.shape != (rows,):
            raise ValueError(f"labels must have shape ({rows},), got {tuple(labels.shape)}")
        if mean.shape != (channels,) or std.shape != (channels,):
            raise ValueError(f"mean and std must have shape ({channels},)")
        self.pool_images = images
        # Rows, labels and the pixels on one device: a batch's positions, copied there once, index all three.
        self.indices = None if indices is None else torch.as_tensor(indices, dtype=torch.int64, device=images.device)
        self.source = source
        self.labels = labels.to(images.device, torch.int64)
        self.mean = mean.to(torch.float32)
        self.std = std.to(torch.float32)
        self.num_classes = num_classes
        self.normalise = Normalisation(self.mean, self.std, stored_dtype=images.dtype)
        self.on_device = False  # set by to_device: batches are gathered where the pixels are, without workers

    @property
    def images(self) -> torch.Tensor:
        """This split's pixels gathered into one tensor: a copy, for inspection; training gathers per batch."""
        return self.pool_images if self.indices is None else self.pool_images.index_select(0, self.indices)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.pool_images.shape[1:])

    @property
    def stored_bytes(self) -> int:
        """Bytes of this split's stored pixels."""
        per_image = self.pool_images[:1].numel() * self.pool_images.element_size()
        return len(self) * per_image

    def __len__(self) -> int:
        return len(self.labels)

    def _rows(self, batch: torch.Tensor) -> torch.Tensor:
        return batch if self.indices is None else self.indices.index_select(0, batch)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = index if self.indices is None else int(self.indices[index])
        return self.pool_images[row], self.labels[index]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        # Kept on a GPU, the batch's positions go there once, without a wait (copied_without_waiting).
        batch = copied_without_waiting(torch.as_tensor(indices, dtype=torch.int64), self.pool_images.device)
        return self.pool_images.index_select(0, self._rows(batch)), self.labels.index_select(0, batch)

    def to_device(self, device: torch.device, chunk_bytes: int = COPY_CHUNK_BYTES) -> ImageTensorDataset:
        """This split with only its own rows copied onto ``device`` (gathers then happen there): into
        one tensor allocated there, ``chunk_bytes`` of rows at a time, so that the host never holds
        the whole split (every process of a run copies at once)."""
        rows = len(self)
        images = torch.empty((rows, *self.image_shape), dtype=self.pool_images.dtype, device=device)
        per_image = self.pool_images[:1].numel() * self.pool_images.element_size()
        step = max(1, chunk_bytes // max(1, per_image))
        for start in range(0, rows, step):
            stop = min(rows, start + step)
            # A slice of the mapped pool is read straight from the file; a gather makes one chunk on the host.
            chunk = (self.pool_images[start:stop] if self.indices is None
                     else self.pool_images.index_select(0, self.indices[start:stop]))
            images[start:stop].copy_(chunk)
        moved = ImageTensorDataset(images, self.labels.to(device), self.mean, self.std, num_classes=self.num_classes)
        moved.on_device = True
        return moved

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if self.source is not None and self.pool_images.device.type == "cpu":
            state["pool_images"] = None  # mapped again where it is unpickled
            state["_pool_shape"] = tuple(self.pool_images.shape)
            state["_pool_dtype"] = np.dtype("uint8" if self.pool_images.dtype == torch.uint8 else "float16")
        return state

    def __setstate__(self, state: dict) -> None:
        shape, dtype = state.pop("_pool_shape", None), state.pop("_pool_dtype", None)
        self.__dict__.update(state)
        if self.pool_images is None:
            from .cache import map_images

            self.pool_images = map_images(self.source, shape, dtype)
            if self.pool_images is None:
                raise RuntimeError(f"the dataset cache {self.source} changed while the run was using it")


def collate_batch(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``DataLoader`` collate_fn for ``ImageTensorDataset``: ``__getitems__`` already made the batch."""
    return batch


def split_datasets(pool: DecodedPool, train_indices, val_indices) -> tuple[ImageTensorDataset, ImageTensorDataset]:
    """Train and val datasets over the same pool, both normalised with the training images' per-channel mean/std."""
    train_idx = torch.as_tensor(train_indices, dtype=torch.int64)
    val_idx = torch.as_tensor(val_indices, dtype=torch.int64)
    mean, std = channel_mean_std(pool, train_idx)
    return subset(pool, train_idx, mean, std), subset(pool, val_idx, mean, std)


def subset(pool: DecodedPool, indices: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> ImageTensorDataset:
    return ImageTensorDataset(pool.images, pool.labels.index_select(0, indices), mean, std,
                              num_classes=len(pool.class_names), indices=indices, source=pool.path)


def channel_mean_std(pool: DecodedPool, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    height, width = pool.images.shape[-2:]
    count = len(indices) * height * width
    mean = pool.pixel_sums[indices].sum(0) / count
    variance = (pool.pixel_sq_sums[indices].sum(0) / count - mean.square()).clamp(min=0.0)
    return mean.float(), variance.sqrt().float()
