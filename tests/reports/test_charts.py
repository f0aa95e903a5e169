"""Unit tests of the dashboard's pure parts: chart builders (the right traces with the right
numbers), the scaling arithmetic (throughput, speedup, efficiency, time to target), like-for-like
checks, config differences, CSV export and form validation.

    .venv/bin/python -m pytest tests/reports/test_charts.py -q
"""

from __future__ import annotations

import io

import pandas as pd
import pytest

from reports import scaling
from reports import charts
from ui.validation import validate_form


def epoch_rows(run_id: int, images_per_s: list[float], val_acc: list[float], epoch_time_s: float = 2.0,
               memory: dict | None = None) -> list[dict]:
    return [
        {"run_id": run_id, "epoch": i, "train_loss": 1.0 / i, "train_acc": acc, "val_loss": 1.5 / i, "val_acc": acc,
         "epoch_time_s": epoch_time_s, "train_time_s": epoch_time_s * 0.9, "images_per_s": ips, "lr": 1e-3,
         "peak_memory_mb": memory or {"cpu": 100.0 * i}, "extra": {}}
        for i, (ips, acc) in enumerate(zip(images_per_s, val_acc), start=1)
    ]


def run(run_id: int, strategy: str, devices: list[str], *, status: str = "completed", **config) -> dict:
    base = {"dataset": "digits", "model": "resnet18", "batch_size": 128, "image_size": 32, "amp": "auto",
            "strategy": strategy, "devices": devices, "epochs": 3, "tags": []}
    base.update(config)
    return {"id": run_id, "status": status, "strategy": strategy, "model": base["model"],
            "dataset": base["dataset"], "config": base}


@pytest.fixture
def epochs() -> pd.DataFrame:
    return scaling.epochs_frame(
        epoch_rows(1, [50, 100, 100], [0.5, 0.8, 0.95], epoch_time_s=3.0)          # single: 100 img/s steady
        + epoch_rows(2, [60, 170, 190], [0.6, 0.91, 0.96], epoch_time_s=1.5,        # ddp x2: 180 img/s
                     memory={"rank0:cpu": 500.0, "rank1:cpu": 510.0})
    )


# --- arithmetic ---------------------------------------------------------------------------


def test_epochs_frame_adds_cumulative_wall_time_per_run(epochs):
    assert epochs[epochs.run_id == 1]["wall_time_s"].tolist() == [3.0, 6.0, 9.0]
    assert epochs[epochs.run_id == 2]["wall_time_s"].tolist() == [1.5, 3.0, 4.5]


def test_throughput_skips_the_first_epoch_unless_it_is_the_only_one(epochs):
    assert scaling.throughput_images_per_s(epochs[epochs.run_id == 2]) == pytest.approx(180.0)
    one_epoch = scaling.epochs_frame(epoch_rows(3, [42.0], [0.3]))
    assert scaling.throughput_images_per_s(one_epoch) == pytest.approx(42.0)
    assert scaling.throughput_images_per_s(scaling.epochs_frame([])) is None


def test_time_to_accuracy_is_wall_time_until_first_reached(epochs):
    assert scaling.time_to_accuracy_s(epochs[epochs.run_id == 1], 0.9) == pytest.approx(9.0)  # epoch 3
    assert scaling.time_to_accuracy_s(epochs[epochs.run_id == 2], 0.9) == pytest.approx(3.0)  # epoch 2
    assert scaling.time_to_accuracy_s(epochs[epochs.run_id == 2], 0.99) is None


def test_scaling_table_speedup_and_efficiency_against_the_single_baseline(epochs):
    runs = [run(1, "single", ["cpu"]), run(2, "ddp", ["cpu", "cpu"]),
            run(3, "ddp", ["cpu", "cpu"], model="resnet50")]  # no baseline for resnet50
    baselines = scaling.pick_baselines(runs, stored={})
    table = scaling.scaling_table(runs, epochs, baselines, target_acc=0.9).set_index("run_id")

    assert table.loc[1, "speedup"] == pytest.approx(1.0)
    assert table.loc[2, "speedup"] == pytest.approx(1.8)
    assert table.loc[2, "efficiency"] == pytest.approx(0.9)
    assert table.loc[2, "baseline_run_id"] == 1
    assert table.loc[2, "label"] == "#2 ddp×2 resnet18"
    assert table.loc[2, "time_to_target_s"] == pytest.approx(3.0)
    assert pd.isna(table.loc[3, "baseline_run_id"]) and pd.isna(table.loc[3, "speedup"])
    assert pd.isna(table.loc[3, "throughput_images_per_s"])  # no epochs yet


def test_picked_completed_single_run_wins_over_the_stored_baseline():
    runs = [run(5, "single", ["cpu"]), run(6, "ddp", ["cpu", "cpu"]), run(7, "single", ["cpu"], status="failed")]
    key = ("digits", "resnet18", 128, 32, "auto")
    assert scaling.pick_baselines(runs, stored={key: 1}) == {key: 5}
    assert scaling.pick_baselines(runs[1:], stored={key: 1}) == {key: 1}


def test_like_for_like_names_each_differing_field_and_value():
    same = [run(1, "single", ["cpu"]), run(2, "ddp", ["cpu", "cpu"])]
    assert scaling.like_for_like_problems(same) == []
    mixed = [*same, run(3, "ddp", ["cpu", "cpu"], model="resnet50", batch_size=64)]
    problems = scaling.like_for_like_problems(mixed)
    assert problems == ["model differs (#1 resnet18, #2 resnet18, #3 resnet50)",
                        "batch size differs (#1 128, #2 128, #3 64)"]


def test_config_differences_keep_only_fields_that_differ():
    runs = [run(1, "single", ["cpu"], tags=["a"]), run(2, "ddp", ["cpu", "cpu"], tags=["b"])]
    table = scaling.config_differences(runs)
    assert sorted(table.index) == ["devices", "strategy"]
    assert table.loc["devices"].tolist() == ["cpu", "cpu,cpu"]
    assert list(table.columns) == ["#1", "#2"]


def test_metrics_csv_holds_every_epoch_with_its_run(epochs):
    text = scaling.metrics_csv([run(1, "single", ["cpu"]), run(2, "ddp", ["cpu", "cpu"])], epochs)
    table = pd.read_csv(io.StringIO(text))
    assert len(table) == 6
    assert {"run_id", "strategy", "devices", "epoch", "val_acc", "images_per_s", "wall_time_s"} <= set(table.columns)
    assert table[table.run_id == 2]["devices"].unique().tolist() == ["cpu,cpu"]


def test_metrics_csv_writes_nested_cells_as_json(epochs):
    """A cell holding a dict reads back with json.loads: double quotes and null, not Python's ' and None."""
    import json

    epochs = epochs.copy()
    epochs["extra"] = [{"mfu": None, "ranks": {"0": 1.5}, "amp": "bf16"}] * len(epochs)
    table = pd.read_csv(io.StringIO(scaling.metrics_csv([run(1, "single", ["cpu"]), run(2, "ddp", ["cpu", "cpu"])],
                                                        epochs)))
    assert [json.loads(cell) for cell in table["extra"]] == [{"amp": "bf16", "mfu": None, "ranks": {"0": 1.5}}] * 6
    assert json.loads(table["peak_memory_mb"].iloc[0]) == {"cpu": 100.0}


# --- figures ------------------------------------------------------------------------------


def names(figure) -> list[str]:
    return [trace.name for trace in figure.data]


def test_run_figures_have_one_trace_per_metric(epochs):
    one = epochs[epochs.run_id == 2]
    assert names(charts.loss_figure(one)) == ["training", "validation"]
    accuracy = charts.accuracy_figure(one)
    assert names(accuracy) == ["training", "validation"]
    assert list(accuracy.data[1].y) == [0.6, 0.91, 0.96]
    assert names(charts.throughput_figure(one)) == ["training"]
    assert names(charts.epoch_time_figure(one)) == ["epoch (train + validation)", "training only"]
    memory = charts.memory_figure(scaling.memory_frame(one))
    assert names(memory) == ["rank0:cpu", "rank1:cpu"]
    assert list(memory.data[1].y) == [510.0, 510.0, 510.0]


def test_figures_of_a_run_without_epochs_are_empty_not_errors():
    empty = scaling.epochs_frame([])
    for build in (charts.loss_figure, charts.accuracy_figure, charts.throughput_figure, charts.epoch_time_figure):
        assert build(empty).data == ()
    assert charts.memory_figure(scaling.memory_frame(empty)).data == ()
    assert names(charts.speedup_figure(scaling.scaling_table([], empty, {}, 0.9))) == ["ideal (linear)"]


def test_overlay_has_one_line_per_run_over_epoch_or_wall_time(epochs):
    labels = {1: "#1 single", 2: "#2 ddp×2"}
    by_epoch = charts.overlay_figure(epochs, "val_acc", "epoch", labels)
    assert names(by_epoch) == ["#1 single", "#2 ddp×2"]
    by_time = charts.overlay_figure(epochs, "val_acc", "wall_time_s", labels)
    assert list(by_time.data[1].x) == [1.5, 3.0, 4.5]
    assert by_time.layout.xaxis.title.text == "Wall-clock time (s)"


def test_speedup_and_efficiency_figures_show_runs_against_the_ideal(epochs):
    runs = [run(1, "single", ["cpu"]), run(2, "ddp", ["cpu", "cpu"])]
    table = scaling.scaling_table(runs, epochs, scaling.pick_baselines(runs, {}), 0.9)
    speedup = charts.speedup_figure(table)
    assert names(speedup) == ["ideal (linear)", "#1 single resnet18", "#2 ddp×2 resnet18"]
    assert list(speedup.data[0].x) == list(speedup.data[0].y)  # ideal: speedup == devices
    assert speedup.data[2].x[0] == 2 and speedup.data[2].y[0] == pytest.approx(1.8)
    efficiency = charts.efficiency_figure(table)
    assert list(efficiency.data[0].y) == pytest.approx([1.0, 0.9])
    assert [shape.y0 for shape in efficiency.layout.shapes] == [1.0]  # the ideal line


def test_runs_without_an_epoch_give_a_table_of_floats_that_can_be_rounded():
    """Compare with runs picked before their first epoch ended: the figures are missing, not objects."""
    runs = [run(1, "single", ["cpu"]), run(2, "ddp", ["cpu", "cpu"])]
    empty = scaling.epochs_frame([])
    table = scaling.scaling_table(runs, empty, scaling.pick_baselines(runs, {}), 0.9)
    for column in ("throughput_images_per_s", "speedup", "efficiency", "time_to_target_s"):
        assert table[column].dtype == float and table[column].round(2).isna().all()


# --- form validation ----------------------------------------------------------------------


def test_validate_form_reports_every_bad_field_at_once():
    config, errors = validate_form({"epochs": 0, "strategy": "ddp", "devices": ("cpu", "cpu"), "batch_size": 5})
    assert config is None
    assert set(errors) == {"epochs", "batch_size"}
    assert "epochs 0" in errors["epochs"]
    assert "batch_size 5" in errors["batch_size"] and "2 DDP processes" in errors["batch_size"]


def test_validate_form_returns_the_config_when_all_is_well():
    config, errors = validate_form({"strategy": "ddp", "devices": ("cpu", "cpu"), "batch_size": 64, "epochs": 2})
    assert errors == {}
    assert config.world_size == 2 and config.per_device_batch == 32


def test_memory_chart_says_what_it_shows_on_cpu_and_on_gpus():
    cpu = charts.memory_figure(scaling.memory_frame(scaling.epochs_frame(epoch_rows(1, [1.0], [0.5]))))
    assert "peak resident set" in cpu.layout.title.text and names(cpu) == ["cpu"]

    rows = epoch_rows(2, [1.0, 1.0], [0.5, 0.6], memory={"cuda:0": 900.0, "cuda:1": 700.0})
    for row in rows:
        row["extra"] = {"peak_memory_reserved_mb": {"cuda:0": 1024.0, "cuda:1": 768.0}}
    gpu = charts.memory_figure(scaling.memory_frame(scaling.epochs_frame(rows)))
    assert "allocated by tensors" in gpu.layout.title.text and "reserved" in gpu.layout.title.text
    assert names(gpu) == ["cuda:0", "cuda:0 reserved", "cuda:1", "cuda:1 reserved"]
    assert list(gpu.data[1].y) == [1024.0, 1024.0] and gpu.data[1].line.dash == "dash"
    assert gpu.data[0].line.color == gpu.data[1].line.color != gpu.data[2].line.color
