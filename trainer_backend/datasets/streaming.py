"""Decode each image in the DataLoader workers instead of caching the set: for folders not worth a cache.

    data = prepare_streaming(listing, name, image_size=64, bands=None, band_scale=None, val_fraction=0.2, seed=0)
    loader = DataLoader(data.train, batch_size=128, num_workers=4, collate_fn=collate_batch)

Each batch is decoded by the worker that serves it (``decode_image_file``: the same reading,
band choice, scaling and resize as the cache), as uint8 (or float16 for scaled sources); the
crops and normalisation then happen on the device exactly as for a cached set. Nothing is
written to disk; every epoch pays the decode of every image. The per-channel mean/std come from
a seeded sample of the training images, decoded once at the start.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from .errors import DatasetError
from .folder import FolderListing, stored_format
from .image_files import decode_image_file
from .tensor_dataset import Normalisation

# Training images decoded at the start to estimate the per-channel mean/std.
STATS_SAMPLE = 256


class StreamingImages(Dataset):
    """The images at ``paths`` decoded on access; batches come as stored pixels, like ``ImageTensorDataset``'s."""

    def __init__(self, paths: list, labels: torch.Tensor, *, image_size: int, bands, band_scale, roots,
                 dtype: torch.dtype, mean: torch.Tensor, std: torch.Tensor, num_classes: int, channels: int):
        self.paths, self.labels = list(paths), labels.to(torch.int64)
        self.image_size, self.bands, self.band_scale, self.roots = image_size, bands, band_scale, roots
        self.dtype, self.mean, self.std, self.num_classes = dtype, mean.float(), std.float(), num_classes
        self.channels = channels
        self.normalise = Normalisation(self.mean, self.std, stored_dtype=dtype)
        self.on_device = False

    @property
    def stored_bytes(self) -> int:
        return len(self) * self.channels * self.image_size**2 * (1 if self.dtype == torch.uint8 else 2)

    def __len__(self) -> int:
        return len(self.labels)

    def decode(self, index: int) -> torch.Tensor:
        path = self.paths[index]
        pixels = decode_image_file(path, self.image_size, self.bands, self.band_scale, self.roots).pixels
        if self.dtype == torch.uint8 and pixels.dtype != np.uint8:
            raise DatasetError(f"image {path} is not 8-bit like the folder's first image: decode the folder into "
                               "the cache instead (--decode cache), which stores mixed depths as float16")
        if pixels.shape[0] != self.channels:
            raise DatasetError(f"image {path} has {pixels.shape[0]} channels after band selection, the folder's "
                               f"first image {self.channels}: give bands that every file has")
        tensor = torch.from_numpy(pixels)
        return tensor if tensor.dtype == self.dtype else (tensor.float() / 255).to(self.dtype)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.decode(index), self.labels[index]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        batch = torch.as_tensor(indices, dtype=torch.int64)
        return torch.stack([self.decode(int(i)) for i in indices]), self.labels.index_select(0, batch)


def streaming_splits(listing: FolderListing, *, image_size: int, bands, band_scale, train_indices,
                     val_indices, seed: int) -> tuple[StreamingImages, StreamingImages]:
    """Train and val over the folder's files, normalised with a sample of the training images' mean/std."""
    paths = [f for files in listing.files_by_class for f in files]
    labels = torch.as_tensor([label for label, files in enumerate(listing.files_by_class) for _ in files])
    channels, bytes_per_value = stored_format(listing, bands, band_scale)
    dtype = torch.uint8 if bytes_per_value == 1 else torch.float16
    roots = list(listing.roots) if listing.roots is not None else None
    common = dict(image_size=image_size, bands=bands, band_scale=band_scale, roots=roots, dtype=dtype,
                  num_classes=len(listing.class_names), channels=channels)
    unit = torch.zeros(channels), torch.ones(channels)
    train_idx, val_idx = torch.as_tensor(train_indices), torch.as_tensor(val_indices)
    train = StreamingImages([paths[i] for i in train_idx.tolist()], labels[train_idx], mean=unit[0], std=unit[1],
                            **common)
    mean, std = sample_mean_std(train, seed)
    train = StreamingImages(train.paths, train.labels, mean=mean, std=std, **common)
    val = StreamingImages([paths[i] for i in val_idx.tolist()], labels[val_idx], mean=mean, std=std, **common)
    return train, val


def sample_mean_std(train: StreamingImages, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    count = min(STATS_SAMPLE, len(train))
    picked = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))[:count].tolist()
    pixels, _ = train.__getitems__(picked)
    unit = pixels.float() / (255.0 if pixels.dtype == torch.uint8 else 1.0)
    return unit.mean(dim=(0, 2, 3)), unit.std(dim=(0, 2, 3))
