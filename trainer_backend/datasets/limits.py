"""How much of a dataset folder Parallax will decode, and what a set larger than memory costs.

A folder is decoded once into a cache file on disk that every process maps (cache.py), so a set
larger than memory trains: batches are gathered from the file and the disk serves what the page
cache cannot hold (``streaming_note`` says so in the run's notes). What limits a set is the free
disk space of the cache folder (checked before decoding, in cache.py) and two limits, refused
with a message that says how big the set is and how to raise the limit:

- ``PARALLAX_MAX_IMAGES`` (default 2,000,000 images)
- ``PARALLAX_MAX_DECODED_MB`` (default: no limit), checked against
  images x channels x image_size² x bytes per value (1 for 8-bit sources, 2 otherwise)

A third, ``PARALLAX_MAX_IMAGE_MB`` (default 1024 MB), is what decoding one file may cost: the
whole decode's peak (``decode_peak_bytes``: the decoder's own buffer, the copy taken of it and the
float copy the resize works on), judged from the file's header before any pixel is decoded. A few
kilobytes of tiled TIFF can declare tens of gigabytes, and a small PNG of 8000 x 8000 hundreds of
megabytes; an image far larger than the size it is stored at is shrunk by whole factors in its own
dtype first (``reduction_factor``), so that the float copy is of the shrunk image.
"""

from __future__ import annotations

import os
from pathlib import Path

from contract.environment import whole_number_from_env

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


def reduction_factor(height: int, width: int, target: int | None) -> int:
    """The whole factor an image of ``height`` x ``width`` is shrunk by (box average, in its own
    dtype) before it is resized to ``target``: the image stays at least twice ``target`` on each
    side, so the antialiased resize still does the last step, and an image under four times
    ``target`` is not shrunk at all (its pixels are those of the resize alone)."""
    if not target:
        return 1
    return max(1, min(int(height), int(width)) // (2 * int(target)))


def decode_peak_bytes(shape: tuple[int, ...], bytes_per_value: int, target: int | None,
                      decoder_bytes: int | None = None) -> int:
    """The most memory decoding one image of ``shape`` (height, width, bands) takes at once:
    the decoder's buffer (``decoder_bytes``, else the pixels themselves), plus the pixels taken out
    of it (shrunk by ``reduction_factor`` where they are) and, when resized to ``target``, their
    float32 copy and the resized result."""
    height, width = int(shape[0]), int(shape[1])
    values = 1
    for extent in shape:
        values *= int(extent)
    bands = values // max(1, height * width)
    factor = reduction_factor(height, width, target)
    kept = -(-height // factor) * -(-width // factor) * bands
    peak = (decoder_bytes if decoder_bytes is not None else values * bytes_per_value) + kept * bytes_per_value
    if target:
        peak += kept * 4 + 2 * bands * int(target) ** 2 * 4
    return peak


def too_large_image(path: Path | str, shape: tuple[int, ...], bytes_per_value: int, target: int | None = None,
                    decoder_bytes: int | None = None) -> str | None:
    """Why one image whose header declares ``shape`` is refused before decoding (its decode's
    peak, ``decode_peak_bytes``, over ``PARALLAX_MAX_IMAGE_MB``), or None."""
    peak, limit = decode_peak_bytes(shape, bytes_per_value, target, decoder_bytes), max_image_bytes()
    if peak <= limit:
        return None
    size = bytes_per_value
    for extent in shape:
        size *= int(extent)
    shown = " x ".join(str(int(extent)) for extent in shape)
    return (f"image {path} declares {shown} pixels ({size / 2**30:.1f} GiB decoded, {peak / 2**20:,.0f} MiB at "
            f"the decode's peak), more than the {limit / 2**20:.0f} MiB one image may take (PARALLAX_MAX_IMAGE_MB): "
            "it is not decoded; remove it from the folder, or raise PARALLAX_MAX_IMAGE_MB if it is genuine")


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
