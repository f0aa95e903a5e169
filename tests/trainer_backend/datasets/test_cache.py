"""The dataset cache on real disks: one file mapped read-only by every process, and full or
read-only cache folders ending in one line that names the folder (small tmpfs mounts, as root)."""

from __future__ import annotations

import contextlib
import pickle
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer_backend.datasets import DatasetError, prepare_data
from trainer_backend.datasets import cache as cache_module
from trainer_backend.datasets.decoded import make_pool

pytestmark = pytest.mark.usefixtures("own_data_dir")


def mapped_rss_kb(path: Path) -> int | None:
    """Resident kB of this process's mappings of ``path`` (None when it is not mapped)."""
    total, inside = None, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 5 and "-" in fields[0] and ":" in fields[3]:  # a mapping's header line
            inside = line.endswith(str(path))
        elif inside and fields[0] == "Rss:":
            total = (total or 0) + int(fields[1])
    return total


def test_train_and_val_are_index_lists_over_one_mapped_file(parallax_home):
    data = prepare_data("digits", image_size=16)
    path = Path(data.info.cache_file)
    assert path.suffix == ".npy" and path.stat().st_size > 1797 * 256
    # One pool for both splits, file-backed: nothing was copied into this process.
    assert data.train.pool_images.data_ptr() == data.val.pool_images.data_ptr()
    assert sorted(torch.cat([data.train.indices, data.val.indices]).tolist()) == list(range(1797))
    assert np.array_equal(np.load(path)[data.val.indices[:5].numpy()], data.val.images[:5].numpy())
    # A loader worker started by spawn gets the path, not the pixels, and maps the file itself.
    pickled = pickle.dumps(data.train)
    assert len(pickled) < 1797 * 256 // 4
    copy = pickle.loads(pickled)
    assert torch.equal(copy.__getitems__([0, 5, 9])[0], data.train.__getitems__([0, 5, 9])[0])
    assert mapped_rss_kb(path) is not None


def test_loading_a_cached_set_reads_no_pixels(parallax_home):
    prepare_data("digits", image_size=16)
    data = prepare_data("digits", image_size=16)  # what the launcher's preflight and every rank do
    path = Path(data.info.cache_file)
    assert mapped_rss_kb(path) == 0, "the mapping was touched"
    data.train.__getitems__(list(range(64)))
    assert mapped_rss_kb(path) > 0


def test_a_truncated_cache_is_rebuilt_not_read(parallax_home):
    first = prepare_data("digits", image_size=16)
    path = Path(first.info.cache_file)
    expected = first.val.images.clone()
    del first
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)
    again = prepare_data("digits", image_size=16)
    assert torch.equal(again.val.images, expected)
    assert path.stat().st_size > 1797 * 256


@contextlib.contextmanager
def mounted_tmpfs(path: Path, *options: str):
    path.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(path)], check=False,
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip() or 'mount failed'}): needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def remount(path: Path, option: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{option}", str(path)], check=True)


def no_partial_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.suffix == ".tmp" or ".tmp" in p.name]


def test_a_cache_larger_than_the_free_space_is_refused_before_decoding(parallax_home, tmp_path, monkeypatch):
    with mounted_tmpfs(tmp_path / "small", "size=4m") as folder:
        monkeypatch.setenv("PARALLAX_DATA_DIR", str(folder))
        with pytest.raises(DatasetError) as raised:
            prepare_data("digits", image_size=64)  # 7.4 MB decoded
        message = str(raised.value)
        assert "\n" not in message and f"in {folder / 'cache'} but only" in message
        assert not list((folder / "cache").glob("*.npy")) and not no_partial_files(folder)


def test_a_disk_filling_mid_write_ends_in_one_line_and_leaves_no_cache(parallax_home, tmp_path, monkeypatch):
    with mounted_tmpfs(tmp_path / "small", "size=4m") as folder:
        monkeypatch.setenv("PARALLAX_DATA_DIR", str(folder))
        base = cache_module.cache_path("big", "0" * 24)
        images = torch.full((600, 3, 64, 64), 7, dtype=torch.uint8)  # 7.4 MB: more than the disk
        def build(writer):
            return writer.write_pool(make_pool(images, [0, 1] * 300, ("a", "b")))
        with pytest.raises(DatasetError) as raised:
            cache_module.load_or_build(base, build, needed_bytes=0)  # an estimate that was wrong
        assert str(raised.value).startswith(f"disk full while writing the dataset cache in {folder / 'cache'} (")
        assert cache_module.load_pool(base) is None
        assert not list((folder / "cache").glob("*.npy")) and not no_partial_files(folder)


def test_a_read_only_data_folder_is_named_in_one_line(parallax_home, tmp_path, monkeypatch):
    with mounted_tmpfs(tmp_path / "ro", "ro", "size=1m") as folder:
        monkeypatch.setenv("PARALLAX_DATA_DIR", str(folder))
        with pytest.raises(DatasetError) as raised:
            prepare_data("digits", image_size=8)
        assert str(raised.value).startswith(f"the dataset cache folder {folder} is read-only (Read-only file system)")


def test_a_read_only_cache_is_read_and_what_it_lacks_is_named(parallax_home, tmp_path, monkeypatch):
    with mounted_tmpfs(tmp_path / "shared", "size=8m") as folder:
        monkeypatch.setenv("PARALLAX_DATA_DIR", str(folder))
        built = prepare_data("digits", image_size=8)
        remount(folder, "ro")
        again = prepare_data("digits", image_size=8)  # the entry and its split are there: nothing to write
        assert torch.equal(again.val.labels, built.val.labels)
        with pytest.raises(DatasetError) as split:
            prepare_data("digits", image_size=8, val_fraction=0.3)
        assert str(split.value).startswith(f"the dataset cache folder {folder / 'cache'} is read-only")
        assert "the dataset's split file cannot be written there" in str(split.value)
        with pytest.raises(DatasetError) as lock:
            prepare_data("digits", image_size=12)
        assert str(lock.value).startswith(f"the dataset cache folder {folder / 'cache'} is read-only")
        assert ".lock cannot be written there" in str(lock.value)
