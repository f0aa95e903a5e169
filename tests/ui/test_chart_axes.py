"""Every line chart's y axis starts at zero, so noise is not drawn as a trend: a process whose peak
memory is 1,286.8-1,287.6 MB over its epochs is drawn as the flat line it is, not as a climb from the
foot of the chart to its top (the range autorange would give: the values' own span).

    .venv/bin/python -m pytest tests/ui/test_chart_axes.py -q
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from reports import scaling
from reports import charts, series_charts
from tests.support import system_metric_rows

STEADY_MB = [1286.8, 1287.3, 1287.6, 1287.1]


def drawn_share(values: list[float], bounds: list[float]) -> float:
    """How much of the chart's height the values' spread takes up."""
    return (max(values) - min(values)) / (bounds[1] - bounds[0])


def test_a_steady_series_is_drawn_flat_near_its_top():
    bounds = charts.y_range(STEADY_MB)
    assert bounds[0] == 0.0 and bounds[1] > max(STEADY_MB)
    assert drawn_share(STEADY_MB, bounds) < 0.001
    assert max(STEADY_MB) / bounds[1] > 0.9  # the line near the top, not lost at the foot


def test_a_constant_series_is_flat_and_zeros_get_a_unit_range():
    bounds = charts.y_range([274.0] * 5)
    assert bounds[0] == 0.0 and 274.0 < bounds[1] < 300.0
    assert charts.y_range([0.0, 0.0]) == [0.0, 1.0]


def test_a_real_change_still_fills_the_chart():
    losses = [2.3, 1.1, 0.4]
    bounds = charts.y_range(losses)
    assert drawn_share(losses, bounds) > 0.7


def test_negative_values_keep_zero_and_room_below():
    bounds = charts.y_range([-0.2, 0.1])
    assert bounds[0] < -0.2 and bounds[1] > 0.1


def test_no_finite_value_gives_no_range():
    assert charts.y_range([]) is None
    assert charts.y_range([None, math.nan, math.inf]) is None
    assert charts.y_range([None, 3.0, math.nan]) == pytest.approx([0.0, 3.0 * (1 + charts.Y_PAD_SHARE)])


def y_bounds(figure) -> list[float] | None:
    bounds = figure.layout.yaxis.range
    return list(bounds) if bounds is not None else None


def epochs_of_a_steady_run() -> pd.DataFrame:
    rows = [{"run_id": 1, "epoch": epoch, "train_loss": 0.5, "val_loss": 0.6, "train_acc": 0.8, "val_acc": 0.8,
             "epoch_time_s": 10.0 + epoch / 100, "train_time_s": 9.0, "images_per_s": 274.0 + epoch / 10,
             "lr": 1e-3, "peak_memory_mb": {"cpu": mb}, "extra": {}}
            for epoch, mb in enumerate(STEADY_MB, start=1)]
    return scaling.epochs_frame(rows)


def test_every_epoch_chart_of_a_steady_run_starts_at_zero():
    epochs = epochs_of_a_steady_run()
    figures = {"loss": charts.loss_figure(epochs), "accuracy": charts.accuracy_figure(epochs),
               "throughput": charts.throughput_figure(epochs), "epoch time": charts.epoch_time_figure(epochs),
               "memory": charts.memory_figure(scaling.memory_frame(epochs)),
               "overlay": charts.overlay_figure(epochs, "images_per_s", "epoch", {1: "#1"})}
    for name, figure in figures.items():
        bounds = y_bounds(figure)
        assert bounds is not None and bounds[0] == 0.0, (name, bounds)
    memory = figures["memory"]
    assert drawn_share(STEADY_MB, y_bounds(memory)) < 0.001


def test_step_system_and_compare_charts_start_at_zero():
    steps = series_charts.steps_frame([{"run_id": 1, "epoch": 1, "step": step, "t_s": float(step),
                                        "train_loss": 0.5, "images_per_s": 274.0 + step % 2, "lr": 1e-3, "n": 1}
                                       for step in range(1, 11)])
    system = series_charts.system_frame(system_metric_rows(
        [{"run_id": 1, "t_s": float(t), "host_cpu_pct": 50.0, "host_memory_mb": 8000.0 + t % 3,
          "processes": [{"rank": 0, "cpu_pct": 99.0, "rss_mb": mb}]} for t, mb in enumerate(STEADY_MB)]))
    figures = {"step images/s": series_charts.step_figure(steps, "images_per_s"),
               "system memory": series_charts.system_figure(system, "memory_mb"),
               "system cpu": series_charts.system_figure(system, "cpu_pct"),
               "compare": series_charts.compare_figure(series_charts.compare_frame(steps, system, "process_rss_mb"),
                                                       "process_rss_mb", "t_s", {1: "#1"})}
    for name, figure in figures.items():
        bounds = y_bounds(figure)
        assert bounds is not None and bounds[0] == 0.0, (name, bounds)


def test_a_chart_without_points_yet_autoranges_from_zero():
    """The live step charts start from the empty figure's layout (ui/live_feed.py) and grow in the browser."""
    empty = series_charts.steps_frame([])
    figure = series_charts.step_figure(empty, "images_per_s")
    assert figure.layout.yaxis.range is None and figure.layout.yaxis.rangemode == "tozero"
