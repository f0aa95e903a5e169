"""Per-step points and system samples, from the database to what users see: the downsampled reads,
``export`` (JSON and ``--csv``), the chart helpers, the sweep report's utilisation and energy rows,
and the Run and Compare pages (Streamlit's AppTest). Rows are written with ``db.series`` into a
real SQLite file, as Parallax writes them.

    .venv/bin/python -m pytest tests/db/test_series_pages.py -q
"""

from __future__ import annotations

import base64
import csv
import json
import math

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

import db
from tests.support import ROOT, system_metric_rows
from db import series, store, system_metrics
from reports import run_csv, sweep_report
from reports.scaling import epochs_frame
from trainer_backend.control import cli
from reports import series_charts

APP = str(ROOT / "app.py")
TIMEOUT_S = 90
CONFIG = {"dataset": "digits", "model": "test_resnet", "strategy": "single", "devices": ["cpu"], "batch_size": 64,
          "image_size": 16, "amp": "auto", "epochs": 2, "tags": []}


def step_rows(first: int, last: int, *, steps_per_epoch: int = 100) -> list[dict]:
    """Steps first..last; step s has loss s (so a bucket's mean is known) and takes 0.5 s."""
    return [{"epoch": 1 + (s - 1) // steps_per_epoch, "step": s, "t_s": 0.5 * s, "train_loss": float(s),
             "images_per_s": 100.0 + s % 7, "lr": 0.1} for s in range(first, last + 1)]


def sample_rows(first_s: int, last_s: int, *, gpus: int = 0, ranks: int = 1) -> list[dict]:
    """A sample a second; every figure of the sample at t holds t, so a returned sample shows it is real."""
    return [{"t_s": float(t), "host_cpu_pct": 50.0 + t % 10, "host_memory_mb": 4000.0 + t,
             "processes": [{"rank": r, "cpu_pct": 90.0 + r, "rss_mb": 800.0 + t} for r in range(ranks)],
             "gpus": [{"index": i, "util_pct": 80.0 + i, "memory_used_mb": 1000.0 * (i + 1) + t, "power_w": 300.0 + t,
                       "temperature_c": 60.0, "sm_clock_mhz": 1900.0} for i in range(gpus)]}
             for t in range(first_s, last_s + 1)]


def log_epochs(engine, run_id: int, extras: list[dict]) -> None:
    for epoch, extra in enumerate(extras, start=1):
        store.log_epoch(engine, run_id, {"epoch": epoch, "train_loss": 1.0 / epoch, "val_acc": 0.5 * epoch,
                                         "epoch_time_s": 60.0, "train_time_s": 50.0, "images_per_s": 100.0,
                                         "peak_memory_mb": {"rank0:cpu": 900.0}, "extra": extra})


# --- reads --------------------------------------------------------------------------------


def test_short_runs_come_back_whole_and_long_ones_as_buckets_of_last_min_and_max_that_keep_epoch_starts(engine):
    run_id = store.create_run(engine, CONFIG)
    rows = step_rows(1, 1000)
    rows[436]["train_loss"] = 5000.0  # a one-step spike (step 437)
    series.add_steps(engine, run_id, rows)
    whole = series.read_steps(engine, [run_id], max_points=None)
    assert [r["step"] for r in whole] == list(range(1, 1001)) and {r["n"] for r in whole} == {1}
    assert whole[0] == {"run_id": run_id, "epoch": 1, "step": 1, "t_s": 0.5, "train_loss": 1.0,
                        "images_per_s": 101.0, "lr": 0.1, "n": 1}
    assert len(series.read_steps(engine, [run_id], max_points=1000)) == 1000

    thinned = series.read_steps(engine, [run_id], max_points=50)  # buckets of 20 steps, 5 per epoch
    assert len(thinned) == 50
    assert sum(r["n"] for r in thinned) == 1000
    assert [r["first_step"] for r in thinned] == list(range(1, 1001, 20))
    for row in thinned:  # the bucket's last point whole, and its range
        assert row["step"] == row["first_step"] + 19 and row["t_s"] == 0.5 * row["step"] and row["n"] == 20
        assert row["train_loss"] == row["step"] and row["images_per_s"] == 100.0 + row["step"] % 7
        assert row["train_loss_min"] == row["first_step"] and row["images_per_s_max"] == 106.0
        assert row["train_loss_max"] == (5000.0 if row["first_step"] <= 437 <= row["step"] else row["step"])
    assert {r["first_step"] for r in thinned if r["first_step"] % 100 == 1} == set(range(1, 1001, 100))  # epoch starts

    uneven = series.read_steps(engine, [run_id], max_points=7)  # buckets of 143 steps cross epoch ends
    assert sum(r["n"] for r in uneven) == 1000
    assert len(uneven) <= 7 + 9  # at most one extra row per epoch end
    assert all(r["epoch"] == 1 + (r["first_step"] - 1) // 100 == 1 + (r["step"] - 1) // 100 for r in uneven)
    assert max(r["train_loss_max"] for r in uneven) == 5000.0


def test_long_runs_of_samples_come_back_per_metric_as_buckets_of_last_min_and_max(engine):
    run_id = store.create_run(engine, CONFIG)
    rows = sample_rows(0, 999, gpus=2, ranks=2)
    rows[437]["gpus"][1]["util_pct"] = 100.0  # a one-second spike of GPU 1
    system_metrics.add_samples(engine, run_id, rows)
    assert len(system_metrics.read_samples(engine, [run_id])) == 1000
    thinned = system_metrics.read_metric(engine, [run_id], [("gpu", "util_pct"), ("gpu", "memory_used_mb")],
                                         max_points=40)
    assert {(r["kind"], r["metric"]) for r in thinned} == {("gpu", "util_pct"), ("gpu", "memory_used_mb")}
    for device in (0, 1):
        memory = [r for r in thinned if r["metric"] == "memory_used_mb" and r["device"] == device]
        assert 10 <= len(memory) <= 40 and sum(r["n"] for r in memory) == 1000  # whole minutes, from summaries
        times = [r["t_s"] for r in memory]
        assert times == sorted(times) and times[-1] == 999.0
        for row in memory:  # each bucket's last sample's reading at its time, and its range
            assert row["value"] == 1000.0 * (device + 1) + row["t_s"] == row["max"]
            assert row["min"] == row["max"] - row["n"] + 1
    spiked = [r for r in thinned if r["metric"] == "util_pct" and r["device"] == 1]
    assert max(r["max"] for r in spiked) == 100.0 and max(r["value"] for r in spiked) == 81.0


def test_reads_keep_runs_apart_and_last_step_and_sample_move_with_new_rows(engine):
    first, second, empty = (store.create_run(engine, CONFIG) for _ in range(3))
    series.add_steps(engine, first, step_rows(1, 30))
    series.add_steps(engine, second, step_rows(1, 5))
    system_metrics.add_samples(engine, second, sample_rows(0, 3))
    rows = series.read_steps(engine, [second, first, empty], max_points=10)
    assert [r["run_id"] for r in rows] == [second] * 5 + [first] * 10
    assert series.last_step(engine, [first, second, empty]) == {first: 30, second: 5, empty: 0}
    before = series.last_sample(engine, [first, second])
    assert before[first] == 0 and before[second] > 0
    system_metrics.add_samples(engine, second, sample_rows(4, 4))
    assert series.last_sample(engine, [second])[second] > before[second]
    assert system_metrics.read_metric(engine, [empty], [("host", "cpu_pct")]) == []
    assert system_metrics.read_samples(engine, [empty]) == []


def test_reads_bucket_alike_on_every_backend(backend_db_url):
    # PostgreSQL rounds where SQLite truncates a CAST to integer, and divides integers apart:
    # the buckets may shift, but their count, the points they hold and the real samples stay.
    engine = db.make_engine(backend_db_url)
    run_id = store.create_run(engine, CONFIG)
    series.add_steps(engine, run_id, step_rows(1, 1000))
    system_metrics.add_samples(engine, run_id, sample_rows(0, 499, gpus=1))
    steps = series.read_steps(engine, [run_id], max_points=50)
    assert len(steps) <= 50 + 9 and sum(r["n"] for r in steps) == 1000
    assert {r["first_step"] for r in steps} >= set(range(1, 1001, 100))
    assert all(r["epoch"] == 1 + (r["step"] - 1) // 100 == 1 + (r["first_step"] - 1) // 100 for r in steps)
    samples = system_metrics.read_metric(engine, [run_id], [("gpu", "memory_used_mb")], max_points=40)
    assert 30 <= len(samples) <= 40 and sum(r["n"] for r in samples) == 500
    assert all(r["value"] == r["max"] == 1000.0 + r["t_s"] for r in samples)
    assert series.last_step(engine, [run_id]) == {run_id: 1000}
    db.dispose_engines()


@pytest.mark.parametrize("bad", [0, 1, -5, 2.5, True, "100"])
def test_a_bad_max_points_is_refused_in_one_line(engine, bad):
    with pytest.raises(ValueError, match=r"max_points must be a whole number of 2 or more"):
        series.read_steps(engine, [1], max_points=bad)


# --- export -------------------------------------------------------------------------------


@pytest.fixture
def recorded_run(engine) -> int:
    """A run with two epochs (energy measured in the first only), 6 steps and 3 samples of 2 ranks and 1 GPU."""
    run_id = store.create_run(engine, {**CONFIG, "strategy": "ddp", "devices": ["cuda:0", "cuda:1"]})
    log_epochs(engine, run_id, [{"energy_j_per_image": 0.25, "energy_j": {"gpu0": 40.0, "cpu_package": 10.0},
                                 "t_end_s": 1.6, "ranks": [{"rank": 0, "train_time_s": 1.5}], "note": "=HYPERLINK(1)"},
                                {"energy_j_per_image": None, "t_end_s": 3.1}])
    series.add_steps(engine, run_id, step_rows(1, 6, steps_per_epoch=3))
    system_metrics.add_samples(engine, run_id, sample_rows(1, 3, gpus=1, ranks=2))
    return run_id


def test_export_carries_every_step_and_sample_and_energy_per_image_per_epoch(engine, recorded_run):
    store.set_process(engine, recorded_run, pid=1, host="trainer-a")
    exported = store.export_run(engine, recorded_run)
    assert list(exported)[-2:] == ["steps", "system"]
    assert json.loads(json.dumps(exported)) == exported
    assert [e["energy_j_per_image"] for e in exported["epochs"]] == [0.25, None]
    assert exported["steps"][0] == {"epoch": 1, "step": 1, "t_s": 0.5, "train_loss": 1.0, "images_per_s": 101.0,
                                    "lr": 0.1}
    assert [s["step"] for s in exported["steps"]] == [1, 2, 3, 4, 5, 6]
    assert exported["system"][0] == {
        "t_s": 1.0, "host": "trainer-a", "node": 0, "host_cpu_pct": 51.0, "host_memory_mb": 4001.0,
        "processes": [{"rank": 0, "cpu_pct": 90.0, "rss_mb": 801.0}, {"rank": 1, "cpu_pct": 91.0, "rss_mb": 801.0}],
        "gpus": [{"index": 0, "util_pct": 80.0, "memory_used_mb": 1001.0, "power_w": 301.0, "temperature_c": 60.0,
                  "sm_clock_mhz": 1900.0}],
    }
    bare = store.export_run(engine, store.create_run(engine, CONFIG))
    assert bare["steps"] == [] and bare["system"] == []


def read_csv(path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_export_csv_writes_epochs_steps_and_a_wide_system_table_safe_for_spreadsheets(db_url, engine, recorded_run,
                                                                                      tmp_path, capsys):
    out = tmp_path / "out" / "run"
    assert cli.main(["--db", db_url, "export", str(recorded_run), "--csv", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == [f"wrote {out / name}" for name in run_csv.CSV_FILES]

    epochs = read_csv(out / "epochs.csv")
    assert [e["energy_j_per_image"] for e in epochs] == ["0.25", ""]
    assert epochs[0]["energy_j[gpu0]"] == "40.0" and epochs[0]["peak_memory_mb[rank0:cpu]"] == "900.0"
    assert epochs[0]["note"] == "'=HYPERLINK(1)"  # a text cell never starts a formula
    assert json.loads(epochs[0]["ranks"]) == [{"rank": 0, "train_time_s": 1.5}]

    steps = read_csv(out / "steps.csv")
    assert list(steps[0]) == ["run_id", *series.STEP_FIELDS] and len(steps) == 6

    with open(out / "system.csv", newline="") as handle:
        header = next(csv.reader(handle))
    assert header == ["run_id", "t_s", "host", "node", "host_cpu_pct", "host_memory_mb", "rank0_cpu_pct", "rank0_rss_mb",
                      "rank1_cpu_pct", "rank1_rss_mb", "gpu0_util_pct", "gpu0_memory_used_mb", "gpu0_power_w",
                      "gpu0_temperature_c", "gpu0_sm_clock_mhz"]
    system = read_csv(out / "system.csv")
    assert [row["gpu0_power_w"] for row in system] == ["301.0", "302.0", "303.0"]


def test_export_csv_refuses_a_file_as_folder_before_writing_anything(db_url, recorded_run, tmp_path, capsys):
    blocker = tmp_path / "taken"
    blocker.write_text("x")
    assert cli.main(["--db", db_url, "export", str(recorded_run), "--csv", str(blocker / "out")]) != 0
    err = capsys.readouterr().err
    assert f"--csv {blocker / 'out'} is inside {blocker}, which is a file" in err and len(err.strip().splitlines()) == 1


# --- chart helpers ------------------------------------------------------------------------


def test_epoch_marks_use_t_end_s_on_the_time_axis_and_the_first_step_on_the_step_axis():
    steps = series_charts.steps_frame([{"run_id": 1, **row, "n": 1} for row in step_rows(1, 9, steps_per_epoch=3)])
    epochs = epochs_frame([{"run_id": 1, "epoch": 1, "extra": {"t_end_s": 1.6}},
                           {"run_id": 1, "epoch": 2, "extra": {}}])
    marks = series_charts.epoch_marks(epochs, steps)
    assert marks.to_dict("records") == [{"epoch": 2, "step": 4, "t_s": 1.6},   # the end of epoch 1's training
                                        {"epoch": 3, "step": 7, "t_s": 3.5}]  # no t_end_s: its first step
    figure = series_charts.step_figure(steps, "train_loss", marks)
    assert [shape.x0 for shape in figure.layout.shapes] == [4, 7]
    assert figure.data[0].y.tolist() == [float(s) for s in range(1, 10)]
    assert series_charts.epoch_marks(epochs_frame([]), series_charts.steps_frame([])).empty


def test_system_frames_and_figures_draw_a_line_per_device_and_gpu_charts_only_with_gpus():
    rows = system_metric_rows([{"run_id": 1, **row} for row in sample_rows(0, 4, gpus=2, ranks=2)])
    system = series_charts.system_frame(rows)
    assert series_charts.system_charts_for(system) == ["cpu_pct", "memory_mb", "util_pct", "power_w"]
    cpu = series_charts.system_figure(system, "cpu_pct")
    assert [trace.name for trace in cpu.data] == ["host", "rank 0", "rank 1"]
    power = series_charts.system_figure(system, "power_w")
    assert [trace.name for trace in power.data] == ["GPU 0", "GPU 1"]
    assert power.data[1].y.tolist() == [300.0 + t for t in range(5)]

    cpu_only = series_charts.system_frame(system_metric_rows([{"run_id": 1, **row} for row in sample_rows(0, 2)]))
    assert series_charts.system_charts_for(cpu_only) == ["cpu_pct", "memory_mb"]
    none = series_charts.steps_frame([])
    assert series_charts.missing_series(["cpu"], False, none, cpu_only) == [
        "No per-step points: the run recorded none (they are written a few seconds' worth at a time).",
        "No GPU charts: the run trained on CPU processes only."]
    # While the run is active its step charts are the live ones, which say themselves that they wait.
    assert series_charts.missing_series(["cuda:0"], True, none, cpu_only) == [
        "No GPU samples: NVML could not be read where the run trained (see the run's notes)."]
    assert "recorded before Parallax kept them" in series_charts.missing_series(
        ["cpu"], False, none, series_charts.system_frame([]))[0]


def test_a_costly_rebuild_waits_so_that_watching_keeps_a_small_share_of_a_core():
    assert series_charts.rebuild_due(0.02, 5.0)  # a short run's charts: at every tick
    assert not series_charts.rebuild_due(0.3, 5.0) and series_charts.rebuild_due(0.3, 15.0)


def test_compare_frame_combines_devices_and_finds_a_samples_step_from_the_step_points():
    steps = series_charts.steps_frame([{"run_id": 1, **row, "n": 1} for row in step_rows(2, 8)])  # t 1.0 .. 4.0
    system = series_charts.system_frame(system_metric_rows([{"run_id": 1, **row} for row in sample_rows(0, 5, gpus=2)]))
    util = series_charts.compare_frame(steps, system, "gpu_util_pct")
    assert util["value"].tolist() == [80.5] * 6  # the mean of GPU 0 (80 %) and GPU 1 (81 %)
    assert util["t_s"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    stepped = util["step"].tolist()
    assert math.isnan(stepped[0]) and stepped[1:5] == [2.0, 4.0, 6.0, 8.0] and math.isnan(stepped[5])
    power = series_charts.compare_frame(steps, system, "gpu_power_w")
    assert power["value"].tolist() == [2 * (300.0 + t) for t in range(6)]  # summed over the GPUs
    figure = series_charts.compare_figure(util, "gpu_util_pct", "step", {1: "#1 ddp"})
    assert [trace.name for trace in figure.data] == ["#1 ddp"] and len(figure.data[0].x) == 4


# --- sweep report -------------------------------------------------------------------------


def test_the_sweep_report_gains_mean_utilisation_and_energy_per_image_with_the_reason_when_empty(engine):
    sweep_id = store.create_sweep(engine, CONFIG, ["single", "ddp"])
    single = store.create_run(engine, CONFIG, status="completed", sweep_id=sweep_id)
    log_epochs(engine, single, [{"energy_j_per_image": 0.2}, {"energy_j_per_image": 0.4}])
    system_metrics.add_samples(engine, single, sample_rows(0, 9, gpus=2))  # GPU 80 % and 81 %
    ddp = store.create_run(engine, {**CONFIG, "strategy": "ddp", "devices": ["cpu", "cpu"]}, status="completed",
                           sweep_id=sweep_id, notes=["No energy per image: no NVML energy counter and no RAPL here."])
    log_epochs(engine, ddp, [{"energy_j_per_image": None}])
    system_metrics.add_samples(engine, ddp, sample_rows(0, 9))  # host CPU 50..59 %

    table = sweep_report.sweep_table(engine, sweep_id).set_index("run_id")
    assert table.loc[single, "utilisation_pct"] == pytest.approx(80.5) and table.loc[single, "utilisation_of"] == "GPU"
    assert table.loc[ddp, "utilisation_pct"] == pytest.approx(54.5) and table.loc[ddp, "utilisation_of"] == "CPU"
    assert table.loc[single, "energy_j_per_image"] == pytest.approx(0.3)
    assert pd.isna(table.loc[ddp, "energy_j_per_image"])
    assert table.loc[ddp, "energy_note"] == "No energy per image: no NVML energy counter and no RAPL here."
    text = sweep_report.format_table(table.reset_index())
    assert "80% GPU" in text and "0.3" in text
    assert text.endswith(f"Why energy per image is empty: run {ddp} — No energy per image: no NVML energy counter "
                         "and no RAPL here.")


def test_a_reason_the_runs_of_a_sweep_share_is_said_once(engine):
    """Four CPU runs on a machine without RAPL: one reason, after the runs it concerns, not four times."""
    sweep_id = store.create_sweep(engine, CONFIG, ["single", "ddp", "mp", "pp"])
    no_rapl = "Energy per image is not recorded: cpu_package: RAPL is not available."
    run_ids = []
    for strategy in ("single", "ddp", "mp"):
        run_ids.append(store.create_run(engine, {**CONFIG, "strategy": strategy}, status="completed",
                                        sweep_id=sweep_id, notes=[no_rapl]))
        log_epochs(engine, run_ids[-1], [{"energy_j_per_image": None}])
    other = store.create_run(engine, {**CONFIG, "strategy": "pp"}, status="completed", sweep_id=sweep_id,
                             notes=["No energy per image: the GPU's counter stopped."])
    log_epochs(engine, other, [{"energy_j_per_image": None}])

    table = sweep_report.sweep_table(engine, sweep_id)
    line = sweep_report.energy_gaps_line(table, run_name=lambda run_id: f"#{run_id}")
    assert line.count("RAPL is not available") == 1
    assert line == ("Why energy per image is empty: " + ", ".join(f"#{run_id}" for run_id in run_ids)
                    + " — Energy per image is not recorded: cpu_package: RAPL is not available; "
                    f"#{other} — No energy per image: the GPU's counter stopped.")
    assert sweep_report.format_table(table).count("RAPL is not available") == 1


# --- pages --------------------------------------------------------------------------------


def open_page(page: str, **query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    for key, value in query.items():
        at.query_params[key] = str(value)
    at.switch_page(page).run()
    assert not at.exception, at.exception
    return at


def values(array) -> list:
    """A trace's values from the chart's JSON, where plotly writes numeric arrays as base64 bytes."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"]).tolist()
    return list(array)


def chart_titles(at: AppTest) -> list[str]:
    return [json.loads(chart.proto.spec)["layout"]["title"]["text"].split("<br>")[0]
            for chart in at.get("plotly_chart")]


def test_run_page_charts_steps_and_system_per_device_and_says_why_gpu_charts_are_missing(parallax_home, engine):
    run_id = store.create_run(engine, CONFIG, status="completed")
    log_epochs(engine, run_id, [{"t_end_s": 1.6}, {"t_end_s": 3.1}])
    series.add_steps(engine, run_id, step_rows(1, 6, steps_per_epoch=3))
    system_metrics.add_samples(engine, run_id, sample_rows(0, 3, ranks=2))
    at = open_page("pages/run.py", run=run_id)
    titles = chart_titles(at)
    assert len(titles) == 5 + 4  # the epoch charts, then the step and system charts
    assert sorted(titles[5:]) == ["CPU utilisation", "Memory", "Throughput per step", "Training loss per step"]
    assert "No GPU charts: the run trained on CPU processes only." in [c.value for c in at.caption]


def test_compare_overlays_step_and_system_series_over_time_or_step(parallax_home, engine):
    first = store.create_run(engine, CONFIG, status="completed")
    second = store.create_run(engine, {**CONFIG, "strategy": "ddp", "devices": ["cpu", "cpu"]}, status="completed")
    old = store.create_run(engine, CONFIG, status="completed")  # recorded no series
    for run_id in (first, second):
        series.add_steps(engine, run_id, step_rows(1, 8))
        system_metrics.add_samples(engine, run_id, sample_rows(0, 5, ranks=2))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.session_state["compare_ids"] = [first, second, old]
    at.switch_page("pages/compare.py").run()
    assert not at.exception, at.exception
    overlay = at.get("plotly_chart")[-1]
    assert json.loads(overlay.proto.spec)["layout"]["xaxis"]["title"]["text"] == "Time since the run started (s)"
    assert len(json.loads(overlay.proto.spec)["data"]) == 2
    assert any(f"Not drawn for #{old}" in c.value for c in at.caption)

    at.selectbox(key="compare_series").set_value("process_cpu_pct")
    at.radio(key="compare_series_x").set_value("step").run()
    spec = json.loads(at.get("plotly_chart")[-1].proto.spec)
    assert spec["layout"]["xaxis"]["title"]["text"] == "Step"
    assert values(spec["data"][0]["y"]) == [181.0] * 4  # rank 0 + rank 1, of the samples at t 1..4 s


def test_sweep_page_shows_mean_utilisation_and_energy_per_image_and_why_one_is_missing(parallax_home, engine):
    sweep_id = store.create_sweep(engine, CONFIG, ["single"])
    run_id = store.create_run(engine, CONFIG, status="completed", sweep_id=sweep_id,
                              notes=["No energy per image: no counter is readable on this machine."])
    log_epochs(engine, run_id, [{"energy_j_per_image": None}])
    system_metrics.add_samples(engine, run_id, sample_rows(0, 3))  # host CPU 50..53 %
    at = open_page("pages/sweep.py", sweep=sweep_id)
    shown = at.table[0].value
    assert shown["mean utilisation"].tolist() == ["52% CPU"]
    assert shown["energy per image (J)"].tolist() == ["—"]
    assert any(c.value.startswith("Why energy per image is empty: #") and "no counter is readable on this "
               "machine" in c.value for c in at.caption)


def test_compare_draws_each_runs_bucketed_steps_as_a_band_that_keeps_a_spike(engine):
    first, second = store.create_run(engine, CONFIG), store.create_run(engine, CONFIG)
    for run_id in (first, second):
        rows = step_rows(1, 1000)
        rows[500]["train_loss"] = 9_999.0 if run_id == second else rows[500]["train_loss"]
        series.add_steps(engine, run_id, rows)
    steps = series_charts.steps_frame(series.read_steps(engine, [first, second], max_points=100))
    frame = series_charts.compare_frame(steps, series_charts.system_frame([]), "train_loss")
    figure = series_charts.compare_figure(frame, "train_loss", "step", {first: "#1", second: "#2"})
    traces = {trace.name: trace for trace in figure.data}
    assert set(traces) == {"#1", "#1 max", "#1 min", "#2", "#2 max", "#2 min"}
    assert max(traces["#2 max"].y) == 9_999.0 and max(traces["#2"].y) < 9_999.0
    assert figure.layout.yaxis.range[1] > 9_999.0  # the spike is on the axis
