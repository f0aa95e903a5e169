"""Image folders in the EuroSAT layout: one sub-folder per class, image files inside.

``list_image_folder`` scans without decoding (for the dashboard and the cache key); a listing may
also carry an official validation split (``val_files_by_class``: a ``val/`` tree or a validation
list, layouts.py), decoded after the training images as the pool's last ``num_test`` images;
``decode_image_folder`` decodes every image, in a process pool for large sets. Both take the data
roots a confined run reads inside (``paths``): every class folder and file, links included.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import stat
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from contract.printable import is_utf8, shown_name, utf8_name
from trainer_backend.datasets.decoded import DatasetError
from trainer_backend.datasets.cache import ImageWriter, PoolParts
from trainer_backend.datasets.image_files import DecodedImage, decode_image_file, describe_image_file, is_image_file
from trainer_backend.datasets.limits import decoded_bytes, too_large_decoded, too_many_images
from trainer_backend.datasets.paths import check_inside, entry_stat, folder_entries

# Below this many files a pool costs more to start than it saves (a 13-band 64x64 TIFF takes ~0.7 ms).
MIN_FILES_FOR_POOL = 512
MIN_IMAGES_PER_CLASS = 2
# Images decoded, then written to the cache, at a time: memory holds one chunk (256 RGB images
# at 224 px are 39 MB), never the whole set.
CHUNK_FILES = 256


@dataclass(frozen=True)
class FolderListing:
    root: Path
    class_names: tuple[str, ...]
    files_by_class: tuple[tuple[Path, ...], ...]
    ignored_files: tuple[Path, ...]  # non-image files inside class folders
    stray_files: tuple[Path, ...]    # files next to the class folders, not in one
    # Every file's (relative path, size, mtime_ns, ctime_ns, device, inode, resolved path): links
    # followed, so that a link pointed at another file changes it (cache.py's key).
    fingerprint: tuple[tuple[str, int, int, int, int, int, str], ...]
    roots: tuple[Path, ...] | None = None  # the data roots every file read must lie inside, if confined
    # The official validation split, one tuple per class of class_names (val/ or a validation list), if any.
    val_files_by_class: tuple[tuple[Path, ...], ...] | None = None
    layout: str = "folder"  # "folder" (class folders), "split folder" (train/ + val/) or "list" (a list file)
    val_source: str = ""    # where the validation split comes from, in words ("the val/ folder of X")
    digest: str = ""        # a list layout: the sha256 of its list file(s), so the cache key covers their content
    notes: tuple[str, ...] = ()  # what the layout found worth a warning (a validation list repeating training images)

    @property
    def num_train_images(self) -> int:
        return sum(len(files) for files in self.files_by_class)

    @property
    def num_val_images(self) -> int:
        return sum(len(files) for files in self.val_files_by_class or ())

    @property
    def num_images(self) -> int:
        return self.num_train_images + self.num_val_images

    @property
    def described(self) -> str:
        return f"list file {self.root}" if self.layout == "list" else f"dataset folder {self.root}"

    def labelled_files(self) -> tuple[list[Path], list[int]]:
        """Every file the pool holds, the training images first, then the official validation split; with labels."""
        paths, labels = [], []
        for split in (self.files_by_class, self.val_files_by_class or ()):
            for label, files in enumerate(split):
                paths.extend(files)
                labels.extend([label] * len(files))
        return paths, labels

    def first_file(self) -> Path | None:
        return next((files[0] for files in (*self.files_by_class, *(self.val_files_by_class or ())) if files), None)


def is_hidden(name: str) -> bool:
    return name.startswith(".")


def resolve_folder(dataset: str) -> Path:
    root = Path(dataset).expanduser().resolve()
    if not root.exists():
        raise DatasetError(
            f"dataset folder {root} does not exist: give a built-in name or an existing folder "
            "with one sub-folder per class"
        )
    if not root.is_dir():
        raise DatasetError(f"dataset {root} is not a directory: give a folder with one sub-folder per class, "
                           "or a .csv/.txt list file of path,label lines")
    return root


def list_image_folder(root: Path, roots: list[Path] | None = None) -> FolderListing:
    """Classes, image files and ignored files under ``root`` (hidden files and folders skipped).

    A broken link, a link loop, an unreadable folder or (with ``roots``) a path leading outside
    the data roots raises DatasetError naming it."""
    check_inside(root, roots)
    stats: dict[Path, os.stat_result] = {}
    class_dirs, stray = [], []
    for path in folder_entries(root):
        if is_hidden(path.name):
            continue
        stats[path] = entry_stat(path, roots)
        (class_dirs if stat.S_ISDIR(stats[path].st_mode) else stray).append(path)
    if not class_dirs:
        raise DatasetError(
            f"dataset folder {root} has no class sub-folders: put the images of each class in "
            f"their own folder, e.g. {root / 'Forest' / 'image_1.tif'}"
        )
    files_by_class, ignored = [], []
    resolved: dict[Path, str] = {}
    for class_dir in class_dirs:
        files, linked_dirs = walk_visible_files(class_dir, roots, stats, resolved)
        ignored.extend(linked_dirs)
        files_by_class.append(tuple(f for f in files if is_image_file(f)))
        ignored.extend(f for f in files if not is_image_file(f))
    every_file = sorted(stray + ignored + [f for files in files_by_class for f in files])
    return FolderListing(
        root=root,
        # A folder name that is not UTF-8 names its class with those bytes escaped (caf\xe9): a class
        # name is recorded and shown as text.
        class_names=tuple(utf8_name(d.name) for d in class_dirs),
        files_by_class=tuple(files_by_class),
        ignored_files=tuple(sorted(ignored)),
        stray_files=tuple(stray),
        fingerprint=tuple(file_fingerprint(f, root, stats[f], resolved.get(f)) for f in every_file if f in stats),
        roots=tuple(roots) if roots is not None else None,
    )


def file_fingerprint(path: Path, root: Path, result: os.stat_result, resolved: str | None) -> tuple:
    """What the cache key holds of one file. Size and times alone would keep the key when a link is
    pointed at another image of the same size and time; the file's device and inode, its change
    time (which no user can set back) and the path it resolves to do not."""
    return (str(path.relative_to(root)), result.st_size, result.st_mtime_ns, result.st_ctime_ns, result.st_dev,
            result.st_ino, resolved if resolved is not None else str(path))


def walk_visible_files(folder: Path, roots: list[Path] | None, stats: dict[Path, os.stat_result],
                       resolved: dict[Path, str] | None = None) -> tuple[list[Path], list[Path]]:
    """(visible files under ``folder``, links to folders found below it, which are not followed),
    each file's stat put in ``stats`` and, where a link leads to it (the file or ``folder``), the
    path it resolves to in ``resolved``. A class folder may itself be a link; below it, only real
    folders are walked, so a link there can never lead the walk round in a loop."""
    real_folder = os.path.realpath(folder) if folder.is_symlink() else None
    found, linked_dirs, pending = [], [], [folder]
    while pending:
        current = pending.pop()
        subfolders = []
        for path in folder_entries(current):
            if is_hidden(path.name):
                continue
            result = entry_stat(path, roots)
            if stat.S_ISDIR(result.st_mode):
                (linked_dirs if path.is_symlink() else subfolders).append(path)
            else:
                stats[path] = result
                found.append(path)
                if resolved is not None:
                    if path.is_symlink():
                        resolved[path] = os.path.realpath(path)
                    elif real_folder is not None:
                        resolved[path] = os.path.join(real_folder, path.relative_to(folder))
        pending.extend(reversed(subfolders))
    return found, linked_dirs


def listing_problems(listing: FolderListing) -> list[str]:
    """Why ``listing`` cannot be trained on, in words; empty when it can."""
    problems = []
    if len(listing.class_names) < 2:
        what = "label" if listing.layout == "list" else "class sub-folder"
        problems.append(
            f"{listing.described} has {len(listing.class_names)} {what} "
            f"({', '.join(map(shown_name, listing.class_names))}); a classifier needs at least 2"
        )
    if listing.val_files_by_class is not None:  # an official split: every class needs one training image
        problems += [f"class {name!r} in {listing.root} has no training image; every class needs at least one"
                     for name, files in zip(listing.class_names, listing.files_by_class) if not files]
        if not listing.num_val_images:
            problems.append(f"the validation split ({listing.val_source}) holds no image: add images to it")
    else:
        for name, files in zip(listing.class_names, listing.files_by_class):
            if len(files) < MIN_IMAGES_PER_CLASS:
                problems.append(
                    f"class {name!r} in {listing.root} has {len(files)} image(s); every class needs at least "
                    f"{MIN_IMAGES_PER_CLASS} so that both train and val get one"
                )
    too_many = too_many_images(listing.root, listing.num_images)
    if too_many:
        problems.append(too_many)
    return problems


def stored_format(listing: FolderListing, bands: tuple[int, ...] | None,
                  band_scale: float | None) -> tuple[int, int] | None:
    """(channels, bytes per value) the cache will store, judged from the first file; None for no files."""
    first = listing.first_file()
    if first is None:
        return None
    native = describe_image_file(first, list(listing.roots) if listing.roots is not None else None)
    channels = len(bands) if bands else len(native["default_bands"])
    eight_bit = native["dtype"] == "uint8" and native["default_scale"] == 255.0 and band_scale in (None, 255.0)
    return channels, 1 if eight_bit else 2


def decoded_size(listing: FolderListing, image_size: int, bands, band_scale) -> int:
    """Bytes the decoded folder takes in the cache (from its first file's format)."""
    stored = stored_format(listing, bands, band_scale)
    return 0 if stored is None else decoded_bytes(listing.num_images, stored[0], image_size, stored[1])


def memory_problem(listing: FolderListing, image_size: int, bands: tuple[int, ...] | None,
                   band_scale: float | None) -> str | None:
    """Why decoding ``listing`` at ``image_size`` is refused by PARALLAX_MAX_DECODED_MB, judged from its first file."""
    stored = stored_format(listing, bands, band_scale)
    if stored is None:
        return None
    return too_large_decoded(listing.root, listing.num_images, stored[0], image_size, stored[1])


def listing_warnings(listing: FolderListing) -> list[str]:
    warnings = list(listing.notes)
    if listing.ignored_files:
        example = listing.ignored_files[0].relative_to(listing.root)
        warnings.append(f"ignored {len(listing.ignored_files)} files that are not images (e.g. {shown_name(example)})")
    if listing.stray_files:
        example = listing.stray_files[0].name
        warnings.append(f"ignored {len(listing.stray_files)} files outside the class folders (e.g. {shown_name(example)})")
    # A list file's images are named from the list's folder (and may lie outside it, as the list says).
    base = listing.root.parent if listing.layout == "list" else listing.root
    not_utf8 = [relative for files in listing.files_by_class for f in files
                if not is_utf8(relative := os.path.relpath(f, base))]
    if not_utf8:
        warnings.append(f"{len(not_utf8)} image files have names (or class folders) that are not UTF-8, e.g. "
                        f"{shown_name(not_utf8[0])}: they are read as they are, and named with those bytes escaped")
    return warnings


class NotEightBit(Exception):
    """A file decoded to float16 in a cache started as uint8 (its first files were 8-bit)."""


def decode_image_folder(listing: FolderListing, image_size: int, bands: tuple[int, ...] | None,
                        band_scale: float | None, writer: ImageWriter) -> PoolParts:
    """Decode every image into ``writer``, a chunk at a time: memory holds one chunk, never the set."""
    problems = listing_problems(listing)
    if problems:
        raise DatasetError("; ".join(problems))
    paths, labels = listing.labelled_files()
    labels = np.asarray(labels, dtype=np.int64)
    stored = stored_format(listing, bands, band_scale)
    with image_decoder(len(paths), image_size, bands, band_scale, listing.roots) as decode_many:
        try:
            sizes = write_decoded(paths, decode_many, writer, image_size, np.uint8 if stored[1] == 1 else np.float16)
        except NotEightBit:  # rare: a 16-bit file among 8-bit ones; the whole set is stored as float16
            sizes = write_decoded(paths, decode_many, writer, image_size, np.float16)
    return PoolParts(labels, listing.class_names, tuple(listing_warnings(listing) + size_warnings(sizes, image_size)),
                     num_test=listing.num_val_images)


def write_decoded(paths: list[Path], decode_many, writer: ImageWriter, image_size: int, dtype) -> set:
    """Decode ``paths`` in chunks and write each as ``dtype``; returns the native sizes seen."""
    sizes, first_channels = set(), None
    for start in range(0, len(paths), CHUNK_FILES):
        chunk_paths = paths[start:start + CHUNK_FILES]
        decoded = decode_many(chunk_paths)
        for image, path in zip(decoded, chunk_paths):
            if first_channels is None:
                first_channels = (image.pixels.shape[0], path)
                writer.start(len(paths), first_channels[0], image_size, dtype)
            if image.pixels.shape[0] != first_channels[0]:
                raise DatasetError(
                    f"images have different channel counts after band selection: {first_channels[1]} has "
                    f"{first_channels[0]}, {path} has {image.pixels.shape[0]}; give bands that every file has, "
                    "or keep one kind of file")
            sizes.add(image.native_size)
        writer.write(stack_decoded(decoded, dtype))
    return sizes


@contextlib.contextmanager
def image_decoder(count: int, image_size: int, bands, band_scale, roots=None):
    """A function decoding a list of paths, in a process pool for large sets (started once, used per chunk)."""
    decode = partial(decode_image_file, image_size=image_size, bands=bands, band_scale=band_scale,
                     roots=list(roots) if roots is not None else None)
    workers = usable_cpu_count()
    # A daemonic process (e.g. a DataLoader worker) may not start children.
    if (count < MIN_FILES_FOR_POOL or workers < 2 or multiprocessing.current_process().daemon
            or "fork" not in multiprocessing.get_all_start_methods()):
        yield lambda paths: [decode(path) for path in paths]
        return
    # fork starts workers in milliseconds; spawn would re-import torch in each one (seconds).
    context = multiprocessing.get_context("fork")
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=use_one_torch_thread)
    try:
        yield lambda paths: list(pool.map(decode, paths, chunksize=max(1, min(64, len(paths) // (4 * workers)))))
    finally:
        # On a bad file, do not wait for the rest of the set to decode before reporting it.
        pool.shutdown(wait=True, cancel_futures=True)


def decode_files(paths: list[Path], image_size: int, bands, band_scale, roots=None) -> list[DecodedImage]:
    with image_decoder(len(paths), image_size, bands, band_scale, roots) as decode_many:
        return decode_many(paths)


def usable_cpu_count() -> int:
    # os.cpu_count() counts the whole machine; a container or taskset may allow fewer.
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def use_one_torch_thread() -> None:
    # Each worker resizes one small image at a time; threads inside it would only fight the other workers.
    torch.set_num_threads(1)
    # A decoder whose parent was killed (e.g. by a memory cgroup) would otherwise wait for work forever.
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def stack_decoded(decoded: list[DecodedImage], dtype) -> np.ndarray:
    """One chunk of decoded images as (n, C, S, S) ``dtype``; 8-bit images join a float16 store in [0, 1]."""
    if dtype == np.uint8:
        if any(image.pixels.dtype != np.uint8 for image in decoded):
            raise NotEightBit()
        return np.stack([image.pixels for image in decoded])
    return np.stack([image.pixels if image.pixels.dtype == np.float16 else image.pixels.astype(np.float16) / 255
                     for image in decoded]).astype(np.float16)


def size_warnings(native_sizes: set, image_size: int) -> list[str]:
    sizes = sorted(native_sizes)
    if len(sizes) < 2:
        return []
    shown = ", ".join(f"{h}x{w}" for h, w in sizes[:3]) + (", ..." if len(sizes) > 3 else "")
    return [f"images had {len(sizes)} different sizes ({shown}); all were resized to {image_size}x{image_size}"]
