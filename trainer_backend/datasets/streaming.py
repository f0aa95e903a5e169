"""Decode each image in the DataLoader workers instead of caching the set: for folders not worth a cache.

    data = prepare_streaming(listing, name, image_size=64, bands=None, band_scale=None, val_fraction=0.2, seed=0)
    data, note = place_decoding(data, torch.device("cpu"), workers=4)     # what the workers hand over
    loader = DataLoader(data.train, batch_size=128, num_workers=4, collate_fn=collate_batch)
    images = data.train.normalise(pixels)                                  # on the run's device

Each batch is decoded by the supervisor that serves it (``decode_image_file``: the same reading,
band choice, scaling and resize as the cache), straight into one batch tensor, in shared memory
when a supervisor makes it (the training process maps it; nothing is copied across). What the supervisor
hands over depends on where the run trains (``loader_output``):

- "stored": pixels as stored, uint8 (or float16 for scaled sources), normalised on the device
  (a quarter of float32's bytes to copy to a GPU). The default, and what a run without workers gets.
- "normalised": on a CPU run with workers, the workers also normalise (the same ``x * scale +
  shift``), so the training process, which shares the cores with them, only trains.
- "encoded": on a CUDA run over JPEG files, the workers read the files' bytes only and the
  training process decodes the batch on its GPU (device_decode.py).

Crops and flips then happen on the device exactly as for a cached set. Nothing is written to
disk; every epoch pays the decode of every image. The per-channel mean/std come from a seeded
sample of the training images, decoded once at the start.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import math

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, get_worker_info

from .device_decode import DeviceJpegDecode, EncodedImages, device_decode_problem
from .errors import DatasetError
from .folder import FolderListing, stored_format
from .image_files import decode_image_file, refuse_declared_size
from .paths import open_checked
from .tensor_dataset import Normalisation

# Training images decoded at the start to estimate the per-channel mean/std.
STATS_SAMPLE = 256
LOADER_OUTPUTS = ("stored", "normalised", "encoded")
JPEG_SUFFIXES = (".jpg", ".jpeg")


def loader_output(device_type: str, *, jpeg: bool, workers: int) -> str:
    """What the loader hands the training process, for a run on ``device_type`` ("cpu", "cuda", ...)
    with ``workers`` loader workers over a folder that is (``jpeg``) all plain RGB JPEG files."""
    if device_type == "cuda" and jpeg:
        return "encoded"
    if device_type == "cpu" and workers > 0:
        return "normalised"
    return "stored"


def batch_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An empty batch; in a loader worker, in shared memory, as ``default_collate`` makes its batches,
    so that sending it to the training process moves no bytes."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    empty = torch.empty(0, dtype=dtype)
    return empty.new(empty._typed_storage()._new_shared(math.prod(shape), device="cpu")).view(shape)


def identity(images: torch.Tensor) -> torch.Tensor:
    """The device-side step of batches the workers normalised already."""
    return images


class StreamingImages(Dataset):
    """The images at ``paths`` decoded on access; batches come as ``output`` says (LOADER_OUTPUTS),
    and ``normalise`` makes the model's input of them on the device."""

    def __init__(self, paths: list, labels: torch.Tensor, *, image_size: int, bands, band_scale, roots,
                 dtype: torch.dtype, mean: torch.Tensor, std: torch.Tensor, num_classes: int, channels: int,
                 jpeg: bool = False, output: str = "stored"):
        self.paths, self.labels = list(paths), labels.to(torch.int64)
        self.image_size, self.bands, self.band_scale, self.roots = image_size, bands, band_scale, roots
        self.dtype, self.mean, self.std, self.num_classes = dtype, mean.float(), std.float(), num_classes
        self.channels, self.jpeg = channels, jpeg
        self.stored_normalise = Normalisation(self.mean, self.std, stored_dtype=dtype)
        self.on_device = False
        self._hand_over(output)

    def with_output(self, output: str) -> StreamingImages:
        """These images, handed over as ``output``."""
        placed = copy.copy(self)
        placed._hand_over(output)
        return placed

    def _hand_over(self, output: str) -> None:
        if output not in LOADER_OUTPUTS:
            raise ValueError(f"Unknown loader output ({output}); allowed: {', '.join(LOADER_OUTPUTS)}")
        self.output = output
        self.normalise = {"stored": self.stored_normalise, "normalised": identity,
                          "encoded": DeviceJpegDecode(self.image_size, self.stored_normalise)}[output]

    @property
    def stored_bytes(self) -> int:
        return len(self) * self.channels * self.image_size**2 * (1 if self.dtype == torch.uint8 else 2)

    def __len__(self) -> int:
        return len(self.labels)

    def decode(self, index: int) -> np.ndarray:
        """One image as stored, (C, S, S); possibly a read-only view of the decoder's (S, S, C) pixels."""
        path = self.paths[index]
        pixels = decode_image_file(path, self.image_size, self.bands, self.band_scale, self.roots).pixels
        if self.dtype == torch.uint8 and pixels.dtype != np.uint8:
            raise DatasetError(f"image {path} is not 8-bit like the folder's first image: decode the folder into "
                               "the cache instead (--decode cache), which stores mixed depths as float16")
        if pixels.shape[0] != self.channels:
            raise DatasetError(f"image {path} has {pixels.shape[0]} channels after band selection, the folder's "
                               f"first image {self.channels}: give bands that every file has")
        if self.dtype == torch.float16 and pixels.dtype != np.float16:
            return (pixels.astype(np.float32) / 255).astype(np.float16)
        return pixels

    def __getitem__(self, index: int) -> tuple[torch.Tensor | EncodedImages, torch.Tensor]:
        images, labels = self.__getitems__([index])
        if isinstance(images, EncodedImages):  # bytes decode as a batch only: a batch of one
            return images, labels[0]
        return images[0], labels[0]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor | EncodedImages, torch.Tensor]:
        labels = self.labels.index_select(0, torch.as_tensor(indices, dtype=torch.int64))
        if self.output == "encoded":
            return self.read_encoded(indices), labels
        normalised = self.output == "normalised"
        shape = (len(indices), self.channels, self.image_size, self.image_size)
        batch = batch_tensor(shape, torch.float32 if normalised else self.dtype)
        rows = batch.numpy()
        scale, shift = self.stored_normalise.scale, self.stored_normalise.shift
        for row, index in enumerate(indices):
            # Each image is copied once, into its row (made float on the way when normalising), and
            # normalised there while it is in the cache: the same multiply and add as on the device.
            rows[row] = self.decode(int(index))
            if normalised:
                batch[row].mul_(scale).add_(shift)
        return batch, labels

    def read_encoded(self, indices: list[int]) -> EncodedImages:
        """The batch's files as bytes, each checked as the CPU decode checks it (inside the roots,
        a JPEG, its declared size within limits), for the device to decode."""
        files = []
        for index in indices:
            path = self.paths[int(index)]
            with open_checked(path, self.roots) as handle:
                raw = handle.read()
            try:
                with Image.open(io.BytesIO(raw)) as image:  # the header only
                    width, height = image.size
                    kind = image.format
            except Exception as exc:  # decoders raise many types; the user needs the file and the reason
                raise DatasetError(f"cannot read image {path}: {exc}") from exc
            if kind != "JPEG":
                raise DatasetError(f"image {path} is {kind}, not JPEG like the folder's other files: decode on the "
                                   "CPU instead (--decode cache)")
            refuse_declared_size(path, (height, width, 3), 1)
            files.append(raw)
        offsets = np.cumsum([0] + [len(raw) for raw in files])
        data = batch_tensor((int(offsets[-1]),), torch.uint8)
        view = data.numpy()
        for start, raw in zip(offsets[:-1], files):
            view[start:start + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        return EncodedImages(data, torch.as_tensor(offsets, dtype=torch.int64))


def plain_jpeg_folder(paths: list, channels: int, dtype: torch.dtype, bands, band_scale) -> bool:
    """Every file a JPEG read as plain RGB (no band choice or scale): what the GPU's decoder gives."""
    return (bool(paths) and all(str(path).lower().endswith(JPEG_SUFFIXES) for path in paths)
            and channels == 3 and dtype == torch.uint8 and bands in (None, (0, 1, 2)) and band_scale in (None, 255.0))


def streaming_splits(listing: FolderListing, *, image_size: int, bands, band_scale, train_indices,
                     val_indices, seed: int, sample: bool = True) -> tuple[StreamingImages, StreamingImages]:
    """Train and val over the folder's files, normalised with a sample of the training images' mean/std
    (unit ones without ``sample``: for a process that reads no images, which decodes none)."""
    paths, labels = listing.labelled_files()
    labels = torch.as_tensor(labels)
    channels, bytes_per_value = stored_format(listing, bands, band_scale)
    dtype = torch.uint8 if bytes_per_value == 1 else torch.float16
    roots = list(listing.roots) if listing.roots is not None else None
    common = dict(image_size=image_size, bands=bands, band_scale=band_scale, roots=roots, dtype=dtype,
                  num_classes=len(listing.class_names), channels=channels,
                  jpeg=plain_jpeg_folder(paths, channels, dtype, bands, band_scale))
    unit = torch.zeros(channels), torch.ones(channels)
    train_idx, val_idx = torch.as_tensor(train_indices), torch.as_tensor(val_indices)
    train = StreamingImages([paths[i] for i in train_idx.tolist()], labels[train_idx], mean=unit[0], std=unit[1],
                            **common)
    mean, std = sample_mean_std(train, seed) if sample else unit
    train = StreamingImages(train.paths, train.labels, mean=mean, std=std, **common)
    val = StreamingImages([paths[i] for i in val_idx.tolist()], labels[val_idx], mean=mean, std=std, **common)
    return train, val


def sample_mean_std(train: StreamingImages, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    count = min(STATS_SAMPLE, len(train))
    picked = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))[:count].tolist()
    pixels, _ = train.__getitems__(picked)
    unit = pixels.float() / (255.0 if pixels.dtype == torch.uint8 else 1.0)
    return unit.mean(dim=(0, 2, 3)), unit.std(dim=(0, 2, 3))


def place_decoding(data, device: torch.device, workers: int) -> tuple:
    """``data`` (a PreparedData) handing its batches over as suits a run on ``device`` with
    ``workers`` loader workers (``loader_output``), and the run's note about it (None when nothing
    is worth saying). A cached set is returned as it is."""
    if not isinstance(data.train, StreamingImages):
        return data, None
    output = loader_output(device.type, jpeg=data.train.jpeg, workers=workers)
    note = None
    if output == "encoded":
        problem = device_decode_problem(data.train.paths[0], data.train.roots, device)
        if problem is None:
            note = (f"JPEGs are decoded on {device} (torchvision decode_jpeg, nvJPEG): the loader workers read the "
                    "files' bytes only, and each batch is decoded, resized and normalised on the device (a JPEG "
                    "far larger than the training size differs from a CPU run's pixels by a few levels: the CPU "
                    "decode shrinks it in libjpeg first)")
        else:
            output = "stored"
            note = f"JPEGs are decoded in the loader workers: decoding on {device} failed on a test file ({problem})"
    placed = dataclasses.replace(data, train=data.train.with_output(output), val=data.val.with_output(output))
    return placed, note
