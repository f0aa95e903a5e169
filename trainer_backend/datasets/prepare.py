"""From a dataset name or folder to train/val tensors: validate, decode (or load the cache), split."""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from trainer_backend.datasets.base import DatasetError, DecodedPool
from trainer_backend.datasets.builtin import (
    BUILTIN_DATASETS,
    BUILTIN_SPECS,
    builtin_available,
    builtin_dir,
    builtin_fingerprint,
    decode_builtin,
    ensure_builtin_files,
    expected_files_text,
)
from trainer_backend.datasets.cache import cache_dir, cache_key, cache_path, exclusive_lock, load_or_build
from trainer_backend.datasets.folder import (
    FolderListing,
    decode_image_folder,
    list_image_folder,
    listing_problems,
    listing_warnings,
    memory_problem,
    resolve_folder,
)
from trainer_backend.datasets.image_files import describe_image_file
from trainer_backend.datasets.tensor_dataset import ImageTensorDataset, split_datasets

MIN_IMAGE_SIZE, MAX_IMAGE_SIZE = 1, 4096


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


@dataclass(frozen=True)
class PreparedData:
    train: ImageTensorDataset
    val: ImageTensorDataset
    info: DatasetInfo


@dataclass(frozen=True)
class DatasetSource:
    """A dataset before decoding: its name, what its cache key hashes, and how to decode it."""

    name: str
    fingerprint: tuple
    decode: Callable[[], DecodedPool]


def prepare_data(dataset: str, *, image_size: int = 32, bands: tuple[int, ...] | None = None,
                 band_scale: float | None = None, val_fraction: float = 0.2, seed: int = 0,
                 data_roots: list[Path] | None = None) -> PreparedData:
    """Decode ``dataset`` once (cached under ``data_dir()/cache``) and split it, stratified, into train/val.

    ``dataset`` is one of ``BUILTIN_DATASETS`` or a folder with one sub-folder per class; with
    ``data_roots`` every class folder and file of a folder must lie inside them.
    Every problem the user can fix raises ``DatasetError`` before any training starts.
    """
    bands = check_options(image_size, bands, band_scale, val_fraction, seed)
    source = resolve_source(dataset, image_size, bands, band_scale, data_roots)
    key = cache_key(source.fingerprint, image_size, bands, band_scale)
    path = cache_path(Path(source.name).name, key)
    pool, _ = load_or_build(path, source.decode)
    train_indices, val_indices = cached_split(path, pool, val_fraction, seed)
    train, val = split_datasets(pool, train_indices, val_indices)
    info = DatasetInfo(
        name=source.name,
        num_classes=len(pool.class_names),
        class_names=pool.class_names,
        in_chans=pool.images.shape[1],
        image_size=image_size,
        num_train=len(train),
        num_val=len(val),
        warnings=pool.warnings,
    )
    return PreparedData(train, val, info)


def check_options(image_size, bands, band_scale, val_fraction, seed) -> tuple[int, ...] | None:
    """Refuse values prepare_data cannot use; returns ``bands`` as a tuple of ints (or None)."""
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
        return DatasetSource(dataset, builtin_fingerprint(dataset),
                             lambda: decode_builtin(dataset, image_size, bands, band_scale))
    listing = list_image_folder(dataset_folder(dataset), roots)
    return folder_source(listing, str(listing.root), image_size, bands, band_scale)


def folder_source(listing: FolderListing, name: str, image_size: int, bands, band_scale) -> DatasetSource:
    problems = listing_problems(listing)
    if problems:
        raise DatasetError("; ".join(problems))
    too_large = memory_problem(listing, image_size, bands, band_scale)
    if too_large:
        raise DatasetError(too_large)
    return DatasetSource(name, ("folder", listing.fingerprint),
                         lambda: decode_image_folder(listing, image_size, bands, band_scale))


def dataset_folder(dataset: str) -> Path:
    """The folder ``dataset`` names; an unknown name that is no folder either gets the list of built-ins."""
    if isinstance(dataset, os.PathLike):
        dataset = os.fspath(dataset)
    if not isinstance(dataset, str) or not dataset.strip():
        raise DatasetError(f"dataset {dataset!r} is not allowed: give one of {', '.join(BUILTIN_DATASETS)} "
                           "or a folder path")
    if not Path(dataset).expanduser().exists():
        raise DatasetError(
            f"dataset {dataset!r} is neither a built-in dataset ({', '.join(BUILTIN_DATASETS)}) nor an "
            f"existing folder ({Path(dataset).expanduser().resolve()} does not exist)"
        )
    return resolve_folder(dataset)


def cached_split(pool_path: Path, pool: DecodedPool, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The stratified split of the pool cached at ``pool_path``, computed once per (fraction, seed)
    and saved beside the pool, so later runs and DDP ranks neither split again nor import scikit-learn."""
    split_path = pool_path.with_name(f"{pool_path.stem}-split-{val_fraction!r}-{seed}.npz")
    with contextlib.suppress(Exception):  # missing, truncated or foreign: split again
        with np.load(split_path) as saved:
            return saved["train"], saved["val"]
    train, val = stratified_split(pool, val_fraction, seed)
    handle, temp_name = tempfile.mkstemp(dir=split_path.parent, prefix=split_path.stem, suffix=".tmp.npz")
    try:
        with os.fdopen(handle, "wb") as temp_file:
            np.savez(temp_file, train=train, val=val)
        os.replace(temp_name, split_path)  # readers never see half a file
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
    return train, val


def stratified_split(pool: DecodedPool, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    # Imported here, not at the top: scikit-learn (with scipy) takes over a second to import, and
    # only building a cache splits; every later run, and every DDP rank, loads the split.
    from sklearn.model_selection import train_test_split

    labels = pool.labels.numpy()
    try:
        return train_test_split(np.arange(len(labels)), test_size=val_fraction, random_state=seed,
                                stratify=labels)
    except ValueError as exc:  # e.g. a val split too small to hold one image of every class
        raise DatasetError(
            f"cannot split {len(labels)} images of {len(pool.class_names)} classes with val_fraction "
            f"{val_fraction}: {exc}"
        ) from exc


def inspect_dataset(dataset: str, data_roots: list[Path] | None = None) -> dict:
    """A quick look for the dashboard, without decoding the set.

    Keys: kind ("builtin"/"folder"), name, path, available_offline, num_classes, class_names,
    num_images, images_per_class, image_shape (H, W), bands, dtype, default_bands, default_scale
    (image_shape to default_scale come from one file; None where unknown), warnings, and problems
    (what prepare_data would refuse, in words). A folder that is missing, not a directory,
    without class sub-folders, with a broken link, a link loop or an unreadable folder, or (with
    ``data_roots``) with a path leading outside them raises ``DatasetError``.
    """
    if dataset in BUILTIN_DATASETS:
        return inspect_builtin(dataset)
    listing = list_image_folder(dataset_folder(dataset), data_roots)
    problems = listing_problems(listing)
    native = {}
    first_image = next((files[0] for files in listing.files_by_class if files), None)
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
        "image_shape": native.get("image_shape"),
        "bands": native.get("bands"),
        "dtype": native.get("dtype"),
        "default_bands": native.get("default_bands"),
        "default_scale": native.get("default_scale"),
        "warnings": listing_warnings(listing),
        "problems": problems,
    }


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
