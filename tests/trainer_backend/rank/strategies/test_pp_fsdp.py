"""Pipeline parallel and FSDP on two CPU processes: they complete with metrics as true as the
other strategies, their checkpoints are whole timm models, and FSDP matches DDP step for step."""

from __future__ import annotations

import math

import pytest

from tests.support import evaluate_checkpoint, train_and_export

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
        # With the recipe's flags a pipeline applies in its own loop (clipping over every stage's gradients).
        "pp_1f1b": train_and_export(home, *TINY, "--strategy", "pp", "--epochs", "1",
                                    "--pipeline-schedule", "1f1b", "--microbatches", "8", "--grad-clip", "0.5",
                                    "--label-smoothing", "0.1", "--lr-schedule", "cosine", "--warmup-epochs", "0.5"),
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


@pytest.mark.parametrize("name", ["pp", "pp_1f1b"])
def test_pipeline_last_stage_records_step_points(runs, home, name):
    """Only the last stage has the loss; it records the steps itself, and the notes say so."""
    from sqlalchemy import select

    from db import make_engine
    from db.tables import StepMetric

    run = runs[name]
    with make_engine(f"sqlite:///{home / 'parallax.db'}").connect() as connection:
        steps = connection.execute(select(StepMetric).where(StepMetric.run_id == run["run_id"])
                                   .order_by(StepMetric.step)).mappings().all()
    assert steps and steps[-1]["step"] == DIGITS_TRAIN // 64  # pipelines drop the short last batch
    assert all(math.isfinite(s["train_loss"]) and s["images_per_s"] > 0 for s in steps)
    assert any("last pipeline stage" in note for note in run["notes"])


@pytest.mark.parametrize("name", ["fsdp", "pp", "pp_1f1b"])
def test_every_rank_records_where_its_time_and_memory_go(runs, name):
    ddp_params_mb = runs["ddp"]["epochs"][0]["extra"]["memory_breakdown"]["rank0:cpu"]["parameters_mb"]
    for epoch in runs[name]["epochs"]:
        extra = epoch["extra"]
        assert [r["rank"] for r in extra["ranks"]] == [0, 1]
        for rank in extra["ranks"]:
            parts = rank["data_time_s"] + rank["compute_time_s"] + rank["comm_wait_s"]
            assert parts == pytest.approx(rank["train_time_s"], abs=1e-3) and rank["compute_time_s"] > 0
            assert rank["comm_wait_s"] >= 0
        assert 0 < extra["mfu"] <= 1
        breakdown = extra["memory_breakdown"]
        assert set(breakdown) == set(epoch["peak_memory_mb"])
        params = [entry["parameters_mb"] for entry in breakdown.values()]
        if name == "fsdp":  # each rank holds its shard
            assert all(p == pytest.approx(ddp_params_mb / 2, rel=0.15) for p in params)
        else:  # each stage holds its own layers; the rest of a step it waits for its neighbour
            assert sum(params) == pytest.approx(ddp_params_mb, rel=1e-3)
            for rank, busy in zip(extra["ranks"], extra["stage_busy_fraction"].values()):
                assert rank["compute_time_s"] >= busy * rank["train_time_s"] - 1e-3  # chunks + optimizer step


# --- how a stage's busy time is measured ----------------------------------------------------


class FakeCudaEvent:
    """torch.cuda.Event at the edge: the 'GPU' ran each chunk for a set time, the first chunk
    still runs until told otherwise, and the host never waited (host clocks would read ~0)."""

    timeline: list[float] = []
    done: set[int] = set()

    def __init__(self, enable_timing: bool = False):
        self.at = None

    def record(self, stream=None) -> None:
        self.at = len(FakeCudaEvent.timeline)
        FakeCudaEvent.timeline.append(0.0)

    def query(self) -> bool:
        return self.at in FakeCudaEvent.done

    def synchronize(self) -> None:
        FakeCudaEvent.done.add(self.at)

    def elapsed_time(self, end: FakeCudaEvent) -> float:
        return sum(FakeCudaEvent.timeline[self.at + 1:end.at + 1])


def test_a_cuda_stage_is_timed_by_events_on_its_stream_without_a_sync_per_chunk(monkeypatch):
    import torch

    from trainer_backend.rank.strategies.pp import StageClock

    syncs = []
    monkeypatch.setattr(torch.cuda, "Event", FakeCudaEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "stream")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    FakeCudaEvent.timeline, FakeCudaEvent.done = [], set()
    clock = StageClock(torch.device("cuda:0"))

    def chunk(ms: float):
        FakeCudaEvent.timeline.append(ms)  # the kernels this chunk enqueued, as the GPU will run them
        return "output"

    forward = clock.timed(chunk)
    assert forward(30.0) == "output" and forward(20.0) == "output"
    # The second chunk has finished, the first has not: only finished chunks count, and the host
    # is never stalled to find out.
    FakeCudaEvent.done = {5}
    clock.collect()
    assert clock.busy_s == pytest.approx(0.020) and not syncs
    clock.collect(wait=True)  # at the end of the epoch
    assert clock.busy_s == pytest.approx(0.050)


def test_a_cpu_stage_is_timed_by_the_host_clock():
    import time

    import torch

    from trainer_backend.rank.strategies.pp import StageClock

    clock = StageClock(torch.device("cpu"))
    clock.timed(lambda: time.sleep(0.05))()
    clock.collect(wait=True)
    assert 0.05 <= clock.busy_s < 0.5
    clock.reset()
    assert clock.busy_s == 0.0


def test_a_pipeline_steps_the_lr_schedule_per_optimizer_step(runs):
    # 22 full batches of 64 (pp drops the short one), 11 of warmup: the epoch's last step is cosine's 10/11.
    assert runs["pp_1f1b"]["epochs"][0]["lr"] == pytest.approx(1e-3 * (1 + math.cos(math.pi * 10 / 11)) / 2, rel=1e-6)
