"""A strategy sweep from the CLI: one config, one run per strategy, queued one after another,
then the scaling report with speedup and efficiency."""

from __future__ import annotations

import re

import pytest

from tests.support import run_cli
from db import make_engine, store
from contract.config import ConfigError, RunConfig
from trainer_backend.control.lifecycle import sweep_configs
from reports.sweep_report import strategy_advice, sweep_table


def test_sweep_configs_put_each_strategy_on_its_devices():
    base = RunConfig(strategy="mp", devices=("cpu", "cpu"), batch_size=64)
    configs = {c.strategy: c for c in sweep_configs(base, ["single", "dp", "ddp", "mp", "pp", "fsdp"])}
    assert configs["single"].devices == ("cpu",) and configs["dp"].devices == ("cpu",)
    assert all(configs[s].devices == ("cpu", "cpu") for s in ("ddp", "mp", "pp", "fsdp"))
    with pytest.raises(ConfigError, match="'zero'"):
        sweep_configs(base, ["single", "zero"])


def test_cli_sweep_runs_every_strategy_and_prints_the_report(parallax_home, tmp_path):
    report = tmp_path / "sweep.html"
    result = run_cli(
        "sweep", "--strategies", "single,ddp,mp,pp", "--device-counts", "2", "--model", "test_resnet",
        "--image-size", "16", "--epochs", "1", "--batch-size", "64", "--target-acc", "0.05", "--report", str(report),
        home=parallax_home,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    finished = [line for line in lines if re.fullmatch(r"run_id=\d+ status=\w+", line)]
    assert [line.split("=")[-1] for line in finished] == ["completed"] * 4
    header = next(line for line in lines if "speedup" in line)
    assert "efficiency" in header and "images/s" in header and "MFU" in header and "time to target" in header
    assert "Fastest:" in lines[-1]
    # From the runs on 2 devices, a forecast for 4 and 8 (a pipeline also for 4 and 8 stages).
    forecast = lines[lines.index("Scaling forecast") + 1:]
    predicted = [line.split()[:2] for line in forecast[1:] if line.split()[:1] in (["ddp"], ["mp"], ["pp"])]
    assert predicted == [["ddp", "4"], ["ddp", "8"], ["mp", "4"], ["mp", "8"], ["pp", "4"], ["pp", "8"]]
    assert any(line.startswith("Model: step = compute per device") for line in forecast)

    engine = make_engine(f"sqlite:///{parallax_home / 'parallax.db'}")
    sweep_id = int(lines[0].split()[0].split("=")[1])
    runs = [store.get_run(engine, run_id) for run_id in store.sweep_run_ids(engine, sweep_id)]
    # --device-counts 2: a single-device strategy runs once, on one device; the others on 2 CPU processes.
    assert [(r.strategy, len(r.config["devices"])) for r in runs] == [("single", 1), ("ddp", 2), ("mp", 2), ("pp", 2)]
    # Queued one after another: each started after the previous one finished.
    for earlier, later in zip(runs, runs[1:]):
        assert later.started_at >= earlier.finished_at
    table = sweep_table(engine, sweep_id, target_acc=0.05)
    single = table[table["strategy"] == "single"].iloc[0]
    assert single["speedup"] == pytest.approx(1.0)
    for row in table.itertuples():
        assert row.speedup == pytest.approx(row.throughput_images_per_s / single["throughput_images_per_s"])
        assert row.efficiency == pytest.approx(row.speedup / row.devices)
        assert row.peak_memory_mb > 0
    assert "Strategy sweep" in report.read_text() and "Fastest:" in report.read_text()
    assert "Scaling forecast" in report.read_text()


def test_advice_prefers_data_parallel_when_it_is_fastest():
    import pandas as pd

    table = pd.DataFrame([
        {"strategy": "single", "devices": 1, "status": "completed", "throughput_images_per_s": 100.0, "speedup": 1.0, "efficiency": 1.0},
        {"strategy": "ddp", "devices": 2, "status": "completed", "throughput_images_per_s": 180.0, "speedup": 1.8, "efficiency": 0.9},
        {"strategy": "mp", "devices": 2, "status": "completed", "throughput_images_per_s": 110.0, "speedup": 1.1, "efficiency": 0.55},
    ])
    advice = strategy_advice(table)
    assert "DDP on 2 devices: 1.80x, 90% efficient" in advice and "MP on 2 devices: 1.10x" in advice
    assert "Fastest: DDP" in advice and "prefer it over model and pipeline parallel" in advice
    slow = table.assign(throughput_images_per_s=[100.0, 60.0, 50.0], speedup=[1.0, 0.6, 0.5], efficiency=[1, 0.3, 0.25])
    assert "Fastest: SINGLE" in strategy_advice(slow)
