"""Where time and memory go, on the pages, through Streamlit's AppTest: MFU beside images/s, the
per-rank times with a straggler named (Run), the memory breakdown stacked per strategy (Compare,
Sweep), and the Sweep page's forecast. Runs are written with ``db.store`` as Parallax writes them;
older runs without these figures get one line saying why.

    .venv/bin/python -m pytest tests/ui/test_efficiency_views.py -q
"""

from __future__ import annotations

import base64
import json

import numpy as np
from streamlit.testing.v1 import AppTest

from tests.support import ROOT
from tests.nvml_machines import cpu_machine, fake_nvml  # noqa: F401
from db import store
from reports.efficiency import MFU_PEAK_NOTE
from tests.pages.test_every_page import run_notes

APP = str(ROOT / "app.py")
TIMEOUT_S = 90  # the first page in a process imports torch and timm


def open_page(page: str, query: dict | None = None, **session) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    for key, value in session.items():
        at.session_state[key] = value
    for key, value in (query or {}).items():
        at.query_params[key] = value
    return at.switch_page(page).run()


def add_run(engine, strategy: str, devices: int, images_per_s: float, *, sweep_id=None, figures: bool = True,
            slow_rank: int | None = None, parameters_mb: float = 42.7) -> int:
    config = {"dataset": "digits", "model": "resnet18", "strategy": strategy, "devices": ["cpu"] * devices,
              "batch_size": 64, "image_size": 32, "amp": "auto", "epochs": 3}
    run_id = store.create_run(engine, config, status="completed", sweep_id=sweep_id)
    if figures:
        store.set_measurements(engine, run_id, {"flops_per_image": 2.17e8, "peak_tflops": 0.2,
                                                "peak_source": "measured on this CPU"})
    for epoch in (1, 2, 3):
        extra = {}
        if figures:
            extra = {
                "mfu": 0.125, "achieved_tflops": 0.025,
                "ranks": [{"rank": r, "train_time_s": 6.0 if r == slow_rank else 5.0, "data_time_s": 0.5,
                           "compute_time_s": 4.0, "comm_wait_s": 0.5} for r in range(devices)],
                "memory_breakdown": {f"rank{r}:cpu": {"parameters_mb": parameters_mb, "gradients_mb": parameters_mb,
                                                      "optimizer_mb": 2 * parameters_mb, "activations_other_mb": 90.0}
                                     for r in range(devices)},
            }
        store.log_epoch(engine, run_id, {"epoch": epoch, "train_loss": 1.0, "val_loss": 1.0, "train_acc": 0.5,
                                         "val_acc": 0.5, "epoch_time_s": 6.0, "train_time_s": 5.0,
                                         "images_per_s": images_per_s,
                                         "peak_memory_mb": {f"rank{r}:cpu": 400.0 for r in range(devices)},
                                         "extra": extra})
    return run_id


def values(array) -> list[float]:
    """A Plotly array as numbers: Plotly sends numeric arrays as base64 with their dtype."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"]).tolist()
    return list(array)


def chart_titles(at: AppTest) -> list[str]:
    return [json.loads(chart.proto.spec)["layout"]["title"]["text"] for chart in at.get("plotly_chart")]


def test_run_page_shows_mfu_ranks_with_the_straggler_and_the_memory_breakdown(engine, parallax_home, cpu_machine):  # noqa: F811
    run_id = add_run(engine, "ddp", 3, 160.0, slow_rank=2)
    at = open_page("pages/run.py", {"run": str(run_id)})
    assert not at.exception, at.exception
    metrics = {m.label: m.value for m in at.metric}
    # The denominator beside the figure: runs at the same TFLOP/s differ in MFU where their peaks differ.
    assert metrics["Throughput (images/s, epochs 2–3; epoch 1 left out: start-up)"] == "160" and metrics["MFU (of 0.2 TFLOP/s peak)"] == "12.5%"
    straggler = [w.value for w in at.warning if "Straggler" in w.value]
    assert len(straggler) == 1 and straggler[0].startswith("Straggler: rank 2 —")
    ranks = at.dataframe[0].value
    assert len(ranks) == 9 and list(ranks.columns)[:3] == ["epoch", "rank", "training (s)"]
    titles = chart_titles(at)
    assert "Time per rank and epoch" in titles and "Memory per device, by what holds it" in titles


def test_run_page_of_an_older_run_says_why_the_figures_are_missing(engine, parallax_home, cpu_machine):  # noqa: F811
    run_id = add_run(engine, "ddp", 2, 160.0, figures=False)
    at = open_page("pages/run.py", {"run": str(run_id)})
    assert not at.exception, at.exception
    assert "MFU" not in {m.label for m in at.metric}
    captions = [c.value for c in at.caption]
    assert any(line.startswith("MFU: not recorded — this run's FLOPs per image were not counted")
               for line in run_notes(at))  # with the run's notes, below the numbers
    assert any(c.startswith("Per-rank times: not recorded") for c in captions)
    assert any(c.startswith("Memory breakdown: not recorded") for c in captions)
    assert not [w for w in at.warning if "Straggler" in w.value]
    assert len(at.get("plotly_chart")) == 5  # the usual charts, nothing drawn empty


def test_compare_shows_mfu_and_the_memory_breakdown_per_strategy(engine, parallax_home, cpu_machine):  # noqa: F811
    single = add_run(engine, "single", 1, 100.0)
    ddp = add_run(engine, "ddp", 2, 160.0)
    fsdp = add_run(engine, "fsdp", 2, 120.0, parameters_mb=21.35)
    old = add_run(engine, "ddp", 2, 150.0, figures=False)
    at = open_page("pages/compare.py", compare_ids=[single, ddp, fsdp, old])
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    assert table["MFU"].tolist() == ["12.5% (0.025 of 0.2 TFLOP/s)"] * 3 + ["—"]
    assert "Memory per device, by what holds it" in chart_titles(at)
    chart = next(c for c in at.get("plotly_chart") if "by what holds it" in c.proto.spec)
    bars = {trace["name"]: values(trace["y"]) for trace in json.loads(chart.proto.spec)["data"]}
    # One bar per run and device: single 1, ddp 2, fsdp 2; FSDP holds half the parameters on each.
    assert bars["parameters"] == [42.7, 42.7, 42.7, 21.35, 21.35]
    captions = [c.value for c in at.caption]
    assert any(c.startswith("MFU: '—' where a run recorded none") for c in captions)
    assert MFU_PEAK_NOTE in captions
    assert any(c.startswith(f"Memory breakdown: not recorded for #{old} ddp×2 resnet18") for c in captions)


def test_sweep_page_shows_mfu_the_breakdown_and_the_forecast(engine, parallax_home, cpu_machine):  # noqa: F811
    sweep_id = store.create_sweep(engine, {"devices": ["cpu", "cpu"]}, ["single", "ddp"])
    add_run(engine, "single", 1, 100.0, sweep_id=sweep_id)
    add_run(engine, "ddp", 2, 160.0, sweep_id=sweep_id)
    at = open_page("pages/sweep.py", {"sweep": str(sweep_id)})
    assert not at.exception, at.exception
    report = at.table[0].value
    assert report["MFU"].tolist() == ["12.5%", "12.5%"] and report["of peak TFLOP/s"].tolist() == ["0.2", "0.2"]
    assert MFU_PEAK_NOTE in [c.value for c in at.caption]
    assert "Scaling forecast" in [s.value for s in at.subheader]
    forecast = at.table[1].value.reset_index()
    assert forecast["devices"].tolist() == [4, 8] and set(forecast["strategy"]) == {"ddp"}
    assert all(v != "-" for v in forecast["MB/device predicted"])
    assert any("2(n−1)/n" in c.value for c in at.caption)
    assert "Memory per device, by what holds it" in chart_titles(at)


def test_launch_sweep_form_takes_device_counts_and_refuses_bad_ones(parallax_home, cpu_machine, monkeypatch):  # noqa: F811
    monkeypatch.setenv("PARALLAX_MAX_CPU_PROCESSES", "4")
    at = open_page("pages/launch.py")
    at.radio(key="launch_mode").set_value("Compare strategies").run()
    at.multiselect(key="sweep_strategies").set_value(["single", "ddp", "pp"])
    at.number_input(key="batch_size").set_value(64)
    at.text_input(key="sweep_device_counts").set_value("1,2,4").run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    launch = next(b for b in at.button if b.label.startswith("Launch the sweep"))
    assert launch.label == "Launch the sweep (6 runs)"  # single; ddp at 1, 2, 4; pp at 2, 4

    at.text_input(key="sweep_device_counts").set_value("1,2,8").run()
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and errors[0].startswith("With ddp: --device-counts 8 is not allowed: this machine runs "
                                                     "at most 4 CPU processes per run"), errors
    assert next(b for b in at.button if b.label.startswith("Launch the sweep")).disabled
