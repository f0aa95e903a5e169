"""Built-in datasets: scikit-learn's digits (bundled) and four sets in torchvision's layout under ``data_dir()``.

mnist, fashion_mnist, cifar10 and eurosat are read from disk when their files are there and
downloaded with torchvision otherwise; without a network the error says where to put the files.
mnist, fashion_mnist and cifar10 ship an official test split (t10k-*, test_batch): it is decoded
after the training images, as the pool's last ``num_test`` images, so that runs validate on it
and their accuracies compare with published ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import importlib
import importlib.util
import os
import pickle
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from contract.environment import data_dir

from trainer_backend.datasets.decoded import DatasetError, DecodedPool, make_pool, resize_uint8_images

# Without it a stalled connection could hold a run in "preparing" forever.
DOWNLOAD_TIMEOUT_S = 30
IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
CIFAR10_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_FILE = "test_batch"
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


@dataclass(frozen=True)
class BuiltinSpec:
    name: str
    folder: str                 # relative to data_dir(); empty for digits (bundled with scikit-learn)
    files: tuple[str, ...]      # what must exist in that folder
    num_images: int             # the training split
    num_classes: int
    image_shape: tuple[int, int]
    bands: int
    num_test: int = 0           # the official test split, 0 where the dataset has none


BUILTIN_SPECS = {
    "digits": BuiltinSpec("digits", "", (), 1797, 10, (8, 8), 1),
    "mnist": BuiltinSpec("mnist", "MNIST/raw", IDX_FILES, 60_000, 10, (28, 28), 1, 10_000),
    "fashion_mnist": BuiltinSpec("fashion_mnist", "FashionMNIST/raw", IDX_FILES, 60_000, 10, (28, 28), 1, 10_000),
    "cifar10": BuiltinSpec("cifar10", "cifar-10-batches-py", CIFAR10_FILES, 50_000, 10, (32, 32), 3, 10_000),
    "eurosat": BuiltinSpec("eurosat", "eurosat/2750", (), 27_000, 10, (64, 64), 3),
}
BUILTIN_DATASETS = tuple(BUILTIN_SPECS)


def builtin_dir(name: str) -> Path:
    return data_dir() / BUILTIN_SPECS[name].folder


def builtin_available(name: str) -> bool:
    """True when the files are on disk (digits always is)."""
    spec, folder = BUILTIN_SPECS[name], builtin_dir(name)
    if name == "digits":
        return True
    if name == "eurosat":
        return folder.is_dir()
    return all((folder / f).exists() or (folder / f"{f}.gz").exists() for f in spec.files)


def has_test_split(name: str) -> bool:
    """Whether ``name``'s official test split is on disk (mnist's t10k files are part of its set;
    an older cifar10 copy may lack test_batch, and is then split from its training images)."""
    if name in ("mnist", "fashion_mnist"):
        return True
    return name == "cifar10" and (builtin_dir(name) / CIFAR10_TEST_FILE).exists()


def ensure_builtin_files(name: str) -> None:
    """Make the files of ``name`` readable: unpack .gz idx files, download what is missing."""
    if name in ("mnist", "fashion_mnist"):
        gunzip_missing(builtin_dir(name), IDX_FILES)
    if not builtin_available(name):
        download_builtin(name)


def gunzip_missing(folder: Path, names: tuple[str, ...]) -> None:
    # torchvision reads only the unpacked idx files; people often copy just the .gz ones.
    for name in names:
        target, packed = folder / name, folder / f"{name}.gz"
        if target.exists() or not packed.exists():
            continue
        temp = target.with_suffix(".unpacking")
        try:
            with gzip.open(packed, "rb") as source, open(temp, "wb") as out:
                shutil.copyfileobj(source, out)
        except (OSError, EOFError) as exc:
            temp.unlink(missing_ok=True)
            raise DatasetError(f"cannot unpack {packed}: {exc}") from exc
        os.replace(temp, target)


def download_builtin(name: str) -> None:
    root = str(data_dir())
    downloaders = {
        # torchvision is imported only here and below: it costs ~1.5 s of start-up that digits
        # and folder runs do not need.
        "mnist": lambda: _torchvision().datasets.MNIST(root, train=True, download=True),
        "fashion_mnist": lambda: _torchvision().datasets.FashionMNIST(root, train=True, download=True),
        "cifar10": lambda: _torchvision().datasets.CIFAR10(root, train=True, download=True),
        "eurosat": lambda: _torchvision().datasets.EuroSAT(root, download=True),
    }
    previous_timeout = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
    try:
        downloaders[name]()
    except Exception as exc:  # no network, a moved URL, a bad checksum: all end the same way
        raise DatasetError(
            f"cannot download {name} ({short_reason(exc)}); put the files in {builtin_dir(name)}: "
            f"{expected_files_text(name)}"
        ) from exc
    finally:
        socket.setdefaulttimeout(previous_timeout)


def short_reason(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reason = lines[-1].strip("<>") if lines else type(exc).__name__
    return reason if len(reason) <= 120 else reason[:117] + "..."


def expected_files_text(name: str) -> str:
    if name == "eurosat":
        return "one sub-folder per class with the RGB .jpg images (EuroSAT.zip unpacked)"
    if name in ("mnist", "fashion_mnist"):
        return ", ".join(IDX_FILES) + " (or the same names with .gz)"
    return ", ".join(BUILTIN_SPECS[name].files)


def builtin_fingerprint(name: str) -> tuple:
    """What the cache key hashes for digits, mnist, fashion_mnist, cifar10: name, file sizes and times."""
    if name == "digits":
        # Located without importing scikit-learn (over a second), so a cached digits run never imports it.
        bundled = Path(importlib.util.find_spec("sklearn").origin).parent / "datasets" / "data" / "digits.csv.gz"
        return (name, bundled.name, bundled.stat().st_size, bundled.stat().st_mtime_ns)
    folder = builtin_dir(name)
    files = BUILTIN_SPECS[name].files + ((CIFAR10_TEST_FILE,) if name == "cifar10" and has_test_split(name) else ())
    stats = [(f, (folder / f).stat().st_size, (folder / f).stat().st_mtime_ns) for f in files]
    return (name, tuple(stats))


def decode_builtin(name: str, image_size: int, bands, band_scale) -> DecodedPool:
    """digits, mnist, fashion_mnist or cifar10 as uint8 images, the official test split (if any)
    last (eurosat is read as an image folder)."""
    if bands is not None or band_scale is not None:
        raise DatasetError(
            f"bands and band_scale apply to image folders and eurosat, not to {name}: leave them empty"
        )
    if name == "digits":
        return decode_digits(image_size)
    if name == "cifar10":
        return decode_cifar10(image_size)
    return decode_idx(name, image_size)


def decode_digits(image_size: int) -> DecodedPool:
    from sklearn.datasets import load_digits

    digits = load_digits()
    # Digits are 0..16 intensities; 16 is the full scale.
    pixels = torch.from_numpy(digits.images).float().unsqueeze(1)
    images = resize_uint8_images(pixels, image_size, max_value=16.0)
    return make_pool(images, digits.target, [str(c) for c in digits.target_names])


def decode_idx(name: str, image_size: int) -> DecodedPool:
    datasets = _torchvision().datasets
    dataset_class = datasets.MNIST if name == "mnist" else datasets.FashionMNIST
    splits = []
    for train in (True, False):
        try:
            dataset = dataset_class(str(data_dir()), train=train, download=False)
        except Exception as exc:  # truncated or mislabelled idx files fail inside torchvision's parser
            raise DatasetError(f"cannot read {name} files in {builtin_dir(name)}: {short_reason(exc)}") from exc
        if len(dataset.data) != len(dataset.targets):
            raise DatasetError(f"cannot read {name} files in {builtin_dir(name)}: {len(dataset.data)} "
                               f"{'training' if train else 'test'} images but {len(dataset.targets)} labels")
        splits.append(dataset)
    images = resize_uint8_images(torch.cat([d.data for d in splits]).unsqueeze(1), image_size)
    pool = make_pool(images, torch.cat([d.targets for d in splits]), splits[0].classes)
    return dataclasses.replace(pool, num_test=len(splits[1].data))


def decode_cifar10(image_size: int) -> DecodedPool:
    folder = builtin_dir("cifar10")
    names = CIFAR10_FILES + ((CIFAR10_TEST_FILE,) if has_test_split("cifar10") else ())
    batches = [read_cifar_batch(folder / name) for name in names]
    images = torch.from_numpy(np.concatenate([pixels for pixels, _ in batches]))
    labels = np.concatenate([labels for _, labels in batches])
    pool = make_pool(resize_uint8_images(images, image_size), labels, read_cifar_class_names(folder))
    return dataclasses.replace(pool, num_test=len(batches[-1][1]) if has_test_split("cifar10") else 0)


# What CIFAR-10's pickles hold besides dicts, lists, strings, bytes and numbers: numpy arrays (and
# the numpy scalars and latin-1 byte strings that Python 2 and 3 pickles build them from).
CIFAR_PICKLE_GLOBALS = frozenset({
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
})


class CifarUnpickler(pickle.Unpickler):
    """Unpickles only what a CIFAR-10 batch holds. Any other callable a pickle names (os.system,
    eval, a class with side effects) is refused before it is called: a plain pickle.load would run it."""

    def find_class(self, module: str, name: str):
        if (module, name) not in CIFAR_PICKLE_GLOBALS:
            raise pickle.UnpicklingError(
                f"it names {module}.{name}, which a CIFAR-10 file never holds (only dicts, lists, bytes and "
                "numpy arrays); refused without running it")
        if module.startswith("numpy.core."):  # numpy 2 moved it (the old name still loads, with a warning)
            with contextlib.suppress(ImportError):
                return getattr(importlib.import_module("numpy._core." + module.split(".", 2)[2]), name)
        return super().find_class(module, name)


def load_cifar_pickle(handle):
    return CifarUnpickler(handle, encoding="bytes").load()


def read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(path, "rb") as handle:
            entry = load_cifar_pickle(handle)
        pixels = np.asarray(pickled_field(entry, "data"), dtype=np.uint8).reshape(-1, 3, 32, 32)
        labels = np.asarray(pickled_field(entry, "labels"), dtype=np.int64)
    except Exception as exc:
        raise DatasetError(f"cannot read cifar10 batch {path}: {exc}") from exc
    if len(pixels) != len(labels):
        raise DatasetError(f"cannot read cifar10 batch {path}: {len(pixels)} images but {len(labels)} labels")
    return pixels, labels


def read_cifar_class_names(folder: Path) -> tuple[str, ...]:
    meta = folder / "batches.meta"
    if not meta.exists():
        return CIFAR10_CLASSES
    try:
        with open(meta, "rb") as handle:
            names = pickled_field(load_cifar_pickle(handle), "label_names")
        return tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names)
    except Exception as exc:
        raise DatasetError(f"cannot read cifar10 class names {meta}: {exc}") from exc


def pickled_field(entry: dict, key: str):
    # The original batches were pickled by Python 2, so their keys load as bytes.
    if key.encode() in entry:
        return entry[key.encode()]
    return entry[key]


def _torchvision():
    import torchvision

    return torchvision
