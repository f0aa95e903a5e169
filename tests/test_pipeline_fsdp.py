"""Pipeline parallel and FSDP on two CPU processes: they complete with metrics as true as the
other strategies, their checkpoints are whole timm models, and FSDP matches DDP step for step."""

from __future__ import annotations

import math

import pytest

from conftest import evaluate_checkpoint, train_and_export

TINY = ("--model", "test_resnet", "--image-size", "16", "--devices", "cpu,cpu", "--batch-size", "64")
DIGITS_TRAIN = 1437


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def runs(home, shared_runs):
    return {
        "ddp": shared_runs["ddp_tiny"],
        "fsdp": train_and_export(home, *TINY, "--strategy", "fsdp", "--epochs", "1"),
        "pp": train_and_export(home, *TINY, "--strategy", "pp", "--epochs", "1"),
        "pp_1f1b": train_and_export(home, *TINY, "--strategy", "pp", "--epochs", "1",
                                    "--pipeline-schedule", "1f1b", "--microbatches", "8"),
    }


@pytest.mark.parametrize("name", ["fsdp", "pp", "pp_1f1b"])
def test_completes_with_finite_metrics_and_a_whole_checkpoint(runs, home, name):
    run = runs[name]
    assert run["status"] == "completed", run["error"]
    assert run["world_size"] == 2
    for epoch in run["epochs"]:
        for field in ("train_loss", "train_acc", "val_loss", "val_acc", "images_per_s", "epoch_time_s"):
            assert math.isfinite(epoch[field]) and epoch[field] >= 0, (field, epoch)
        assert set(epoch["peak_memory_mb"]) == {"rank0:cpu", "rank1:cpu"}
        # Every validation image counted once: 360 images, so accuracy is k/360.
        assert round(epoch["val_acc"] * 360, 6).is_integer()
        images = epoch["images_per_s"] * epoch["train_time_s"]
        expected = DIGITS_TRAIN // 64 * 64 if name.startswith("pp") else DIGITS_TRAIN  # pp drops short batches
        assert images == pytest.approx(expected, abs=64)
    # The checkpoint is the whole model under timm's names: it scores what the run recorded.
    checkpoint, accuracy, loss, images = evaluate_checkpoint(home, run)
    recorded = run["epochs"][checkpoint["epoch"] - 1]
    assert images == 360
    assert accuracy == pytest.approx(recorded["val_acc"], abs=1 / 360)
    assert loss == pytest.approx(recorded["val_loss"], rel=1e-3)


def test_fsdp_matches_ddp_at_equal_seeds(runs):
    """Sharding changes where parameters live, not the maths: the same seed gives the same losses."""
    assert runs["fsdp"]["config"] == {**runs["ddp"]["config"], "strategy": "fsdp"}
    for ddp, fsdp in zip(runs["ddp"]["epochs"], runs["fsdp"]["epochs"]):
        assert fsdp["train_loss"] == pytest.approx(ddp["train_loss"], rel=1e-4)
        assert fsdp["train_acc"] == pytest.approx(ddp["train_acc"], abs=2 / DIGITS_TRAIN)


@pytest.mark.parametrize("name", ["pp", "pp_1f1b"])
def test_pipeline_records_each_stage_busy_time(runs, name):
    for epoch in runs[name]["epochs"]:
        busy = epoch["extra"]["stage_busy_fraction"]
        assert set(busy) == {"stage0", "stage1"} and all(0 < f <= 1 for f in busy.values())
        assert epoch["extra"]["bubble_fraction"] == pytest.approx(1 - sum(busy.values()) / 2, abs=1e-3)
