"""Decode a dataset once into one file on disk that every process maps read-only.

    pool, was_cached = load_or_build(cache_path("mnist", key), build, needed_bytes)
    pool.images          # (N, C, S, S) uint8/float16, mapped from <base>.npy: no copy in this process

An entry is two files: ``<base>.npy`` holds the pixels (a plain NumPy array file, so any tool can
read it) and ``<base>.meta.npz`` the labels, class names, per-image channel sums and how many of
the last images are the dataset's official test split. The launcher, every rank and every loader
worker map the same ``.npy``: the kernel's page cache holds it once for the whole machine, and
pages not in it are read from disk as batches gather them (a set larger than memory streams).

The key hashes everything that changes the decoded pixels: the source fingerprint (every file's
relative path, size, mtime, ctime, device, inode and resolved path, links followed:
``folder.file_fingerprint``), stored size, bands, scale and ``CACHE_FORMAT``. A lock file makes
concurrent processes (DDP ranks, two runs) take turns: one decodes, the others wait and map it.
Both files are written under a temporary name, fsynced and renamed, pixels first and metadata
last, so a reader finds a whole entry or none. A full or read-only cache folder ends in one line
naming the folder (``cache_write_error``). Every cache file is opened without blocking and read
only if it is a regular file: a named pipe, a folder or a device in its place (or a file where
the cache folder should be) ends in one line saying what is in the way (``not_a_cache_file``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from contract.environment import data_dir

from contract.printable import utf8_name
from trainer_backend.datasets.decoded import DecodedPool, per_image_channel_sums
from trainer_backend.datasets.errors import DatasetError
from trainer_backend.datasets.paths import file_kind

# Bump when the decoding or the saved layout changes, so old caches are not read as new ones.
CACHE_FORMAT = 4  # 4: images four times the stored size or more are first shrunk by whole factors (other pixels)
# Written pixels are flushed to disk every this many bytes: dirty pages cannot be dropped, and a
# memory cgroup full of them kills the build instead of reclaiming page cache.
FLUSH_BYTES = 64 * 2**20
NO_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
READ_ONLY_ERRNOS = {errno.EROFS, errno.EACCES, errno.EPERM}


def cache_write_error(exc: OSError, folder: Path, what: str) -> DatasetError | None:
    """The one line a failed write of ``what`` in the cache folder ends in, or None if it is neither
    a full nor a read-only disk."""
    reason = exc.strerror or type(exc).__name__
    if exc.errno in NO_SPACE_ERRNOS:
        return DatasetError(f"disk full while writing {what} in {folder} ({reason}): free some space, or set "
                            "PARALLAX_DATA_DIR to a folder with room")
    if exc.errno in READ_ONLY_ERRNOS:
        return DatasetError(f"the dataset cache folder {folder} is read-only ({reason}): {what} cannot be written "
                            "there; set PARALLAX_DATA_DIR to a folder this user can write")
    return None


@contextlib.contextmanager
def writes_in(folder: Path, what: str) -> Iterator[None]:
    """Turn a full or read-only disk met inside the block into ``cache_write_error``'s line."""
    try:
        yield
    except OSError as exc:
        error = cache_write_error(exc, folder, what)
        if error is None:
            raise
        raise error from None


def cache_dir() -> Path:
    path = data_dir() / "cache"
    with writes_in(path.parent, "the dataset cache folder"):
        try:
            path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise DatasetError(f"the dataset cache folder {path} is {file_kind(os.stat(path).st_mode)}, not a "
                               "folder: move it away (the cache is made there again), or set PARALLAX_DATA_DIR "
                               "to another folder") from None
    return path


def not_a_cache_file(path: Path, mode: int) -> DatasetError:
    """The one line for something other than a regular file where a cache file should be."""
    return DatasetError(f"the dataset cache file {path} is {file_kind(mode)}, not a regular file: it is not read; "
                        "remove it (the entry is then decoded again), or set PARALLAX_DATA_DIR to another folder")


def refuse_non_regular(path: Path) -> None:
    """Raise ``not_a_cache_file`` if something other than a regular file (links followed) is at ``path``."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # nothing there (made as a regular file), or unreadable: the open that follows says so
    if not stat.S_ISREG(mode):
        raise not_a_cache_file(path, mode)


def open_cache_file(path: Path) -> BinaryIO | None:
    """``path`` opened for reading, or None when it is missing or cannot be opened (the entry is
    then rebuilt). Opened without blocking and checked on the opened descriptor: a named pipe
    there would otherwise hold the run forever waiting for a writer."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    return os.fdopen(regular_or_closed(fd, path), "rb")


def regular_or_closed(fd: int, path: Path) -> int:
    """``fd`` when it is a regular file; otherwise it is closed and the one line naming what is at ``path`` raised."""
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise not_a_cache_file(path, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def cache_key(source_fingerprint, image_size: int, bands, band_scale) -> str:
    parts = {
        "format": CACHE_FORMAT,
        "source": source_fingerprint,
        "image_size": image_size,
        "bands": list(bands) if bands is not None else None,
        "band_scale": band_scale,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def cache_path(label: str, key: str) -> Path:
    """The entry's base name; its files are ``<base>.npy``, ``<base>.meta.npz`` and ``<base>.lock``."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "_", label).strip("_")[:40] or "dataset"
    return cache_dir() / f"{slug}-{key[:24]}"


def images_file(base: Path) -> Path:
    return base.with_name(base.name + ".npy")


def meta_file(base: Path) -> Path:
    return base.with_name(base.name + ".meta.npz")


@contextlib.contextmanager
def exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path``; released when the block ends or the process dies."""
    refuse_non_regular(lock_path)
    with writes_in(lock_path.parent, f"the lock file {lock_path.name}"):
        # Not blocking: opening a named pipe for writing would wait for a reader forever.
        fd = os.open(lock_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                     0o666)
    with os.fdopen(regular_or_closed(fd, lock_path), "ab") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass(frozen=True)
class PoolParts:
    """What a decoder hands the cache besides the pixels it wrote through ``ImageWriter``."""

    labels: np.ndarray
    class_names: tuple[str, ...]
    warnings: tuple[str, ...]
    num_test: int = 0  # the last num_test images are the dataset's official test split


class ImageWriter:
    """The pixels of a pool, written in order into a ``.npy`` file, with each image's channel sums.

    Plain writes, not a writable mapping: a full disk then fails with ENOSPC on ``write`` instead of
    a SIGBUS when a mapped page cannot be backed. ``start`` may be called again to begin anew
    (a folder whose first files were 8-bit and a later one was not restarts as float16)."""

    def __init__(self, handle: BinaryIO, folder: Path):
        self.handle, self.folder = handle, folder
        self.shape: tuple[int, ...] = ()
        self.dtype = np.dtype(np.uint8)
        self.written = 0
        self._unflushed = 0
        self._sums: list[torch.Tensor] = []
        self._sq_sums: list[torch.Tensor] = []

    def start(self, count: int, channels: int, size: int, dtype) -> None:
        self.shape, self.dtype, self.written = (count, channels, size, size), np.dtype(dtype), 0
        self._sums, self._sq_sums = [], []
        with writes_in(self.folder, "the dataset cache"):
            self.handle.seek(0)
            self.handle.truncate()
            np.lib.format.write_array_header_1_0(
                self.handle, {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
                              "shape": self.shape})

    def write(self, images) -> None:
        """Append (n, C, S, S) images, as a tensor or an array of the started dtype."""
        pixels = images.numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
        if pixels.dtype != self.dtype or pixels.shape[1:] != self.shape[1:]:
            raise TypeError(f"expected (n, {self.shape[1:]}) {self.dtype}, got {pixels.shape} {pixels.dtype}")
        if self.written + len(pixels) > self.shape[0]:
            raise ValueError(f"{self.written + len(pixels)} images written into a pool of {self.shape[0]}")
        pixels = np.ascontiguousarray(pixels)
        sums, sq_sums = per_image_channel_sums(torch.from_numpy(pixels))
        self._sums.append(sums)
        self._sq_sums.append(sq_sums)
        with writes_in(self.folder, "the dataset cache"):
            self.handle.write(memoryview(pixels).cast("B"))
            self._unflushed += pixels.nbytes
            if self._unflushed >= FLUSH_BYTES:
                self.handle.flush()
                os.fdatasync(self.handle.fileno())
                self._unflushed = 0
        self.written += len(pixels)

    def write_pool(self, pool: DecodedPool, num_test: int = 0) -> PoolParts:
        """Write an in-memory pool (a built-in set) whole."""
        self.start(len(pool.images), pool.images.shape[1], pool.images.shape[-1], pool.images.numpy().dtype)
        self.write(pool.images)
        return PoolParts(pool.labels.numpy(), pool.class_names, pool.warnings, num_test)

    def sums(self) -> tuple[torch.Tensor, torch.Tensor]:
        empty = torch.zeros(0, self.shape[1], dtype=torch.float64)
        return (torch.cat(self._sums) if self._sums else empty, torch.cat(self._sq_sums) if self._sq_sums else empty)


Build = Callable[[ImageWriter], PoolParts]


def load_or_build(base: Path, build: Build, needed_bytes: int = 0) -> tuple[DecodedPool, bool]:
    """The pool cached at ``base`` (mapped), or ``build``'s, written there first. Returns (pool, was_cached).

    ``needed_bytes`` (the decoded size, estimated) is checked against the free space of the cache
    folder before anything is decoded."""
    for path in (images_file(base), meta_file(base)):
        refuse_non_regular(path)  # a folder there would fail the rename after the whole decode
    pool = load_pool(base)
    if pool is not None:
        return pool, True
    with exclusive_lock(base.with_name(base.name + ".lock")):
        pool = load_pool(base)  # another process may have built it while this one waited
        if pool is not None:
            return pool, True
        check_free_space(base.parent, needed_bytes)
        save_built(base, build)
        pool = load_pool(base)
        if pool is None:
            raise DatasetError(f"the dataset cache {images_file(base)} was written but cannot be read back")
        return pool, False


def check_free_space(folder: Path, needed_bytes: int) -> None:
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return
    if needed_bytes > free:
        raise DatasetError(
            f"the dataset cache needs {shown_bytes(needed_bytes)} in {folder} but only {shown_bytes(free)} is "
            "free: free some space, use a smaller image_size or a subset, or set PARALLAX_DATA_DIR to a folder "
            "with room")


def shown_bytes(count: int) -> str:
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:.1f} MiB"


def save_built(base: Path, build: Build) -> None:
    """Run ``build`` into a temporary ``.npy``, then write the metadata; each file fsynced and renamed."""
    folder = base.parent
    with writes_in(folder, "the dataset cache"):
        handle, temp_name = tempfile.mkstemp(dir=folder, prefix=base.name, suffix=".npy.tmp")
    try:
        with os.fdopen(handle, "w+b") as temp_file:
            writer = ImageWriter(temp_file, folder)
            parts = build(writer)
            if writer.written != (writer.shape[0] if writer.shape else -1):
                raise ValueError(f"the decoder wrote {writer.written} of {writer.shape[:1]} images")
            with writes_in(folder, "the dataset cache"):
                temp_file.flush()
                os.fsync(temp_file.fileno())
        with writes_in(folder, "the dataset cache"):
            os.chmod(temp_name, 0o644)  # mkstemp makes it owner-only; other users' runs may share the cache
            os.replace(temp_name, images_file(base))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    sums, sq_sums = writer.sums()
    meta = {
        "format": np.int64(CACHE_FORMAT),
        "shape": np.asarray(writer.shape, dtype=np.int64),
        "dtype": np.asarray(writer.dtype.str),
        "labels": np.asarray(parts.labels, dtype=np.int64),
        "class_names": np.asarray(list(parts.class_names), dtype=str),
        "warnings": np.asarray(list(parts.warnings), dtype=str),
        "num_test": np.int64(parts.num_test),
        "pixel_sums": sums.numpy(),
        "pixel_sq_sums": sq_sums.numpy(),
    }
    write_atomically(meta_file(base), lambda out: np.savez(out, **meta), "the dataset cache's metadata")
    fsync_folder(folder)


def write_atomically(path: Path, write: Callable[[BinaryIO], None], what: str) -> None:
    """Write ``path`` under a temporary name, fsync, rename: a reader sees the old file, the new one, or none."""
    folder = path.parent
    with writes_in(folder, what):
        handle, temp_name = tempfile.mkstemp(dir=folder, prefix=path.name, suffix=".tmp")
    try:
        with writes_in(folder, what):
            with os.fdopen(handle, "wb") as temp_file:
                write(temp_file)
                temp_file.flush()
                os.fsync(temp_file.fileno())
            os.chmod(temp_name, 0o644)
            os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise


def fsync_folder(folder: Path) -> None:
    # The renames are durable only once the folder's entry is; a crash before would lose the entry (not corrupt it).
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def load_pool(base: Path) -> DecodedPool | None:
    """The entry at ``base`` with its pixels mapped, or None when it is missing, truncated or foreign."""
    meta = read_meta(base)
    if meta is None:
        return None
    images = map_images(images_file(base), meta["shape"], meta["dtype"])
    if images is None:
        return None
    return DecodedPool(images=images, labels=torch.from_numpy(meta["labels"]),
                       class_names=tuple(meta["class_names"]), warnings=tuple(meta["warnings"]),
                       pixel_sums=torch.from_numpy(meta["pixel_sums"]),
                       pixel_sq_sums=torch.from_numpy(meta["pixel_sq_sums"]),
                       num_test=meta["num_test"], path=images_file(base))


def read_meta(base: Path) -> dict | None:
    handle = open_cache_file(meta_file(base))
    if handle is None:
        return None
    try:
        with handle, np.load(handle, allow_pickle=False) as saved:
            if int(saved["format"]) != CACHE_FORMAT:
                return None
            meta = {
                "shape": tuple(int(x) for x in saved["shape"]),
                "dtype": np.dtype(str(saved["dtype"])),
                "labels": saved["labels"].astype(np.int64),
                # Entries written before class folders not named in UTF-8 got escaped names.
                "class_names": [utf8_name(str(n)) for n in saved["class_names"]],
                "warnings": [str(w) for w in saved["warnings"]],
                "num_test": int(saved["num_test"]),
                "pixel_sums": saved["pixel_sums"].astype(np.float64),
                "pixel_sq_sums": saved["pixel_sq_sums"].astype(np.float64),
            }
    except Exception:  # missing, truncated or foreign: rebuilt, never trusted
        return None
    if len(meta["labels"]) != meta["shape"][0] or len(meta["pixel_sums"]) != meta["shape"][0]:
        return None
    return meta


def map_images(path: Path, shape: tuple[int, ...], dtype: np.dtype) -> torch.Tensor | None:
    """``path``'s pixels as a tensor over a read-only shared mapping (nothing is read until used),
    or None when the file is not the array the metadata describes."""
    handle = open_cache_file(path)
    if handle is None:
        return None
    try:
        with handle:  # the mapping keeps its own reference to the file
            version = np.lib.format.read_magic(handle)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            stored_shape, fortran_order, stored_dtype = read_header(handle)
            array = np.memmap(handle, dtype=stored_dtype, mode="r", shape=stored_shape, offset=handle.tell(),
                              order="F" if fortran_order else "C")
    except Exception:
        return None
    if tuple(array.shape) != tuple(shape) or array.dtype != dtype:
        return None
    with warnings.catch_warnings():
        # The mapping is read-only on purpose: torch warns that it cannot be written, and nothing writes it.
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)
