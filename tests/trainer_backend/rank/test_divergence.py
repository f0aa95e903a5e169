"""A training loss that turns NaN or infinite (--on-nonfinite): the guard alone on one CPU process, then real
runs (one process, and two gloo DDP ranks) whose loss turns NaN at a chosen step (tests/plugins/nan_model.py).

    .venv/bin/python -m pytest tests/trainer_backend/rank/test_divergence.py -q
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.db.test_notify import SECRET, Receiver
from tests.support import DDP_ON_CPU, run_cli
from contract.config import ConfigError, RunConfig
from trainer_backend.rank.divergence import NonfiniteGuard, TrainingDiverged
from trainer_backend.rank.strategies import Strategy

NAN_RUN = ("--dataset", "digits", "--model", "parallax_nan_at_step", "--image-size", "16", "--batch-size", "64",
           "--bn-stats-images", "0", "--lr", "0.01")


def guard(action: str, *, epoch: int = 2, steps: int = 10, lr: float = 0.1) -> NonfiniteGuard:
    strategy = Strategy(RunConfig(), rank=0)
    model = torch.nn.Linear(1, 1)
    watch = NonfiniteGuard(action, strategy)
    watch.start_epoch(epoch, steps, torch.optim.SGD(model.parameters(), lr=lr))
    return watch


def test_stop_names_the_first_bad_step_its_kind_and_the_lr():
    watch = guard("stop")
    for step, value in ((1, 2.0), (2, 1.5)):
        watch.observe(step, torch.tensor(value))
        watch.check(step)
    watch.observe(3, torch.tensor(float("nan")))
    with pytest.raises(TrainingDiverged, match=r"loss became NaN at epoch 2 step 3 \(lr 0\.1\)"):
        watch.check(3)


def test_stop_tells_an_infinite_loss_from_nan_and_keeps_the_earliest():
    watch = guard("stop", steps=4)
    watch.observe(1, torch.tensor(float("inf")))
    watch.observe(2, torch.tensor(float("nan")))
    with pytest.raises(TrainingDiverged, match=r"became \+inf at epoch 2 step 1 "):
        watch.check(4)  # a check point after both: the first bad step is named


def test_skip_drops_only_the_bad_steps_update_and_counts_it():
    watch = guard("skip")
    verdicts = []
    for step, value in enumerate((1.0, float("nan"), 0.5, float("-inf")), start=1):
        watch.observe(step, torch.tensor(value))
        verdicts.append(watch.skips_update())
        watch.check(step)  # never raises under skip
    assert verdicts == [False, True, False, True]
    assert watch.end_epoch() == {"nonfinite_steps": 2, "skipped_steps": 2}


def test_warn_counts_and_trains_on():
    watch = guard("warn")
    for step in range(1, 5):
        watch.observe(step, torch.tensor(float("nan") if step > 2 else 1.0))
        assert not watch.skips_update()
        watch.check(step)
    assert watch.end_epoch() == {"nonfinite_steps": 2}


def test_a_finite_epoch_adds_nothing_to_its_record():
    watch = guard("stop")
    for step in range(1, 11):
        watch.observe(step, torch.tensor(1.0 / step))
        watch.check(step)
    assert watch.end_epoch() == {}


def test_skip_is_refused_for_pipelines_in_one_line():
    with pytest.raises(ConfigError, match="on_nonfinite 'skip' is not allowed with strategy pp"):
        RunConfig(strategy="pp", devices=("cpu", "cpu"), on_nonfinite="skip")
    with pytest.raises(ConfigError, match="on_nonfinite"):
        RunConfig(on_nonfinite="ignore")


class FakeStream:
    def __init__(self, index: int):
        self.index = index


class FakeEvent:
    """torch.cuda.Event as the guard uses it: ``record`` on a stream (the current device's when none is given),
    ``synchronize`` before the host reads what it guards; each call is written to ``log``."""

    log: list = []

    def record(self, stream=None):
        self.stream = stream if stream is not None else torch.cuda.current_stream()
        FakeEvent.log.append(("record", self.stream.index))

    def synchronize(self):
        FakeEvent.log.append(("synchronize", self.stream.index))


@pytest.fixture
def two_fake_gpus(monkeypatch):
    """The CUDA edge of a model-parallel rank: cuda:0 is the current device (the first stage's), each device has
    its own current stream, and pinned memory is plain host memory."""
    FakeEvent.log = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: FakeStream(torch.cuda.current_device() if device is None
                                                       else torch.device(device).index))
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
    return FakeEvent.log


def test_under_model_parallel_the_checks_copy_is_awaited_on_the_output_devices_stream(two_fake_gpus):
    """The losses, the guard's state and its copy to the host are on the last stage's GPU (cuda:1): the event
    the host waits on before reading the copy must follow it there, at every check and at the epoch's last step,
    where the copy is read at once."""
    def on_the_output_gpu(watch: NonfiniteGuard) -> NonfiniteGuard:
        """The guard's tensors stay on the CPU; its device says where they would be."""
        watch.device, watch.on_cuda, watch.check_every = torch.device("cuda:1"), True, 16
        return watch

    watch = on_the_output_gpu(guard("stop", steps=40))
    for step in range(1, 41):
        watch.observe(step, torch.tensor(1.0))
        watch.check(step)
    assert two_fake_gpus == [("record", 1), ("record", 1), ("synchronize", 1), ("record", 1), ("synchronize", 1)]
    watch = on_the_output_gpu(guard("stop", epoch=3, steps=16))
    for step in range(1, 17):
        watch.observe(step, torch.tensor(float("nan") if step == 15 else 1.0))
        if step < 16:
            watch.check(step)
    with pytest.raises(TrainingDiverged, match="step 15"):
        watch.check(16)  # the epoch's last: read as soon as the copy on cuda:1 has landed
    assert two_fake_gpus[-2:] == [("record", 1), ("synchronize", 1)]


def run_and_export(home, *flags: str, nan_step: int, nan_rank: int = 0, webhook: str = "") -> dict:
    env = {"PARALLAX_PLUGINS": "tests.plugins.nan_model", "PARALLAX_TEST_NAN_STEP": str(nan_step),
           "PARALLAX_TEST_NAN_RANK": str(nan_rank), "PARALLAX_WEBHOOKS": webhook}
    result = run_cli("run", *NAN_RUN, *flags, home=home, env_extra=env, timeout=300)
    last = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert last.startswith("run_id="), result.stdout + result.stderr
    exported = run_cli("export", last.split()[0].split("=")[1], home=home)
    assert exported.returncode == 0, exported.stderr
    return {**json.loads(exported.stdout), "_printed": result.stdout + result.stderr}


@pytest.mark.processes
def test_a_single_run_stops_at_the_nan_step_keeps_the_epochs_before_and_tells_its_webhook(parallax_home):
    receiver = Receiver()
    try:
        # digits: 1,437 training images, 23 steps of 64 an epoch; the 30th step is epoch 2's 7th.
        run = run_and_export(parallax_home, "--epochs", "3", nan_step=30, webhook=receiver.url)
        [post] = receiver.wait_for(1)
    finally:
        receiver.close()
    assert run["status"] == "failed"
    assert run["error"].startswith("loss became NaN at epoch 2 step 7 (lr 0.01)"), run["error"]
    # The progress bar stops where the reason says, not at the step recorded some seconds before.
    assert run["progress"] == {"epoch": 2, "step": 7, "total_steps": 23}
    assert [e["epoch"] for e in run["epochs"]] == [1]
    assert math.isfinite(run["epochs"][0]["train_loss"])
    assert post["body"]["event"] == "run.failed" and post["body"]["run"]["reason"] == run["error"]
    assert SECRET not in run["_printed"]  # what the run printed (a launched run's log)


@pytest.mark.processes
def test_a_run_that_trains_on_through_a_nan_loss_is_told_as_diverged_then_completed(parallax_home):
    receiver = Receiver()
    try:
        run = run_and_export(parallax_home, "--epochs", "2", "--on-nonfinite", "warn", nan_step=30,
                             webhook=receiver.url)
        posts = receiver.wait_for(2)
    finally:
        receiver.close()
    assert run["status"] == "completed"
    assert run["epochs"][1]["extra"]["nonfinite_steps"] >= 1  # warn: the NaN weights keep later losses NaN
    assert [p["body"]["event"] for p in posts] == ["run.diverged", "run.completed"]
    assert "NaN or infinite in" in posts[0]["body"]["run"]["reason"]


@pytest.mark.processes
def test_ddp_ranks_stop_together_when_one_ranks_loss_turns_nan(parallax_home):
    # Two ranks of 32: 23 steps an epoch each (the shards are padded to equal length).
    run = run_and_export(parallax_home, *DDP_ON_CPU, "--epochs", "3", nan_step=30, nan_rank=1)
    assert run["status"] == "failed"
    assert run["error"].startswith("loss became NaN at epoch 2 step 7 (lr 0.01)"), run["error"]
    assert "Traceback" not in run["error"]
    assert run["progress"] == {"epoch": 2, "step": 7, "total_steps": 23}
    assert [e["epoch"] for e in run["epochs"]] == [1]


@pytest.mark.processes
def test_a_single_run_under_skip_drops_the_nan_step_and_completes(parallax_home):
    run = run_and_export(parallax_home, "--epochs", "2", "--on-nonfinite", "skip", nan_step=30)
    assert run["status"] == "completed", run["error"]
    extra = run["epochs"][1]["extra"]
    assert (extra["skipped_steps"], extra["nonfinite_steps"]) == (1, 1)
    assert all(math.isfinite(e["train_loss"]) and math.isfinite(e["val_loss"]) for e in run["epochs"])


@pytest.mark.processes
def test_ddp_skip_drops_the_step_on_both_ranks_and_completes(parallax_home):
    run = run_and_export(parallax_home, *DDP_ON_CPU, "--epochs", "2", "--on-nonfinite", "skip", nan_step=30,
                         nan_rank=1)
    assert run["status"] == "completed", run["error"]
    epochs = {e["epoch"]: e for e in run["epochs"]}
    assert epochs[2]["extra"]["skipped_steps"] == 1 and epochs[2]["extra"]["nonfinite_steps"] == 1
    assert "skipped_steps" not in epochs[1]["extra"]
    # The weights never took the NaN update: the run goes on learning.
    assert all(math.isfinite(e["train_loss"]) and math.isfinite(e["val_loss"]) for e in run["epochs"])
