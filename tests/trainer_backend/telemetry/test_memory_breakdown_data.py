"""The memory breakdown counts a dataset kept on the device as its own part ("data_mb"), as the
memory estimate does, instead of under "activations and other"; the charts show it so.

    .venv/bin/python -m pytest tests/trainer_backend/telemetry/test_memory_breakdown_data.py -q
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from torch import nn

from reports.efficiency import breakdown_figure, breakdown_frame
from trainer_backend.rank.forecast.memory_estimate import PARTS
from trainer_backend.telemetry.memory_breakdown import FIELDS, HeldMemory, local_breakdown

MB = 2**20


def test_a_kept_dataset_is_counted_as_its_own_part_once():
    model = nn.Linear(64, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    images, labels = torch.zeros(1000, 3, 8, 8, dtype=torch.uint8), torch.zeros(1000, dtype=torch.int64)
    held = HeldMemory(model, optimizer, [torch.device("cpu")])
    held.hold_data([images, labels, images[:10]])  # a view of a counted storage is not counted again
    model(torch.randn(4, 64)).sum().backward()
    optimizer.step()
    (params, grads, optim, data), = held.mb.values()
    assert data == pytest.approx((images.numel() + 8 * labels.numel()) / MB)
    assert params == grads == optim == pytest.approx((64 * 16 + 16) * 4 / MB)


def test_the_rest_is_the_peak_less_the_dataset_too_and_the_estimate_names_the_same_part():
    (entry,) = local_breakdown({"cuda:0": [10.0, 10.0, 20.0, 28.0]}, {"cuda:0": 100.0}).values()
    assert entry == {"parameters_mb": 10.0, "gradients_mb": 10.0, "optimizer_mb": 20.0, "data_mb": 28.0,
                     "activations_other_mb": 32.0}
    assert set(FIELDS) - {"activations_other_mb"} <= set(PARTS)  # the estimate's "data_mb" is the breakdown's


def test_the_chart_stacks_the_dataset_as_its_own_bar_and_older_runs_without_it():
    extra = {"memory_breakdown": {"cuda:0": {"parameters_mb": 10.0, "gradients_mb": 10.0, "optimizer_mb": 20.0,
                                             "data_mb": 28.0, "activations_other_mb": 32.0}}}
    older = {"memory_breakdown": {"cuda:0": {"parameters_mb": 10.0, "gradients_mb": 10.0, "optimizer_mb": 20.0,
                                             "activations_other_mb": 60.0}}}
    epochs = pd.DataFrame([{"run_id": 1, "epoch": 1, "extra": extra}, {"run_id": 2, "epoch": 1, "extra": older}])
    frame = breakdown_frame(epochs, {1: "kept", 2: "older"})
    figure = breakdown_figure(frame)
    bars = {bar.name: list(bar.y) for bar in figure.data}
    assert bars["dataset kept on the device"][0] == 28.0 and bars["activations and other"] == [32.0, 60.0]
    assert pd.isna(bars["dataset kept on the device"][1])
