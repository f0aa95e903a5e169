"""BatchNorm statistics re-estimated before validation (trainer_backend/rank/batchnorm.py), in process,
and the rule that notes when validation lags training because they were not."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from trainer_backend.rank.batchnorm import lag_note, reestimate, statistics_loader
from trainer_backend.datasets import collate_batch
from trainer_backend.datasets.tensor_dataset import ImageTensorDataset


def images_dataset(count: int) -> ImageTensorDataset:
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (count, 1, 8, 8), dtype=torch.uint8, generator=generator)
    return ImageTensorDataset(images, torch.arange(count) % 10, torch.tensor([0.5]), torch.tensor([0.25]))


def test_statistics_are_the_average_over_the_sample_and_nothing_else_changes():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    norm = model[1]
    norm.running_mean.fill_(5.0)  # stale, as after fast-changing weights
    weights = {k: v.clone() for k, v in model.state_dict().items() if "running" not in k and "num_batches" not in k}
    dataset = images_dataset(100)
    loader = statistics_loader(DataLoader(dataset, batch_size=25, collate_fn=collate_batch),
                               max_images=50, seed=0, full_batches=False)
    model.eval()
    assert reestimate(model, loader, lambda images, labels: model(dataset.normalise(images))) is True

    with torch.no_grad():
        batches = [model[0](dataset.normalise(images)) for images, _ in loader]
    assert sum(len(b) for b in batches) == 50  # the sample, not the whole set
    expected_mean = torch.stack([b.mean(dim=(0, 2, 3)) for b in batches]).mean(dim=0)
    expected_var = torch.stack([b.var(dim=(0, 2, 3), unbiased=True) for b in batches]).mean(dim=0)
    assert torch.allclose(norm.running_mean, expected_mean, atol=1e-5)
    assert torch.allclose(norm.running_var, expected_var, atol=1e-5)
    assert norm.momentum == 0.1 and not model.training
    for name, value in weights.items():
        assert torch.equal(model.state_dict()[name], value), name


def test_the_average_never_reads_a_count_on_the_host(monkeypatch):
    """BatchNorm's cumulative mode (momentum None) turns num_batches_tracked into a Python float in
    every layer and batch: on a GPU, a device sync each. The re-estimate gives BatchNorm a number."""
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4))
    seen = []
    for layer in (model[1], model[3]):
        layer.register_forward_hook(lambda module, inputs, output: seen.append(module.momentum))
    dataset = images_dataset(60)
    loader = statistics_loader(DataLoader(dataset, batch_size=20, collate_fn=collate_batch),
                               max_images=60, seed=0, full_batches=False)
    host_reads = []
    real_float = torch.Tensor.__float__
    monkeypatch.setattr(torch.Tensor, "__float__", lambda t: host_reads.append(t) or real_float(t))
    reestimate(model, loader, lambda images, labels: model(dataset.normalise(images)))
    assert host_reads == []
    assert seen == [1.0, 1.0, 1 / 2, 1 / 2, 1 / 3, 1 / 3]  # the k-th batch weighs 1/k: an equal-weight average
    assert model[1].momentum == model[3].momentum == 0.1


def test_a_model_without_batchnorm_is_left_alone():
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    calls = []
    assert reestimate(model, [(torch.zeros(2, 1, 8, 8), torch.zeros(2))], lambda *batch: calls.append(1)) is False
    assert calls == []


def test_the_sample_is_fixed_and_never_ends_in_a_batch_of_one():
    train = DataLoader(images_dataset(41), batch_size=8, shuffle=True, collate_fn=collate_batch)
    first, again = (statistics_loader(train, max_images=33, seed=3, full_batches=False) for _ in range(2))
    assert [labels.tolist() for _, labels in first] == [labels.tolist() for _, labels in again]
    assert [len(labels) for _, labels in first] == [8, 8, 8, 8]  # 33 = 4 x 8 + 1: the one is dropped
    pipeline = statistics_loader(train, max_images=20, seed=3, full_batches=True)
    assert [len(labels) for _, labels in pipeline] == [8, 8]
    assert statistics_loader(train, max_images=5, seed=3, full_batches=True) is None


@pytest.mark.parametrize("changes, fires", [
    ({}, True),
    ({"reestimated": True}, False),
    ({"has_batchnorm": False}, False),
    ({"val_acc": 0.8}, False),          # a gap this small is not lagging statistics
    ({"train_acc": 0.3, "val_acc": 0.0}, False),
    ({"epoch": 50}, False),             # 600 steps: running averages have caught up
])
def test_the_lag_note_rule(changes, fires):
    values = dict(train_acc=0.99, val_acc=0.10, epoch=3, steps_per_epoch=12, reestimated=False, has_batchnorm=True)
    note = lag_note(**{**values, **changes})
    assert (note is not None) == fires
    if fires:
        assert note.startswith("Epoch 3: validation accuracy 10.0% trails training accuracy 99.0%")
        assert "36 steps (12 per epoch)" in note
