"""What the dataset cache trusts on disk: the key follows what a folder's links resolve to, and a
cache entry that is not a regular file (a named pipe, a folder) or a cache folder that is a file
is named in one line, never waited on forever.

    .venv/bin/python -m pytest tests/trainer_backend/datasets/test_cache_entries.py -q
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from trainer_backend.datasets import prepare_data

pytestmark = pytest.mark.usefixtures("own_data_dir")

SAME_TIME_NS = 1_700_000_000_000_000_000


def write_solid_bmp(path: Path, rgb: tuple[int, int, int], size: int = 16) -> None:
    Image.fromarray(np.full((size, size, 3), rgb, dtype=np.uint8), mode="RGB").save(path)
    os.utime(path, ns=(SAME_TIME_NS, SAME_TIME_NS))


def mean_red_by_class(data) -> dict[int, float]:
    images = np.concatenate([data.train.images.numpy(), data.val.images.numpy()])
    labels = np.concatenate([data.train.labels.numpy(), data.val.labels.numpy()])
    return {label: float(images[labels == label, 0].mean()) for label in (0, 1)}


def point_links(folder: Path, targets: list[Path]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for index, target in enumerate(targets):
        link = folder / f"img_{index}.bmp"
        if link.is_symlink():
            link.unlink()
        link.symlink_to(target)


def test_links_pointed_at_other_images_of_the_same_size_and_time_change_the_key(parallax_home, tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    reds = [store / f"red_{i}.bmp" for i in range(4)]
    blues = [store / f"blue_{i}.bmp" for i in range(4)]
    for red, blue in zip(reds, blues):
        write_solid_bmp(red, (250, 0, 0))
        write_solid_bmp(blue, (0, 0, 250))
    assert {p.stat().st_size for p in reds} == {p.stat().st_size for p in blues}  # same size, same time
    root = tmp_path / "set"
    point_links(root / "a", reds)
    point_links(root / "b", blues)
    first = prepare_data(str(root), image_size=16)
    assert mean_red_by_class(first) == {0: 250.0, 1: 0.0}
    point_links(root / "a", blues)  # the same names, sizes and times: other pixels
    point_links(root / "b", reds)
    again = prepare_data(str(root), image_size=16)
    assert again.info.cache_file != first.info.cache_file
    assert mean_red_by_class(again) == {0: 0.0, 1: 250.0}


def test_a_class_folder_link_pointed_at_another_folder_changes_the_key(parallax_home, tmp_path):
    for name, rgb in (("reds", (250, 0, 0)), ("blues", (0, 0, 250)), ("greens", (0, 250, 0))):
        (tmp_path / name).mkdir()
        for i in range(4):
            write_solid_bmp(tmp_path / name / f"img_{i}.bmp", rgb)
    root = tmp_path / "set"
    root.mkdir()
    (root / "a").symlink_to(tmp_path / "reds")
    (root / "b").symlink_to(tmp_path / "greens")
    first = prepare_data(str(root), image_size=16)
    (root / "a").unlink()
    (root / "a").symlink_to(tmp_path / "blues")
    again = prepare_data(str(root), image_size=16)
    assert mean_red_by_class(first)[0] == 250.0 and mean_red_by_class(again)[0] == 0.0
