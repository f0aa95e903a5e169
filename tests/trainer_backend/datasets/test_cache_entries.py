"""What the dataset cache trusts on disk: the key follows what a folder's links resolve to, and a
cache entry that is not a regular file (a named pipe, a folder) or a cache folder that is a file
is named in one line, never waited on forever.

    .venv/bin/python -m pytest tests/trainer_backend/datasets/test_cache_entries.py -q
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from trainer_backend.datasets import DatasetError, prepare_data

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


WAIT_S = 60  # far longer than any of these takes; past it, the pipe is released and the test fails


def prepare_within(dataset: str, fifos: list[Path], **options):
    """``prepare_data(dataset)`` in a thread: its result or error, or a failure when it is still waiting
    after WAIT_S (then every pipe in ``fifos`` is given a writer and a reader so that the thread ends)."""
    outcome: dict = {}

    def prepare():
        try:
            outcome["data"] = prepare_data(dataset, **options)
        except Exception as exc:  # the test asserts on it
            outcome["error"] = exc

    preparing = threading.Thread(target=prepare, daemon=True)
    preparing.start()
    preparing.join(WAIT_S)
    if preparing.is_alive():
        for fifo in fifos:
            for flags in (os.O_WRONLY | os.O_NONBLOCK, os.O_RDONLY | os.O_NONBLOCK):
                with contextlib.suppress(OSError):
                    os.close(os.open(fifo, flags))
        preparing.join(WAIT_S)
        pytest.fail(f"prepare_data waited {WAIT_S} s on a named pipe among {fifos}")
    return outcome


def solid_set(root: Path) -> Path:
    for name, rgb in (("a", (250, 0, 0)), ("b", (0, 0, 250))):
        (root / name).mkdir(parents=True)
        for i in range(4):
            write_solid_bmp(root / name / f"img_{i}.bmp", rgb)
    return root


def replace_with(path: Path, kind: str) -> None:
    if path.is_dir():
        path.rmdir()
    elif path.exists() or path.is_symlink():
        path.unlink()
    if kind == "pipe":
        os.mkfifo(path)
    else:
        path.mkdir()


@pytest.mark.parametrize("kind", ["pipe", "folder"])
@pytest.mark.parametrize("entry", [".meta.npz", ".npy", ".lock", "split"])
def test_a_cache_file_that_is_not_a_regular_file_is_named_in_one_line(parallax_home, tmp_path, entry, kind):
    root = solid_set(tmp_path / "set")
    first = prepare_data(str(root), image_size=16, val_from="train")
    images = Path(first.info.cache_file)
    base = images.with_name(images.name.removesuffix(".npy"))
    if entry == "split":
        (path,) = images.parent.glob("*-split-*")
    else:
        path = base.with_name(base.name + entry)
        if entry == ".lock":
            base.with_name(base.name + ".meta.npz").unlink()  # so that the entry is rebuilt under the lock
    replace_with(path, kind)
    outcome = prepare_within(str(root), [path] if kind == "pipe" else [], image_size=16, val_from="train")
    error = outcome.get("error")
    assert isinstance(error, DatasetError), outcome
    shown = "a named pipe" if kind == "pipe" else "a folder"
    assert str(error) == (f"the dataset cache file {path} is {shown}, not a regular file: it is not read; remove it "
                          "(the entry is then decoded again), or set PARALLAX_DATA_DIR to another folder")
    path.rmdir() if kind == "folder" else path.unlink()  # removed as the line says, the entry is decoded again
    assert torch.equal(prepare_data(str(root), image_size=16, val_from="train").val.images, first.val.images)


def test_a_file_where_the_cache_folder_should_be_is_named_in_one_line(parallax_home, tmp_path):
    root = solid_set(tmp_path / "set")
    cache = parallax_home / "data" / "cache"
    cache.parent.mkdir(parents=True)
    cache.write_text("not a folder")
    with pytest.raises(DatasetError) as caught:
        prepare_data(str(root), image_size=16)
    assert str(caught.value) == (f"the dataset cache folder {cache} is a regular file, not a folder: move it away "
                                 "(the cache is made there again), or set PARALLAX_DATA_DIR to another folder")
