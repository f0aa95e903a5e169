"""From a dataset name or folder to train/val datasets: validate, decode once (or map the cache), split.

Train and val are index lists over one mapped cache file (cache.py); validation uses the
dataset's official test split where it ships one (``val_from="test"``: mnist's t10k files, a
folder's ``val/`` tree, a ``val.csv`` beside ``train.csv``; layouts.py), else a stratified
``val_fraction`` of the training images, and ``DatasetInfo.val_split`` says which.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trainer_backend.datasets.decoded import DatasetError, DecodedPool
from trainer_backend.datasets.builtin import (
    BUILTIN_DATASETS,
    BUILTIN_SPECS,
    builtin_available,
    builtin_dir,
    builtin_fingerprint,
    decode_builtin,
    ensure_builtin_files,
    expected_files_text,
    has_test_split,
)
from .cache import (
    ImageWriter,
    PoolParts,
    cache_dir,
    cache_key,
    cache_path,
    exclusive_lock,
    load_or_build,
    open_cache_file,
    write_atomically,
)
from trainer_backend.datasets.folder import (
    FolderListing,
    decode_image_folder,
    list_image_folder,
    listing_problems,
    listing_warnings,
    memory_problem,
    stored_format,
)
from trainer_backend.datasets.image_files import describe_image_file
from trainer_backend.datasets.layouts import list_dataset
from trainer_backend.datasets.limits import decoded_bytes, streaming_note
from trainer_backend.datasets.tensor_dataset import ImageTensorDataset, split_datasets

MIN_IMAGE_SIZE, MAX_IMAGE_SIZE = 1, 4096
VAL_SOURCES = ("test", "train")
DECODE_MODES = ("cache", "workers")


@dataclass(frozen=True)
class DatasetInfo:
    name: str                    # the built-in name, or the folder path (resolved)
    num_classes: int
    class_names: tuple[str, ...]
    in_chans: int
    image_size: int              # height == width after preprocessing
    num_train: int
    num_val: int
    warnings: tuple[str, ...]
    val_split: str = ""          # which images validate, in words ("mnist's official test split (10,000 images)")
    decoded_bytes: int = 0       # the cache file's pixels (all splits)
    cache_file: str = ""         # the mapped cache file


@dataclass(frozen=True)
class PreparedData:
    train: ImageTensorDataset  # or StreamingImages (decode "workers"), which batches the same way
    val: ImageTensorDataset
    info: DatasetInfo


@dataclass(frozen=True)
class DatasetSource:
    """A dataset before decoding: its name, what its cache key hashes, how to decode it into the
    cache, and about how many bytes that takes."""

    name: str
    fingerprint: tuple
    build: Callable[[ImageWriter], PoolParts]
    decoded_bytes: int = 0
    val_source: str = ""  # the official validation split given with the data, in words ("the val/ folder of X")


def prepare_data(dataset: str, *, image_size: int = 32, bands: tuple[int, ...] | None = None,
                 band_scale: float | None = None, val_fraction: float = 0.2, seed: int = 0,
                 data_roots: list[Path] | None = None, val_from: str = "test", decode: str = "cache",
                 reads_images: bool = True) -> PreparedData:
    """Decode ``dataset`` once (cached under ``data_dir()/cache``, mapped after that) and split it.

    ``dataset`` is one of ``BUILTIN_DATASETS`` or a folder with one sub-folder per class; with
    ``data_roots`` every class folder and file of a folder must lie inside them. ``val_from``
    "test" validates on the official test split where the dataset has one; otherwise, and with
    "train", a stratified ``val_fraction`` of the training images is held out. ``decode``
    "workers" caches nothing: an image folder's files are decoded in the loader workers each
    epoch (streaming.py); for a process that ``reads_images`` not (a pipeline's later stage) they
    skip the sample of training images decoded for the mean/std, which only the images need.
    Every problem the user can fix raises ``DatasetError`` before any training starts.
    """
    bands = check_options(image_size, bands, band_scale, val_fraction, seed, val_from)
    if decode not in DECODE_MODES:
        raise DatasetError(f"decode {decode!r} is not allowed: use one of {', '.join(DECODE_MODES)}")
    if decode == "workers":
        return prepare_streaming(dataset, image_size, bands, band_scale, val_fraction, seed, data_roots, val_from,
                                 sample=reads_images)
    source = resolve_source(dataset, image_size, bands, band_scale, data_roots)
    key = cache_key(source.fingerprint, image_size, bands, band_scale)
    path = cache_path(Path(source.name).name, key)
    pool, _ = load_or_build(path, source.build, source.decoded_bytes)
    train_indices, val_indices = cached_split(path, pool, val_fraction, seed, val_from)
    train, val = split_datasets(pool, train_indices, val_indices)
    size = pool.images.numel() * pool.images.element_size()
    note = streaming_note(size, pool.path)
    info = DatasetInfo(
        name=source.name,
        num_classes=len(pool.class_names),
        class_names=pool.class_names,
        in_chans=pool.images.shape[1],
        image_size=image_size,
        num_train=len(train),
        num_val=len(val),
        warnings=pool.warnings + ((note,) if note else ()),
        val_split=val_split_text(source.name, pool, val_from, val_fraction, seed, len(val), source.val_source),
        decoded_bytes=size,
        cache_file=str(pool.path or ""),
    )
    return PreparedData(train, val, info)


def prepare_streaming(dataset: str, image_size: int, bands, band_scale, val_fraction: float, seed: int,
                      roots, val_from: str = "test", sample: bool = True) -> PreparedData:
    from .streaming import STATS_SAMPLE, streaming_splits

    if dataset in BUILTIN_DATASETS and dataset != "eurosat":
        raise DatasetError(f"decode workers applies to image folders (and eurosat); {dataset} is read from its own "
                           "files into the cache: use decode cache")
    if dataset == "eurosat":
        with exclusive_lock(cache_dir() / f"{dataset}.download.lock"):
            ensure_builtin_files(dataset)
    listing = (list_image_folder(builtin_dir(dataset)) if dataset == "eurosat" else dataset_listing(dataset, roots))
    problems = listing_problems(listing)
    if problems:
        raise DatasetError("; ".join(problems))
    labels = torch.as_tensor(listing.labelled_files()[1])
    num_train = listing.num_train_images
    official = listing.val_files_by_class is not None and val_from == "test"
    if official:
        train_indices, val_indices = np.arange(num_train), np.arange(num_train, len(labels))
    else:
        train_indices, val_indices = stratified_split(labels[:num_train], len(listing.class_names), val_fraction, seed)
    train, val = streaming_splits(listing, image_size=image_size, bands=bands, band_scale=band_scale,
                                  train_indices=train_indices, val_indices=val_indices, seed=seed, sample=sample)
    name = dataset if dataset == "eurosat" else str(listing.root)
    note = (f"images are decoded in the loader workers every epoch (decode workers): nothing is cached, each epoch "
            f"pays the decode of {listing.num_images:,} files; the normalisation's mean/std come from "
            f"{min(STATS_SAMPLE, len(train))} training images")
    info = DatasetInfo(name=name, num_classes=len(listing.class_names), class_names=listing.class_names,
                       in_chans=train.channels, image_size=image_size, num_train=len(train), num_val=len(val),
                       warnings=tuple(listing_warnings(listing)) + (note,),
                       val_split=(official_split_text(listing.val_source, len(val)) if official else
                                  f"validated on {val_fraction:.0%} of the training images of {Path(name).name}, held "
                                  f"out stratified with seed {seed} ({len(val):,} images)"))
    return PreparedData(train, val, info)


def official_split_text(val_source: str, num_val: int) -> str:
    return f"validated on the official split given with the data: {val_source} ({num_val:,} images)"


def val_split_text(name: str, pool: DecodedPool, val_from: str, val_fraction: float, seed: int, num_val: int,
                   val_source: str = "") -> str:
    label = Path(name).name if os.sep in name else name
    if pool.num_test and val_from == "test":
        if val_source:
            return official_split_text(val_source, num_val)
        return f"validated on the official test split of {label} ({num_val:,} images)"
    if name in BUILTIN_DATASETS:
        why = "it ships no test split" if not pool.num_test else "val_from train"
    else:
        why = "it has no val/ folder or validation list" if not pool.num_test else "val_from train"
    return (f"validated on {val_fraction:.0%} of the training images of {label}, held out stratified with "
            f"seed {seed} ({num_val:,} images; {why})")


def check_options(image_size, bands, band_scale, val_fraction, seed, val_from="test") -> tuple[int, ...] | None:
    """Refuse values prepare_data cannot use; returns ``bands`` as a tuple of ints (or None)."""
    if val_from not in VAL_SOURCES:
        raise DatasetError(f"val_from {val_from!r} is not allowed: use one of {', '.join(VAL_SOURCES)}")
    if not is_whole_number(image_size) or not MIN_IMAGE_SIZE <= image_size <= MAX_IMAGE_SIZE:
        raise DatasetError(f"image_size {image_size!r} is not allowed: give a whole number of pixels, "
                           f"{MIN_IMAGE_SIZE}..{MAX_IMAGE_SIZE}")
    if band_scale is not None and not (is_real_number(band_scale) and band_scale > 0):
        raise DatasetError(f"band_scale {band_scale!r} is not allowed: give a positive number, e.g. 4000")
    if not is_real_number(val_fraction) or not 0 < val_fraction < 1:
        raise DatasetError(f"val_fraction {val_fraction!r} is not allowed: give a number between 0 and 1, e.g. 0.2")
    if not is_whole_number(seed) or not 0 <= seed < 2**32:
        raise DatasetError(f"seed {seed!r} is not allowed: give a whole number 0..{2**32 - 1}")
    if bands is None:
        return None
    if isinstance(bands, (str, bytes)) or not all(is_whole_number(b) and b >= 0 for b in bands) or not bands:
        raise DatasetError(f"bands {bands!r} is not allowed: give one or more zero-based band indices, e.g. (3, 2, 1)")
    return tuple(int(b) for b in bands)


def is_whole_number(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def resolve_source(dataset: str, image_size: int, bands, band_scale, roots=None) -> DatasetSource:
    if dataset in BUILTIN_DATASETS:
        if dataset != "digits":
            with exclusive_lock(cache_dir() / f"{dataset}.download.lock"):
                ensure_builtin_files(dataset)  # one process downloads or unpacks, the others wait
        if dataset == "eurosat":  # torchvision's EuroSAT is a plain folder of class folders
            listing = list_image_folder(builtin_dir(dataset))
            return folder_source(listing, dataset, image_size, bands, band_scale)
        spec = BUILTIN_SPECS[dataset]
        with_test = spec.num_images + (spec.num_test if has_test_split(dataset) else 0)
        return DatasetSource(dataset, builtin_fingerprint(dataset),
                             lambda writer: write_builtin(writer, dataset, image_size, bands, band_scale),
                             decoded_bytes(with_test, spec.bands, image_size, 1))
    listing = dataset_listing(dataset, roots)
    return folder_source(listing, str(listing.root), image_size, bands, band_scale)


def folder_source(listing: FolderListing, name: str, image_size: int, bands, band_scale) -> DatasetSource:
    problems = listing_problems(listing)
    if problems:
        raise DatasetError("; ".join(problems))
    too_large = memory_problem(listing, image_size, bands, band_scale)
    if too_large:
        raise DatasetError(too_large)
    # A plain folder keeps the key it always had; the other layouts add theirs and, for a list, its content.
    fingerprint = (("folder", listing.fingerprint) if listing.layout == "folder"
                   else (listing.layout, listing.fingerprint, listing.digest))
    return DatasetSource(name, fingerprint,
                         lambda writer: decode_image_folder(listing, image_size, bands, band_scale, writer),
                         listing_bytes(listing, listing.num_images, image_size, bands, band_scale),
                         val_source=listing.val_source)


def listing_bytes(listing: FolderListing, count: int, image_size: int, bands, band_scale) -> int:
    """Bytes ``count`` of the listing's images take decoded (in its first file's format)."""
    stored = stored_format(listing, bands, band_scale)
    return 0 if stored is None else decoded_bytes(count, stored[0], image_size, stored[1])


def write_builtin(writer: ImageWriter, name: str, image_size: int, bands, band_scale) -> PoolParts:
    pool = decode_builtin(name, image_size, bands, band_scale)  # small enough to decode in memory first
    return writer.write_pool(pool, pool.num_test)


def dataset_listing(dataset: str, roots: list[Path] | None = None) -> FolderListing:
    """The listing of the folder or list file ``dataset`` names (layouts.py), nothing decoded."""
    return list_dataset(dataset_folder(dataset), roots)


def dataset_folder(dataset: str) -> Path:
    """The folder or list file ``dataset`` names; an unknown name that is neither gets the list of built-ins."""
    if isinstance(dataset, os.PathLike):
        dataset = os.fspath(dataset)
    if not isinstance(dataset, str) or not dataset.strip():
        raise DatasetError(f"dataset {dataset!r} is not allowed: give one of {', '.join(BUILTIN_DATASETS)} "
                           "or a folder path")
    if not Path(dataset).expanduser().exists():
        raise DatasetError(
            f"dataset {dataset!r} is neither a built-in dataset ({', '.join(BUILTIN_DATASETS)}) nor an "
            f"existing folder or list file ({Path(dataset).expanduser().resolve()} does not exist)"
        )
    return Path(dataset).expanduser()


def cached_split(pool_path: Path, pool: DecodedPool, val_fraction: float, seed: int,
                 val_from: str = "test") -> tuple[np.ndarray, np.ndarray]:
    """(train, val) indices into the pool. With an official test split (and ``val_from`` "test"):
    the training images and the test images. Otherwise the stratified split of the training
    images, computed once per (fraction, seed) and saved beside the pool, so later runs and DDP
    ranks neither split again nor import scikit-learn."""
    num_train = len(pool.labels) - pool.num_test
    if pool.num_test and val_from == "test":
        return np.arange(num_train), np.arange(num_train, len(pool.labels))
    split_path = pool_path.with_name(f"{pool_path.name}-split-{val_fraction!r}-{seed}.npz")
    handle = open_cache_file(split_path)  # a named pipe or a folder there is named, not waited on
    if handle is not None:
        with handle, contextlib.suppress(Exception):  # truncated or foreign: split again
            with np.load(handle, allow_pickle=False) as saved:
                train, val = saved["train"], saved["val"]
                if len(train) + len(val) == num_train:
                    return train, val
    train, val = stratified_split(pool.labels[:num_train], len(pool.class_names), val_fraction, seed)
    write_atomically(split_path, lambda out: np.savez(out, train=train, val=val), "the dataset's split file")
    return train, val


def stratified_split(labels, num_classes: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    # Imported here, not at the top: scikit-learn (with scipy) takes over a second to import, and
    # only building a cache splits; every later run, and every DDP rank, loads the split.
    from sklearn.model_selection import train_test_split

    labels = labels.numpy()
    try:
        return train_test_split(np.arange(len(labels)), test_size=val_fraction, random_state=seed,
                                stratify=labels)
    except ValueError as exc:  # e.g. a val split too small to hold one image of every class
        raise DatasetError(
            f"cannot split {len(labels)} images of {num_classes} classes with val_fraction "
            f"{val_fraction}: {exc}"
        ) from exc


def inspect_dataset(dataset: str, data_roots: list[Path] | None = None) -> dict:
    """A quick look for the dashboard, without decoding the set.

    Keys: kind ("builtin"/"folder"), name, path, available_offline, num_classes, class_names,
    num_images, images_per_class (training images), layout ("folder", "split folder", "list"),
    num_val_images and val_source (an official validation split: val/ or a validation list),
    image_shape (H, W), bands, dtype, default_bands, default_scale
    (image_shape to default_scale come from one file; None where unknown), warnings, and problems
    (what prepare_data would refuse, in words). A folder that is missing, not a directory,
    without class sub-folders, with a broken link, a link loop or an unreadable folder, or (with
    ``data_roots``) with a path leading outside them raises ``DatasetError``.
    """
    if dataset in BUILTIN_DATASETS:
        return inspect_builtin(dataset)
    listing = dataset_listing(dataset, data_roots)
    problems = listing_problems(listing)
    native = {}
    first_image = listing.first_file()
    if first_image is not None:
        try:
            native = describe_image_file(first_image, data_roots)
        except DatasetError as exc:
            problems.append(str(exc))
    return {
        "kind": "folder",
        "name": str(listing.root),
        "path": str(listing.root),
        "available_offline": True,
        "num_classes": len(listing.class_names),
        "class_names": list(listing.class_names),
        "num_images": listing.num_images,
        "images_per_class": {n: len(f) for n, f in zip(listing.class_names, listing.files_by_class)},
        "layout": listing.layout,
        "num_val_images": listing.num_val_images,
        "val_source": listing.val_source,
        "image_shape": native.get("image_shape"),
        "bands": native.get("bands"),
        "dtype": native.get("dtype"),
        "default_bands": native.get("default_bands"),
        "default_scale": native.get("default_scale"),
        "warnings": listing_warnings(listing),
        "problems": problems,
    }


def stored_split_size(dataset: str, image_size: int, bands=None, band_scale=None,
                      val_from: str = "test") -> tuple[int, int]:
    """(bytes of the pixels, images) that ``prepare_data`` stores for the run's two splits, from a
    look at the dataset (nothing decoded, nothing downloaded): what a CUDA run keeps on its GPU
    when they fit (``kept_on_device``). A built-in set not on disk yet is counted as its download
    will be (cifar10 with its test split); a folder's storage format is judged by its first file,
    as the decoded-size limit judges it. A folder missing or unreadable raises ``DatasetError``."""
    if dataset in BUILTIN_DATASETS and (dataset != "eurosat" or not builtin_available(dataset)):
        spec = BUILTIN_SPECS[dataset]
        with_test = has_test_split(dataset) or (dataset == "cifar10" and not builtin_available(dataset))
        count = spec.num_images + (spec.num_test if val_from == "test" and with_test else 0)
        channels = len(bands) if bands else spec.bands  # only eurosat (a folder of RGB JPEGs) takes bands
        return decoded_bytes(count, channels, image_size, 1), count
    listing = list_image_folder(builtin_dir(dataset)) if dataset == "eurosat" else dataset_listing(dataset)
    count = listing.num_images if val_from == "test" else listing.num_train_images
    return listing_bytes(listing, count, image_size, bands, band_scale), count


def inspect_builtin(name: str) -> dict:
    spec, available = BUILTIN_SPECS[name], builtin_available(name)
    return {
        "kind": "builtin",
        "name": name,
        "path": "bundled with scikit-learn" if name == "digits" else str(builtin_dir(name)),
        "available_offline": available,
        "num_classes": spec.num_classes,
        "class_names": [],
        "num_images": spec.num_images,
        "images_per_class": {},
        "image_shape": spec.image_shape,
        "bands": spec.bands,
        "dtype": "float64" if name == "digits" else "uint8",
        "default_bands": None,
        "default_scale": None,
        "warnings": [] if available else [
            f"{name} is not on disk: it will be downloaded, or put the files in {builtin_dir(name)}: "
            f"{expected_files_text(name)}"
        ],
        "problems": [],
    }
