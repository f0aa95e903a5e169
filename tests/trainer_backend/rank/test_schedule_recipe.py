"""The training recipe: lr schedules with warmup and the linear scaling rule, label smoothing,
gradient clipping and gradient accumulation, checked against their formulas through the real
training loop (single process, and DDP/FSDP on two gloo processes), plus one real CLI run."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.support import leave_as_a_rank, run_world, train_and_export
from contract.config import ConfigError, RunConfig
from trainer_backend.rank.loop import train_one_epoch, validate
from trainer_backend.rank.schedule import attach_schedule
from trainer_backend.rank.strategies import DistributedStrategy, Strategy, unwrap
from trainer_backend.rank.trainer import build_optimizer, make_strategy

PIXELS, CLASSES = 8, 3


def tiny_model() -> nn.Module:
    # No BatchNorm: its batch statistics would make a split batch's gradients differ from the whole's.
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(PIXELS * PIXELS, 16), nn.ReLU(), nn.Linear(16, CLASSES))


def images_and_labels(count: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(count, 1, PIXELS, PIXELS, generator=generator) * 5,
            torch.randint(0, CLASSES, (count,), generator=generator))


def batches(images: torch.Tensor, labels: torch.Tensor, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(images[i:i + size], labels[i:i + size]) for i in range(0, len(labels), size)]


def grads_at_each_step(optimizer: torch.optim.Optimizer, model: nn.Module) -> list[dict[str, torch.Tensor]]:
    """The gradients each optimizer step is given (after clipping), by parameter name."""
    seen: list[dict[str, torch.Tensor]] = []

    def record(*_):
        seen.append({name: _whole(p.grad).clone() for name, p in model.named_parameters()})

    optimizer.register_step_pre_hook(record)
    return seen


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def reference_grads(images: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    model = tiny_model()
    F.cross_entropy(model(images), labels).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


# --- the lr schedule, step by step ---

def expected_lr(kind: str, k: int, total: int, warmup: int, peak: float) -> float:
    """The formulas of the training recipe (docs/STRATEGIES.md), written out apart from trainer_backend/rank/schedule.py."""
    if k < warmup:
        rise = (k + 1) / warmup
        return peak * (1 / 25 + (24 / 25) * rise if kind == "onecycle" else rise)
    p = (k - warmup) / (total - warmup)
    cosine = (1 + math.cos(math.pi * p)) / 2
    return peak * {"constant": 1.0, "cosine": cosine, "step": 0.1 ** math.floor(3 * p),
                   "onecycle": 1 / 25e4 + (1 - 1 / 25e4) * cosine}[kind]


@pytest.mark.parametrize("kind, warmup_epochs, warmup_steps", [
    ("constant", 1.5, 6), ("cosine", 0.5, 2), ("step", 0.0, 0), ("onecycle", 0.0, 4), ("onecycle", 1.0, 4),
])
def test_the_lr_of_every_optimizer_step_follows_the_formula(kind, warmup_epochs, warmup_steps):
    # 7 batches of 2, 2 per optimizer step: 4 optimizer steps an epoch (the last one a single batch), 12 in all.
    config = RunConfig(lr_schedule=kind, warmup_epochs=warmup_epochs, accumulate_steps=2, epochs=3, batch_size=2,
                       optimizer="sgd", lr=0.4, scale_lr=True)
    assert config.base_lr == pytest.approx(0.4 * 4 / 256)
    model, strategy = tiny_model(), Strategy(config)
    optimizer = build_optimizer(config, model.parameters())
    loader = batches(*images_and_labels(14), 2)
    schedule = attach_schedule(optimizer, config, batches_per_epoch=len(loader))
    used: list[float] = []
    optimizer.register_step_post_hook(lambda opt, *_: used.append(opt.param_groups[0]["lr"]))
    epoch_lrs = []
    for _ in range(config.epochs):
        train_one_epoch(model, loader, optimizer, strategy)
        epoch_lrs.append(optimizer.param_groups[0]["lr"])  # what EpochMetrics.lr records
    assert schedule.total_steps == 12 and schedule.warmup == warmup_steps and schedule.steps_taken == 12
    expected = [expected_lr(kind, k, 12, warmup_steps, config.base_lr) for k in range(12)]
    assert used == pytest.approx(expected, rel=1e-9)
    assert epoch_lrs == pytest.approx([expected[3], expected[7], expected[11]], rel=1e-9)


def test_the_schedule_resumes_where_it_stopped(tmp_path):
    from trainer_backend.rank import resume
    config = RunConfig(strategy="ddp", devices=("cpu",), lr_schedule="cosine", epochs=2, optimizer="sgd", lr=0.1)
    strategy = DistributedStrategy(config, 0)
    strategy.setup()  # a world of one: restore's collectives run in-process
    try:
        model = strategy.wrap(tiny_model())
        optimizer = build_optimizer(config, model.parameters())
        schedule = attach_schedule(optimizer, config, batches_per_epoch=5)
        loader = batches(*images_and_labels(10), 2)
        train_one_epoch(model, loader, optimizer, strategy)
        resume.save_resume_point(tmp_path, strategy, model, optimizer, loader, epoch=1, best_acc=0.5,
                                 schedule=schedule)
        fresh_optimizer = build_optimizer(config, model.parameters())
        fresh = attach_schedule(fresh_optimizer, config, batches_per_epoch=5)
        resumed = resume.restore(tmp_path, strategy, model, fresh_optimizer, loader, schedule=fresh)
        assert (resumed.start_epoch, resumed.best_acc) == (2, 0.5)
        assert fresh.steps_taken == 5
        assert fresh_optimizer.param_groups[0]["lr"] == pytest.approx(expected_lr("cosine", 5, 10, 0, 0.1))
    finally:
        strategy.teardown()


# --- accumulation, clipping, label smoothing through the real loop ---

def test_accumulated_gradients_equal_the_larger_batch():
    images, labels = images_and_labels(12)
    config = RunConfig(batch_size=4, accumulate_steps=3, optimizer="sgd", lr=0.1)
    model = tiny_model()
    optimizer = build_optimizer(config, model.parameters())
    seen = grads_at_each_step(optimizer, model)
    train_one_epoch(model, batches(images, labels, 4), optimizer, Strategy(config))
    assert len(seen) == 1  # three batches, one optimizer step
    for name, grad in reference_grads(images, labels).items():
        torch.testing.assert_close(seen[0][name], grad, rtol=1e-5, atol=1e-6)


def test_an_epochs_short_last_group_is_the_mean_of_its_own_batches():
    images, labels = images_and_labels(10)
    config = RunConfig(batch_size=2, accumulate_steps=3, optimizer="sgd", lr=1e-9)
    model = tiny_model()
    optimizer = build_optimizer(config, model.parameters())
    seen = grads_at_each_step(optimizer, model)
    train_one_epoch(model, batches(images, labels, 2), optimizer, Strategy(config))
    assert len(seen) == 2  # batches 1-3, then 4-5
    for name, grad in reference_grads(images[6:], labels[6:]).items():  # lr 1e-9: weights all but unchanged
        torch.testing.assert_close(seen[1][name], grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("with_scaler", [False, True])
def test_gradient_clipping_bounds_the_norm_of_the_true_gradients(with_scaler):
    images, labels = images_and_labels(8)
    raw = reference_grads(images, labels)
    raw_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in raw.values()]))
    max_norm = 0.05
    assert raw_norm > 10 * max_norm  # the test clips something
    config = RunConfig(batch_size=8, grad_clip=max_norm, optimizer="sgd", lr=0.1)
    model = tiny_model()
    optimizer = build_optimizer(config, model.parameters())
    seen = grads_at_each_step(optimizer, model)
    # A loss scale of 2**10: clipping before unscaling would leave gradients 1024 times too small.
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10) if with_scaler else None
    train_one_epoch(model, batches(images, labels, 8), optimizer, Strategy(config), scaler=scaler)
    clipped = seen[0]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in clipped.values()]))
    assert norm == pytest.approx(max_norm, rel=1e-4)
    for name, grad in raw.items():  # the same direction, shorter
        torch.testing.assert_close(clipped[name], grad * (max_norm / raw_norm), rtol=1e-3, atol=1e-7)


def test_label_smoothing_changes_the_training_loss_as_the_formula_says_and_not_the_validation_loss():
    images, labels = images_and_labels(8)
    smoothing = 0.2
    with torch.no_grad():
        log_p = F.log_softmax(tiny_model()(images), dim=1)
    plain = -log_p.gather(1, labels[:, None]).mean().item()
    expected = (1 - smoothing) * plain + smoothing * (-log_p.mean(dim=1)).mean().item()
    config = RunConfig(batch_size=8, label_smoothing=smoothing, optimizer="sgd", lr=0.1)
    model, strategy = tiny_model(), Strategy(config)
    optimizer = build_optimizer(config, model.parameters())
    totals, _ = train_one_epoch(model, batches(images, labels, 8), optimizer, strategy)
    assert totals[0].item() / totals[2].item() == pytest.approx(expected, rel=1e-5)
    assert abs(expected - plain) > 0.01
    loss_sum, _, count = validate(tiny_model(), batches(images, labels, 8), strategy).tolist()
    assert loss_sum / count == pytest.approx(plain, rel=1e-5)


# --- accumulation over two gloo processes: gradients reduced once, on the group's last batch ---

def _accumulating_rank(rank: int, port: int, strategy_name: str, out_dir: str, max_norm: float) -> None:
    torch.set_num_threads(1)
    config = RunConfig(strategy=strategy_name, devices=("cpu", "cpu"), batch_size=4, accumulate_steps=2,
                       optimizer="sgd", lr=0.1, grad_clip=max_norm)
    strategy = make_strategy(config, rank, store_host="127.0.0.1", store_port=port)
    strategy.setup()
    try:
        model = strategy.wrap(tiny_model())
        optimizer = build_optimizer(config, model.parameters())
        module = unwrap(model)
        seen = grads_at_each_step(optimizer, module)
        local_first: list[torch.Tensor] = []

        def after_batch(step: int, total: int) -> None:
            if step == 1 and strategy_name == "ddp":  # DDP keeps gradients local under no_sync
                local_first.append(next(module.parameters()).grad.clone())

        images, labels = images_and_labels(8)
        mine = slice(rank * 4, rank * 4 + 4)  # two batches of this rank's 2 images
        train_one_epoch(model, batches(images[mine], labels[mine], 2), optimizer, strategy, on_step=after_batch)
        with open(Path(out_dir) / f"rank{rank}.pkl", "wb") as handle:
            pickle.dump({"steps": seen, "local_first": local_first}, handle)
    finally:
        strategy.teardown()
    leave_as_a_rank()


@pytest.mark.parametrize("strategy_name", ["ddp", "fsdp"])
def test_accumulation_and_clipping_over_two_processes_equal_the_global_batch(tmp_path, strategy_name):
    """Clipped to half the global batch's gradient norm: FSDP's norm must add up every shard."""
    reference = reference_grads(*images_and_labels(8))
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in reference.values()])).item()
    run_world(_accumulating_rank, 2, strategy_name, str(tmp_path), norm / 2, timeout_s=120)
    results = [pickle.loads((tmp_path / f"rank{rank}.pkl").read_bytes()) for rank in range(2)]
    for result in results:
        assert len(result["steps"]) == 1
        for name, grad in reference.items():
            torch.testing.assert_close(result["steps"][0][name], grad / 2, rtol=1e-5, atol=1e-6)
    if strategy_name == "ddp":  # the first batch's gradients were not all-reduced: the ranks differ
        assert not torch.allclose(results[0]["local_first"][0], results[1]["local_first"][0])


# --- bad values, and one real run ---

@pytest.mark.parametrize("changes, field, allowed", [
    ({"lr_schedule": "linear"}, "lr_schedule", "constant, cosine, step, onecycle"),
    ({"warmup_epochs": 4.0, "epochs": 3}, "warmup_epochs", "from 0 to the run's epochs (3)"),
    ({"warmup_epochs": -0.5}, "warmup_epochs", "from 0 to the run's epochs"),
    ({"label_smoothing": 1.0}, "label_smoothing", "[0, 1)"),
    ({"label_smoothing": float("nan")}, "label_smoothing", "[0, 1)"),
    ({"grad_clip": -1.0}, "grad_clip", "0 = no clipping"),
    ({"accumulate_steps": 0}, "accumulate_steps", "from 1 to 1024"),
    ({"accumulate_steps": 2, "strategy": "pp", "devices": "cpu,cpu"}, "accumulate_steps", "microbatches"),
    ({"scale_lr": "yes"}, "scale_lr", "true or false"),
    ({"scale_lr": True, "lr": 1e308, "batch_size": 1024}, "lr", "a finite number above 0"),
])
def test_bad_recipe_values_are_refused_in_one_line(changes, field, allowed):
    with pytest.raises(ConfigError) as caught:
        RunConfig(**changes)
    message = str(caught.value)
    assert caught.value.field == field and "\n" not in message
    assert message.startswith(field) and allowed in message


def test_a_bad_flag_is_refused_before_anything_runs(cli):
    result = cli("run", "--accumulate-steps", "2", "--strategy", "pp", "--devices", "cpu,cpu")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: accumulate_steps 2 is not allowed with strategy pp: a pipeline already accumulates gradients over "
        "its microbatches; use 1 and raise --batch-size and --microbatches instead"]


def test_a_cli_run_records_the_lr_its_optimizer_used(parallax_home):
    # digits: 1,437 training images in 12 batches of 128, 2 per optimizer step: 6 steps, 3 of warmup.
    run = train_and_export(parallax_home, "--model", "test_resnet", "--image-size", "16", "--epochs", "1",
                           "--batch-size", "128", "--accumulate-steps", "2", "--lr", "0.002", "--scale-lr",
                           "--lr-schedule", "cosine", "--warmup-epochs", "0.5", "--label-smoothing", "0.1",
                           "--grad-clip", "1", "--bn-stats-images", "0")
    assert run["status"] == "completed", run["error"]
    peak = 0.002 * 256 / 256
    assert run["epochs"][0]["lr"] == pytest.approx(expected_lr("cosine", 5, 6, 3, peak), rel=1e-6)
    assert run["measurements"]["effective_batch"] == 256
    assert any("0.002 x 256/256 = 0.002" in note for note in run["notes"])
    assert any("effective batch of 256" in note for note in run["notes"])
    assert math.isfinite(run["epochs"][0]["train_loss"])
