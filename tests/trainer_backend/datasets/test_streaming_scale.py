"""Data at workstation scale, on real files and real runs: images stored larger than they train
at (crops on the device), validation on official test splits in a run's export, and a folder
larger than the memory a run may use training to the end under a memory cgroup."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tests.support import ROOT

from trainer_backend.rank.augment import centre_crop, random_resized_crop
from contract.config import ConfigError, RunConfig
from trainer_backend.rank.inputs import DeviceInputs


def test_stored_size_below_the_image_size_is_refused_in_one_line():
    with pytest.raises(ConfigError) as raised:
        RunConfig(image_size=32, stored_size=16)
    assert str(raised.value) == ("stored_size 16 is not allowed: use 0 (store at image_size) or a size from "
                                 "image_size 32 to 1024")
    assert RunConfig(image_size=32, stored_size=64).stored_size == 64


def test_training_batches_are_cropped_at_random_and_validation_at_the_centre():
    # Each pixel's value is its column: a crop's values tell which columns it took.
    columns = torch.arange(64, dtype=torch.float32).expand(8, 3, 64, 64).contiguous()
    config = RunConfig(image_size=16, stored_size=64, augment="flip,crop")
    inputs = DeviceInputs.for_run(config, lambda pixels: pixels.float(), torch.device("cpu"))
    assert inputs.augment.names == ("flip",)  # the stored-size crop replaces the "crop" augmentation
    trained = inputs(columns, train=True)
    assert trained.shape == (8, 3, 16, 16)
    widths = (trained[:, 0].amax(dim=(1, 2)) - trained[:, 0].amin(dim=(1, 2)))
    assert len(set(widths.round().tolist())) > 1, "every image got the same box"
    assert trained.amin() >= 0 and trained.amax() <= 63
    validated = inputs(columns, train=False)
    assert validated.shape == (8, 3, 16, 16) and torch.equal(validated[0], validated[7])
    # The centre 87.5 %: columns 4..59 of 64, symmetric about the middle.
    assert validated[0, 0].mean().item() == pytest.approx(31.5, abs=0.01)
    assert 3 <= validated[0, 0].amin().item() <= 6 and 57 <= validated[0, 0].amax().item() <= 60


def test_random_resized_crop_boxes_follow_timm_defaults():
    generator = torch.Generator().manual_seed(0)
    ones = torch.zeros(2000, 1, 40, 40)
    ones[:, :, :, :20] = 1.0  # the left half is bright
    crops = random_resized_crop(ones, generator, area=(0.08, 1.0), size=8)
    assert crops.shape == (2000, 1, 8, 8)
    bright = crops.mean(dim=(1, 2, 3))
    # Small boxes fall wholly in one half; large ones straddle it.
    assert (bright < 0.01).any() and (bright > 0.99).any() and ((bright > 0.3) & (bright < 0.7)).any()
    assert centre_crop(ones[:1], 8).shape == (1, 1, 8, 8) and math.isclose(centre_crop(ones[:1], 8).mean().item(),
                                                                          0.5, abs_tol=1e-6)


@pytest.mark.usefixtures("own_data_dir")
def test_a_run_on_mnist_validates_on_its_test_split_and_says_so_in_the_export(parallax_home, cli):
    from tests.trainer_backend.datasets.test_prepare import make_idx_set

    make_idx_set(parallax_home / "data" / "MNIST" / "raw", count=60)
    result = cli("run", "--dataset", "mnist", "--model", "test_resnet", "--image-size", "16", "--stored-size", "24",
                 "--epochs", "1", "--batch-size", "32", "--bn-stats-images", "0", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "(60 train / 12 val images)" in result.stdout
    run_id = result.stdout.strip().splitlines()[-1].split()[0].split("=")[1]
    exported = json.loads(cli("export", run_id, timeout=120).stdout)
    assert exported["status"] == "completed" and exported["config"]["val_from"] == "test"
    assert "validated on the official test split of mnist (12 images)" in exported["notes"]
    assert any(note.startswith("images are stored at 24 px and trained at 16 px") for note in exported["notes"])


def make_large_png_folder(root, count: int, size: int) -> None:
    """``count`` solid-colour RGB PNGs of ``size`` px in two classes: a few hundred bytes on disk
    each, ``size``² x 3 bytes decoded."""
    from PIL import Image

    for label, name in enumerate(("dark", "light")):
        (root / name).mkdir(parents=True)
        for i in range(count // 2):
            shade = 40 + 150 * label + i % 50
            Image.new("RGB", (size, size), (shade, shade // 2, 255 - shade)).save(root / name / f"{i}.png")


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int):
    """A v1 memory cgroup limited to ``limit_bytes`` (root only); removed afterwards."""
    group = Path("/sys/fs/cgroup/memory") / f"parallax-test-{os.getpid()}"
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
    except OSError as exc:
        with contextlib.suppress(OSError):
            group.rmdir()
        pytest.skip(f"cannot make a memory cgroup here ({exc.strerror}): needs root and cgroup v1's memory controller")
    try:
        yield group
    finally:
        for _ in range(50):  # the group can be removed once its last process has gone
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


# About 100 s of both cores (1.1 GiB decoded, written and read back): it runs with the benchmarks
# (make bench-check), not with make test.
@pytest.mark.bench
@pytest.mark.usefixtures("own_data_dir")
def test_a_folder_larger_than_the_runs_memory_limit_trains_to_the_end(parallax_home, tmp_path):
    # A run's own processes (torch, the database, the loop) take about 500 MB; the limit leaves
    # the page cache less room than the set needs, so batches must stream from the cache file.
    limit = 2**30
    folder = tmp_path / "large"
    make_large_png_folder(folder, count=6000, size=256)  # 1.10 GiB decoded
    env = {**os.environ, "PARALLAX_HOME": str(parallax_home), "PYTHONUNBUFFERED": "1"}
    env.pop("PARALLAX_DB_URL", None)
    command = [sys.executable, "-m", "trainer_backend", "run", "--dataset", str(folder), "--model", "test_resnet",
               "--image-size", "16", "--stored-size", "256", "--epochs", "1", "--batch-size", "64",
               "--val-fraction", "0.05", "--bn-stats-images", "0"]
    with memory_cgroup(limit) as group:
        procs = str(group / "cgroup.procs")

        def join_group() -> None:  # in the child, before exec: the whole run and its children are in the group
            with open(procs, "w") as handle:
                handle.write(str(os.getpid()))

        child = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, preexec_fn=join_group, start_new_session=True)
        try:
            out, err = child.communicate(timeout=1500)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            pytest.fail("the run under the memory limit did not end in 25 minutes")
        peak = int((group / "memory.max_usage_in_bytes").read_text())
    assert child.returncode == 0, err[-3000:]
    assert out.strip().splitlines()[-1].endswith("status=completed")
    cache = next((parallax_home / "data" / "cache").glob("large-*.npy"))
    assert cache.stat().st_size > limit >= peak
    assert "batches stream from the cache file" in out and "its memory cgroup's limit" in out


@pytest.mark.usefixtures("own_data_dir")
def test_a_split_that_fits_a_share_of_device_memory_is_kept_there_and_gathered_there(parallax_home):
    from trainer_backend.rank.strategies.base import Strategy
    from trainer_backend.rank.trainer import (
        DEVICE_DATA_SHARE,
        build_loaders,
        keep_on_device,
        load_data,
    )

    config = RunConfig(image_size=16, num_workers=2, batch_size=64)
    data = load_data(config)
    needed = data.train.stored_bytes + data.val.stored_bytes
    assert keep_on_device(data, torch.device("cpu"), free_bytes=int(needed / DEVICE_DATA_SHARE) - 1) is None
    resident = keep_on_device(data, torch.device("cpu"), free_bytes=int(needed / DEVICE_DATA_SHARE) + 1)
    # Only the split's own rows were copied (no mapping of the whole pool), and they gather the same batches.
    assert len(resident.train.pool_images) == len(data.train) and resident.train.indices is None
    assert resident.train.pool_images.data_ptr() != data.train.pool_images.data_ptr()
    for split, moved in ((data.train, resident.train), (data.val, resident.val)):
        picked = [0, 7, len(split) - 1]
        assert all(torch.equal(a, b) for a, b in zip(moved.__getitems__(picked), split.__getitems__(picked)))
    assert torch.equal(resident.train.mean, data.train.mean)
    train, val = build_loaders(resident, config, Strategy(config, 0))
    assert train.num_workers == val.num_workers == 0 and not train.pin_memory
    assert sum(len(labels) for _, labels in val) == len(data.val)


@pytest.mark.processes  # DataLoader workers
@pytest.mark.usefixtures("own_data_dir")
def test_decoding_in_the_loader_workers_gives_the_cached_pixels_and_caches_nothing(parallax_home, tmp_path):
    from torch.utils.data import DataLoader

    from trainer_backend.datasets import DatasetError, collate_batch, prepare_data
    from trainer_backend.datasets.streaming import StreamingImages
    from trainer_backend.supervisor.runner import engine_forkserver

    folder = tmp_path / "folder"
    make_large_png_folder(folder, count=40, size=24)
    streamed = prepare_data(str(folder), image_size=16, decode="workers")
    assert isinstance(streamed.train, StreamingImages)
    assert not list((parallax_home / "data" / "cache").glob("*.npy"))
    assert any("decoded in the loader workers every epoch" in w for w in streamed.info.warnings)
    cached = prepare_data(str(folder), image_size=16)
    # The same split and, image for image, the same pixels as the cache stores.
    assert torch.equal(streamed.val.labels, cached.val.labels)
    picked = [0, 3, len(cached.val) - 1]
    assert torch.equal(streamed.val.__getitems__(picked)[0], cached.val.__getitems__(picked)[0])
    assert torch.allclose(streamed.train.mean, cached.train.mean, atol=0.05)
    loader = DataLoader(streamed.train, batch_size=8, shuffle=True, num_workers=2, collate_fn=collate_batch,
                        multiprocessing_context=engine_forkserver())
    batches = list(loader)
    assert sum(len(labels) for _, labels in batches) == len(streamed.train)
    assert batches[0][0].dtype == torch.uint8 and batches[0][0].shape[1:] == (3, 16, 16)
    with pytest.raises(DatasetError, match="decode workers applies to image folders"):
        prepare_data("digits", decode="workers")


@pytest.mark.usefixtures("own_data_dir")
def test_a_run_decoding_in_its_loader_workers_trains_and_says_so(parallax_home, tmp_path, cli):
    folder = tmp_path / "folder"
    make_large_png_folder(folder, count=40, size=24)
    result = cli("run", "--dataset", str(folder), "--model", "test_resnet", "--image-size", "16", "--epochs", "1",
                 "--batch-size", "16", "--decode", "workers", "--num-workers", "1", "--bn-stats-images", "0",
                 timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1].endswith("status=completed")
    assert "note: images are decoded in the loader workers every epoch" in result.stdout
    assert not list((parallax_home / "data" / "cache").glob("*.npy"))
