"""How much of a dataset folder Parallax will decode, and what a set larger than memory costs.

A folder is decoded once into a cache file on disk that every process maps (cache.py), so a set
larger than memory trains: batches are gathered from the file and the disk serves what the page
cache cannot hold (``streaming_note`` says so in the run's notes). What limits a set is the free
disk space of the cache folder (checked before decoding, in cache.py) and two limits, refused
with a message that says how big the set is and how to raise the limit:

- ``PARALLAX_MAX_IMAGES`` (default 2,000,000 images)
- ``PARALLAX_MAX_DECODED_MB`` (default: no limit), checked against
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
    return _env_limit("PARALLAX_MAX_DECODED_MB", 2**42) * 2**20


def cgroup_memory_limit() -> int | None:
    """This process's memory cgroup limit in bytes (v2 ``memory.max`` or v1 ``memory.limit_in_bytes``),
    or None when it has none that can be read."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, group = parts
        if controllers == "":
            candidates = [Path("/sys/fs/cgroup") / group.lstrip("/") / "memory.max"]
        elif "memory" in controllers.split(","):
            candidates = [Path("/sys/fs/cgroup/memory") / group.lstrip("/") / "memory.limit_in_bytes"]
        else:
            continue
        for candidate in candidates:
            try:
                text = candidate.read_text().strip()
            except OSError:
                continue
            if text.isdigit() and int(text) < 2**60:  # v1 writes "no limit" as a huge number, v2 as "max"
                limits.append(int(text))
    return min(limits) if limits else None


def memory_limit_bytes() -> tuple[int, str]:
    """The memory this process may use and where that limit comes from."""
    physical, group = physical_memory_bytes(), cgroup_memory_limit()
    if group is not None and group < physical:
        return group, "its memory cgroup's limit"
    return physical, "this machine's memory"


def streaming_note(size: int, path: Path | None) -> str | None:
    """A note for a cached set too large to stay in the page cache, saying what reading it costs."""
    limit, source = memory_limit_bytes()
    if size <= limit // 2:
        return None
    return (f"the decoded set ({size / 2**30:.2f} GiB) is more than half of the {limit / 2**30:.2f} GiB this run may use "
            f"({source}): batches stream from the cache file {path} on disk, and each epoch re-reads from disk what "
            f"the page cache cannot keep, up to {size / 2**30:.2f} GiB an epoch ({size / 500e6:.0f} s at 500 MB/s), "
            "so epochs may be bounded by the disk's read speed")


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
    return (f"dataset folder {root} would take {size / 2**30:.1f} GiB decoded at image_size "
            f"{image_size} ({count:,} images x {channels} channels), more than the {limit / 2**30:.1f} GiB allowed "
            "(PARALLAX_MAX_DECODED_MB): use a smaller image_size or a subset, or raise PARALLAX_MAX_DECODED_MB")
