"""How much of a dataset folder Parallax will decode into memory.

A folder is decoded whole into one tensor before training, so a folder far larger than memory
would be read until the machine swaps or the kernel kills the run. Two limits refuse it first,
with a message that says how big it is and how to raise the limit:

- ``PARALLAX_MAX_IMAGES`` (default 2,000,000 images)
- ``PARALLAX_MAX_DECODED_MB`` (default: half of this machine's memory), checked against
  images x channels x image_size² x bytes per value (1 for 8-bit sources, 2 otherwise)

A third refuses one file whose header declares more than ``PARALLAX_MAX_IMAGE_MB`` (default
1024 MB) of pixels, before it is decoded: a few kilobytes of tiled TIFF can declare tens of gigabytes.
"""

from __future__ import annotations

import os
from pathlib import Path

from db.settings import whole_number_from_env

from trainer_backend.datasets.errors import DatasetError

DEFAULT_MAX_IMAGES = 2_000_000
DEFAULT_MAX_IMAGE_MB = 1024


def _env_limit(name: str, default: int) -> int:
    try:
        return whole_number_from_env(name, default, low=1, high=2**62)
    except ValueError as exc:
        raise DatasetError(str(exc)) from None


def physical_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def max_images() -> int:
    return _env_limit("PARALLAX_MAX_IMAGES", DEFAULT_MAX_IMAGES)


def max_decoded_bytes() -> int:
    return _env_limit("PARALLAX_MAX_DECODED_MB", physical_memory_bytes() // 2 // 2**20) * 2**20


def max_image_bytes() -> int:
    return _env_limit("PARALLAX_MAX_IMAGE_MB", DEFAULT_MAX_IMAGE_MB) * 2**20


def too_large_image(path: Path | str, shape: tuple[int, ...], bytes_per_value: int) -> str | None:
    """Why one image whose header declares ``shape`` is refused before decoding, or None."""
    size, limit = bytes_per_value, max_image_bytes()
    for extent in shape:
        size *= int(extent)
    if size <= limit:
        return None
    shown = " x ".join(str(int(extent)) for extent in shape)
    return (f"image {path} declares {shown} pixels ({size / 2**30:.1f} GiB decoded), more than the "
            f"{limit / 2**20:.0f} MiB one image may take (PARALLAX_MAX_IMAGE_MB): it is not decoded; "
            "remove it from the folder, or raise PARALLAX_MAX_IMAGE_MB if it is genuine")


def too_many_images(root: Path | str, count: int) -> str | None:
    limit = max_images()
    if count <= limit:
        return None
    return (f"dataset folder {root} has {count:,} images, more than the {limit:,} Parallax decodes "
            "(PARALLAX_MAX_IMAGES): use a subset, or raise PARALLAX_MAX_IMAGES if the machine has the memory")


def decoded_bytes(count: int, channels: int, image_size: int, bytes_per_value: int) -> int:
    return count * channels * image_size * image_size * bytes_per_value


def too_large_decoded(root: Path | str, count: int, channels: int, image_size: int, bytes_per_value: int) -> str | None:
    size, limit = decoded_bytes(count, channels, image_size, bytes_per_value), max_decoded_bytes()
    if size <= limit:
        return None
    return (f"dataset folder {root} would take {size / 2**30:.1f} GiB in memory decoded at image_size "
            f"{image_size} ({count:,} images x {channels} channels), more than the {limit / 2**30:.1f} GiB allowed "
            "(PARALLAX_MAX_DECODED_MB, default half the machine's memory): use a smaller image_size or a subset, "
            "or raise PARALLAX_MAX_DECODED_MB")
