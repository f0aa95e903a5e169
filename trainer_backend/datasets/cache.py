"""Decode a dataset once: the decoded pool is saved under ``data_dir()/cache`` and loaded after that.

The key hashes everything that changes the decoded pixels: the source fingerprint (every file's
relative path, size and mtime), image size, bands, scale and ``CACHE_FORMAT``. A lock file makes
concurrent processes (DDP ranks, two runs) take turns: one decodes, the others wait and load.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import torch

from db.settings import data_dir

from trainer_backend.datasets.base import DecodedPool

# Bump when the decoding or the saved layout changes, so old caches are not read as new ones.
CACHE_FORMAT = 1


def cache_dir() -> Path:
    path = data_dir() / "cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


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
    slug = re.sub(r"[^A-Za-z0-9_-]+", "_", label).strip("_")[:40] or "dataset"
    return cache_dir() / f"{slug}-{key[:24]}.pt"


@contextlib.contextmanager
def exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path``; released when the block ends or the process dies."""
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def load_or_build(path: Path, build: Callable[[], DecodedPool]) -> tuple[DecodedPool, bool]:
    """The pool saved at ``path``, or ``build()``'s result saved there. Returns (pool, was_cached)."""
    pool = load_pool(path)
    if pool is not None:
        return pool, True
    with exclusive_lock(path.with_suffix(".lock")):
        pool = load_pool(path)  # another process may have built it while this one waited
        if pool is not None:
            return pool, True
        pool = build()
        save_pool(pool, path)
        return pool, False


def load_pool(path: Path) -> DecodedPool | None:
    if not path.exists():
        return None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # a truncated or foreign file is rebuilt, never trusted
        return None
    if not isinstance(saved, dict) or saved.get("format") != CACHE_FORMAT:
        return None
    return DecodedPool(
        images=saved["images"],
        labels=saved["labels"],
        class_names=tuple(saved["class_names"]),
        warnings=tuple(saved["warnings"]),
        pixel_sums=saved["pixel_sums"],
        pixel_sq_sums=saved["pixel_sq_sums"],
    )


def save_pool(pool: DecodedPool, path: Path) -> None:
    """Write to a temporary file and rename, so a reader never sees half a cache."""
    contents = {
        "format": CACHE_FORMAT,
        "images": pool.images,
        "labels": pool.labels,
        "class_names": list(pool.class_names),
        "warnings": list(pool.warnings),
        "pixel_sums": pool.pixel_sums,
        "pixel_sq_sums": pool.pixel_sq_sums,
    }
    handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as temp_file:
            torch.save(contents, temp_file)
        os.chmod(temp_name, 0o644)  # mkstemp makes it owner-only; other users' runs may share the cache
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
