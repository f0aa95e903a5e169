"""Datasets on real files: generated TIFF/PNG folders, idx and CIFAR pickle files, the real digits set."""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import pickle
import struct
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tifffile
import torch
from PIL import Image
from torch.utils.data import DataLoader

from trainer_backend.datasets import (
    BUILTIN_DATASETS,
    DatasetError,
    ImageTensorDataset,
    collate_batch,
    inspect_dataset,
    prepare_data,
)
from trainer_backend.datasets import cache as cache_module
from trainer_backend.datasets import folder as folder_module
from trainer_backend.datasets.decoded import make_pool

# Downloading, decoding and caching are what these tests check: datasets under each test's own home.
pytestmark = pytest.mark.usefixtures("own_data_dir")

CLASSES = ("AnnualCrop", "Forest", "River")


def band_values(class_index: int) -> np.ndarray:
    """13 band values for one class; bands 3, 2, 1 are the ones EuroSAT's defaults pick."""
    values = np.full(13, 100, dtype=np.uint16)
    values[3] = 6000               # above the 4000 scale: clipped to 1.0
    values[2] = 1000 * (class_index + 1)
    values[1] = 400
    return values


def expected_rgb(class_index: int) -> list[float]:
    return [1.0, (1000 * (class_index + 1)) / 4000, 400 / 4000]


def make_tiff_folder(root: Path, per_class: int = 8, size: int = 64) -> Path:
    for index, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            image = np.broadcast_to(band_values(index), (size, size, 13)).copy()
            if i % 2:  # planar files store the bands first; both layouts must read the same
                image = np.ascontiguousarray(np.moveaxis(image, -1, 0))
            tifffile.imwrite(root / name / f"{name}_{i}.tif", image)
    return root


def write_png(path: Path, pixels: np.ndarray, mode: str) -> None:
    Image.fromarray(pixels, mode=mode).save(path)


def stored_unit_pixels(data_split: ImageTensorDataset) -> torch.Tensor:
    images = data_split.images.float()
    return images / 255 if data_split.images.dtype == torch.uint8 else images


def test_digits_shapes_classes_and_stratified_split(parallax_home):
    data = prepare_data("digits", image_size=32)
    info = data.info
    assert (info.name, info.num_classes, info.in_chans, info.image_size) == ("digits", 10, 1, 32)
    assert (info.num_train, info.num_val) == (1437, 360)
    assert data.train.images.shape == (1437, 1, 32, 32) and data.train.images.dtype == torch.uint8
    pool_counts = Counter(data.train.labels.tolist()) + Counter(data.val.labels.tolist())
    val_counts = Counter(data.val.labels.tolist())
    for label, total in pool_counts.items():
        assert abs(val_counts[label] - 0.2 * total) <= 1
    again = prepare_data("digits", image_size=32)
    assert torch.equal(again.val.labels, data.val.labels)
    other_seed = prepare_data("digits", image_size=32, seed=1)
    assert not torch.equal(other_seed.val.labels, data.val.labels)


def test_a_cached_dataset_loads_its_split_without_importing_scikit_learn(parallax_home):
    """Every run after the first, and every DDP rank, loads the pool and its split from the cache;
    importing scikit-learn would add over a second to each process start."""
    import subprocess
    import sys

    first = prepare_data("digits", image_size=16)
    probe = ("import json, sys; from trainer_backend.datasets import prepare_data; "
             "d = prepare_data('digits', image_size=16); "
             "print(json.dumps([[m for m in ('sklearn', 'scipy') if m in sys.modules], d.val.labels.tolist()]))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[3])
    imported, val_labels = json.loads(done.stdout.strip().splitlines()[-1])
    assert imported == []
    assert val_labels == first.val.labels.tolist()  # the same split as the process that made it


def test_training_images_are_normalised_per_channel(parallax_home):
    data = prepare_data("digits", image_size=16)
    pixels, _ = data.train.__getitems__(list(range(len(data.train))))
    x = data.train.normalise(pixels)
    assert x.mean().item() == pytest.approx(0.0, abs=1e-3)
    assert x.std().item() == pytest.approx(1.0, abs=1e-2)


def test_getitems_matches_stacked_getitem(parallax_home):
    data = prepare_data("digits", image_size=16)
    indices = [5, 0, 17, 5, 1000]
    x, y = data.train.__getitems__(indices)
    one_by_one = [data.train[i] for i in indices]
    assert torch.equal(x, torch.stack([item[0] for item in one_by_one]))
    assert torch.equal(y, torch.stack([item[1] for item in one_by_one]))
    # The loader hands over pixels as stored; they are normalised on the device (trainer_backend/rank/inputs.py).
    assert x.dtype == torch.uint8 and y.dtype == torch.int64 and one_by_one[0][1].dim() == 0


@pytest.mark.processes  # DataLoader workers
@pytest.mark.parametrize("workers", [0, 1])
def test_dataloader_with_collate_batch_yields_batches(parallax_home, workers):
    data = prepare_data("digits", image_size=16)
    loader = DataLoader(data.val, batch_size=64, shuffle=False, collate_fn=collate_batch, num_workers=workers)
    batches = list(loader)
    assert [tuple(x.shape) for x, _ in batches[:1]] == [(64, 1, 16, 16)]
    assert sum(len(y) for _, y in batches) == 360
    assert torch.equal(torch.cat([y for _, y in batches]), data.val.labels)


def test_tiff_folder_picks_bands_scales_clips_and_resizes(parallax_home, tmp_path):
    root = make_tiff_folder(tmp_path / "eurosat")
    data = prepare_data(str(root), image_size=32)
    info = data.info
    assert (info.name, info.class_names, info.in_chans, info.image_size) == (str(root), CLASSES, 3, 32)
    assert (info.num_train, info.num_val) == (19, 5)
    assert data.train.images.shape[1:] == (3, 32, 32) and data.train.images.dtype == torch.float16
    for split in (data.train, data.val):
        pixels = stored_unit_pixels(split)
        for image, label in zip(pixels, split.labels.tolist()):
            expected = torch.tensor(expected_rgb(label)).view(3, 1, 1).expand(3, 32, 32)
            assert torch.allclose(image, expected, atol=1e-3), label
    pixels, _ = data.train.__getitems__([0, 1])
    assert pixels.dtype == torch.float16  # scaled bands are not 8-bit: they stay float16 until the device
    restored = data.train.normalise(pixels) * data.train.std.view(3, 1, 1) + data.train.mean.view(3, 1, 1)
    assert torch.allclose(restored, stored_unit_pixels(data.train)[:2], atol=1e-3)


def test_explicit_bands_and_scale(parallax_home, tmp_path):
    root = make_tiff_folder(tmp_path / "eurosat", per_class=4)
    data = prepare_data(str(root), image_size=8, bands=(0, 3), band_scale=10000)
    assert data.info.in_chans == 2
    pixel = stored_unit_pixels(data.train)[0, :, 0, 0]
    assert torch.allclose(pixel, torch.tensor([0.01, 0.6]), atol=1e-3)


def test_band_index_out_of_range_names_index_and_band_count(parallax_home, tmp_path):
    root = make_tiff_folder(tmp_path / "eurosat", per_class=2)
    with pytest.raises(DatasetError, match=r"band index 13 .*13 bands"):
        prepare_data(str(root), bands=(3, 13))


def test_png_folder_reads_rgb_drops_alpha_and_spreads_gray(parallax_home, tmp_path):
    root = tmp_path / "pets"
    for name, value in (("cat", 40), ("dog", 200)):
        (root / name).mkdir(parents=True)
        write_png(root / name / "rgb.png", np.full((16, 16, 3), (value, 10, 20), dtype=np.uint8), "RGB")
        write_png(root / name / "alpha.png", np.full((16, 16, 4), (value, 10, 20, 7), dtype=np.uint8), "RGBA")
        write_png(root / name / "gray.png", np.full((16, 16), value, dtype=np.uint8), "L")
    (root / "cat" / "notes.txt").write_text("not an image")
    data = prepare_data(str(root), image_size=16, val_fraction=0.34)
    assert data.info.in_chans == 3 and data.train.images.dtype == torch.uint8
    assert any("ignored 1 files that are not images" in w and "notes.txt" in w for w in data.info.warnings)
    pixels = sorted(map(tuple, torch.cat([data.train.images, data.val.images])[:, :, 0, 0].tolist()))
    cat = [(40, 10, 20), (40, 10, 20), (40, 40, 40)]         # rgb, rgba without its alpha, gray
    dog = [(200, 10, 20), (200, 10, 20), (200, 200, 200)]
    assert pixels == sorted(cat + dog)


def test_images_of_different_sizes_are_resized_with_a_warning(parallax_home, tmp_path):
    root = tmp_path / "mixed"
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        write_png(root / name / "small.png", np.zeros((20, 30, 3), dtype=np.uint8), "RGB")
        write_png(root / name / "large.png", np.zeros((64, 64, 3), dtype=np.uint8), "RGB")
    data = prepare_data(str(root), image_size=24, val_fraction=0.5)
    assert data.train.images.shape[1:] == (3, 24, 24)
    assert any("2 different sizes" in w and "24x24" in w for w in data.info.warnings)


def test_corrupt_tiff_names_the_file(parallax_home, tmp_path):
    root = make_tiff_folder(tmp_path / "eurosat", per_class=3)
    broken = root / "Forest" / "img_3.tif"
    broken.write_bytes(b"definitely not a tiff")
    with pytest.raises(DatasetError, match=f"cannot read image {broken}"):
        prepare_data(str(root))


@pytest.mark.processes  # the decoding pool
def test_pool_decoding_matches_serial_and_names_a_bad_file(parallax_home, tmp_path, monkeypatch):
    root = make_tiff_folder(tmp_path / "eurosat", per_class=4)
    serial = prepare_data(str(root), image_size=16)
    monkeypatch.setattr(folder_module, "MIN_FILES_FOR_POOL", 1)
    pooled = prepare_data(str(root), image_size=20)
    assert torch.allclose(pooled.train.mean, serial.train.mean, atol=1e-3)
    broken = root / "River" / "River_2.tif"
    broken.write_bytes(b"garbage")
    with pytest.raises(DatasetError, match=f"cannot read image {broken}"):
        prepare_data(str(root), image_size=16)


def test_channel_counts_that_differ_name_a_file_of_each(parallax_home, tmp_path):
    root = make_tiff_folder(tmp_path / "eurosat", per_class=2)
    tifffile.imwrite(root / "River" / "four_bands.tif", np.zeros((8, 8, 4), dtype=np.uint16))
    with pytest.raises(DatasetError, match=r"different channel counts.*four_bands\.tif has 4"):
        prepare_data(str(root))


def test_folder_errors_are_clear(parallax_home, tmp_path):
    with pytest.raises(DatasetError, match="neither a built-in dataset .*digits.* nor an existing folder"):
        prepare_data(str(tmp_path / "nowhere"))
    a_file = tmp_path / "file.json"
    a_file.write_text("x")
    with pytest.raises(DatasetError, match="not a directory.*or a .csv/.txt list file"):
        prepare_data(str(a_file))
    a_file = a_file.rename(tmp_path / "file.txt")  # a .txt is read as a list of path,label lines
    with pytest.raises(DatasetError, match="line 1 is x: expected path,label"):
        prepare_data(str(a_file))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetError, match="no class sub-folders"):
        prepare_data(str(empty))
    one_class = make_tiff_folder(tmp_path / "one", per_class=2)
    for name in CLASSES[1:]:
        for f in (one_class / name).iterdir():
            f.unlink()
        (one_class / name).rmdir()
    with pytest.raises(DatasetError, match="has 1 class sub-folder.*at least 2"):
        prepare_data(str(one_class))


def test_class_with_one_image_is_named(parallax_home, tmp_path):
    root = make_tiff_folder(tmp_path / "eurosat", per_class=3)
    for f in sorted((root / "Forest").iterdir())[1:]:
        f.unlink()
    with pytest.raises(DatasetError, match="class 'Forest' .* has 1 image"):
        prepare_data(str(root))


def test_hidden_files_and_folders_are_ignored(parallax_home, tmp_path):
    root = make_tiff_folder(tmp_path / "eurosat", per_class=2)
    (root / ".thumbnails").mkdir()
    (root / "Forest" / ".DS_Store").write_bytes(b"\0")
    data = prepare_data(str(root), val_fraction=0.5)
    assert data.info.num_classes == 3 and data.info.warnings == ()


def test_options_outside_their_range_are_refused(parallax_home):
    for bad in (dict(val_fraction=1.5), dict(image_size=0), dict(band_scale=-1.0), dict(bands=(-1,))):
        with pytest.raises(DatasetError, match="is not allowed"):
            prepare_data("digits", **bad)
    with pytest.raises(DatasetError, match="not to digits"):
        prepare_data("digits", bands=(0,))


def cache_files(home: Path) -> list[Path]:
    return sorted((home / "data" / "cache").glob("*.npy"))


def test_second_call_loads_the_cache_and_a_changed_file_changes_the_key(parallax_home, tmp_path):
    root = make_tiff_folder(tmp_path / "eurosat", per_class=4)
    first = prepare_data(str(root))
    assert len(cache_files(parallax_home)) == 1
    again = prepare_data(str(root))
    assert torch.equal(again.train.images, first.train.images) and len(cache_files(parallax_home)) == 1
    # Same size and mtime but other pixels: the change time, which no one can set back, changes the key.
    target = root / "AnnualCrop" / "AnnualCrop_0.tif"
    stat = target.stat()
    tifffile.imwrite(target, np.zeros((64, 64, 13), dtype=np.uint16))
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert target.stat().st_size == stat.st_size
    second = prepare_data(str(root))
    assert len(cache_files(parallax_home)) == 2
    darkest = [min(stored_unit_pixels(d.train).amin(), stored_unit_pixels(d.val).amin()) for d in (first, second)]
    assert darkest[1] == 0.0 < darkest[0]


def test_homes_sharing_a_data_dir_decode_a_set_once(parallax_home, tmp_path, monkeypatch):
    shared = tmp_path / "shared-data"
    monkeypatch.setenv("PARALLAX_DATA_DIR", str(shared))
    first = prepare_data("digits", image_size=8)
    monkeypatch.setenv("PARALLAX_HOME", str(tmp_path / "another-home"))
    monkeypatch.setattr(cache_module, "save_built", lambda *_: pytest.fail("decoded again"))
    second = prepare_data("digits", image_size=8)
    assert torch.equal(second.train.images, first.train.images)
    assert len(list((shared / "cache").glob("*.npy"))) == 1
    assert not (parallax_home / "data").exists() and not (tmp_path / "another-home" / "data").exists()


def test_a_data_dir_that_cannot_be_a_folder_is_refused_in_one_line(parallax_home, tmp_path, monkeypatch):
    taken = tmp_path / "a-file"
    taken.write_text("")
    monkeypatch.setenv("PARALLAX_DATA_DIR", str(taken))
    with pytest.raises(ValueError) as raised:
        prepare_data("digits", image_size=8)
    assert str(raised.value) == (f"PARALLAX_DATA_DIR={str(taken)!r} cannot be used: File exists; it must be a folder "
                                 "Parallax can create and write")


def build_slowly_in_child(path: str, record: str) -> None:
    def build():
        with open(record, "a") as out:
            out.write("built\n")
        time.sleep(0.5)
        return make_pool(torch.zeros(4, 1, 2, 2, dtype=torch.uint8), [0, 0, 1, 1], ("a", "b"))

    pool, _ = cache_module.load_or_build(Path(path), lambda writer: writer.write_pool(build()))
    assert pool.class_names == ("a", "b")


def test_two_processes_decode_once(parallax_home, tmp_path):
    path, record = cache_module.cache_dir() / "shared-key", tmp_path / "builds.txt"
    context = multiprocessing.get_context("fork")
    children = [context.Process(target=build_slowly_in_child, args=(str(path), str(record))) for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=20)
    assert [child.exitcode for child in children] == [0, 0]
    assert record.read_text() == "built\n"
    assert not list(path.parent.glob("*.tmp"))


def write_idx(path: Path, array: np.ndarray, compress: bool) -> None:
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        payload = gzip.compress(payload)
    path.write_bytes(payload)


def make_idx_set(raw: Path, count: int = 50, compress_train: bool = True) -> np.ndarray:
    raw.mkdir(parents=True)
    labels = np.arange(count) % 10
    images = (labels[:, None, None] * 20 + np.zeros((count, 28, 28))).astype(np.uint8)
    write_idx(raw / "train-images-idx3-ubyte", images, compress_train)
    write_idx(raw / "train-labels-idx1-ubyte", labels, compress_train)
    # The test images are one level brighter than training ones of their class: where they land tells the splits apart.
    write_idx(raw / "t10k-images-idx3-ubyte", images[:12] + 1, False)
    write_idx(raw / "t10k-labels-idx1-ubyte", labels[:12], False)
    return labels


@pytest.mark.parametrize("name, folder, compress", [("mnist", "MNIST", True), ("fashion_mnist", "FashionMNIST", False)])
def test_idx_files_in_torchvision_layout_load(parallax_home, name, folder, compress):
    make_idx_set(parallax_home / "data" / folder / "raw", compress_train=compress)
    assert inspect_dataset(name)["available_offline"]
    data = prepare_data(name, image_size=28)
    assert (data.info.num_train, data.info.num_val, data.info.in_chans, data.info.num_classes) == (50, 12, 1, 10)
    assert data.info.val_split == f"validated on the official test split of {name} (12 images)"
    for image, label in zip(data.train.images, data.train.labels.tolist()):
        assert torch.all(image == label * 20)
    for image, label in zip(data.val.images, data.val.labels.tolist()):
        assert torch.all(image == label * 20 + 1)
    held_out = prepare_data(name, image_size=28, val_from="train")
    assert (held_out.info.num_train, held_out.info.num_val) == (40, 10)
    assert held_out.info.val_split.startswith(f"validated on 20% of the training images of {name}")
    assert torch.all(held_out.val.images % 20 == 0)  # no test image among them


def write_cifar_batch(path: Path, brightness: int) -> None:
    labels = list(range(10))
    pixels = np.repeat(np.array(labels, dtype=np.uint8)[:, None] * 25 + brightness, 3072, axis=1)
    with open(path, "wb") as out:
        pickle.dump({b"data": pixels, b"labels": labels}, out)


def test_cifar_pickle_batches_load(parallax_home):
    folder = parallax_home / "data" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for batch in range(1, 6):
        write_cifar_batch(folder / f"data_batch_{batch}", 0)
    with open(folder / "batches.meta", "wb") as out:
        pickle.dump({b"label_names": [f"class{i}".encode() for i in range(10)]}, out)
    data = prepare_data("cifar10", image_size=32)
    assert (data.info.num_train, data.info.num_val, data.info.in_chans) == (40, 10, 3)
    assert data.info.class_names[3] == "class3"
    assert "it ships no test split" in data.info.val_split  # an old copy without test_batch
    for image, label in zip(data.val.images, data.val.labels.tolist()):
        assert torch.all(image == label * 25)
    write_cifar_batch(folder / "test_batch", 1)
    with_test = prepare_data("cifar10", image_size=32)
    assert (with_test.info.num_train, with_test.info.num_val) == (50, 10)
    assert with_test.info.val_split == "validated on the official test split of cifar10 (10 images)"
    for image, label in zip(with_test.val.images, with_test.val.labels.tolist()):
        assert torch.all(image == label * 25 + 1)


def test_eurosat_builtin_reads_its_jpg_folder(parallax_home):
    root = parallax_home / "data" / "eurosat" / "2750"
    for name in ("Forest", "River"):
        (root / name).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (64, 64), (30 * i, 90, 150)).save(root / name / f"{name}_{i}.jpg")
    data = prepare_data("eurosat", image_size=32, val_fraction=0.34)
    assert (data.info.name, data.info.class_names, data.info.in_chans) == ("eurosat", ("Forest", "River"), 3)


@pytest.mark.parametrize("name", [n for n in BUILTIN_DATASETS if n != "digits"])
def test_missing_builtin_says_where_to_put_the_files_quickly(parallax_home, name):
    started = time.perf_counter()
    with pytest.raises(DatasetError, match="put the files in") as raised:
        prepare_data(name)
    assert time.perf_counter() - started < 10
    assert str(parallax_home / "data") in str(raised.value)
    assert f"cannot download {name}" in str(raised.value)


def test_inspect_folder_reads_one_file_only(parallax_home, tmp_path):
    root = make_tiff_folder(tmp_path / "eurosat", per_class=2)
    (root / "River" / "readme.md").write_text("about")
    facts = inspect_dataset(str(root))
    assert facts["kind"] == "folder" and facts["num_classes"] == 3 and facts["num_images"] == 6
    assert facts["image_shape"] == (64, 64) and facts["bands"] == 13 and facts["dtype"] == "uint16"
    assert facts["default_bands"] == (3, 2, 1) and facts["default_scale"] == 4000
    assert facts["problems"] == [] and "readme.md" in facts["warnings"][0]
    (root / "River" / "River_1.tif").unlink()
    assert "class 'River'" in inspect_dataset(str(root))["problems"][0]
    assert not list(parallax_home.glob("data/cache/*.npy"))


def test_inspect_builtins_says_what_is_on_disk(parallax_home):
    assert inspect_dataset("digits")["available_offline"] is True
    mnist = inspect_dataset("mnist")
    assert mnist["kind"] == "builtin" and mnist["available_offline"] is False and mnist["num_images"] == 60_000
