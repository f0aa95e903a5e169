"""The Launch page's memory estimate through Streamlit's AppTest on a CPU machine (NVML faked
as absent): the verdict against the host's available memory, and in "Compare strategies" mode
one row per strategy. The GPU verdict is tested in a real browser (tests/e2e/test_browser_memory_estimate.py).

    .venv/bin/python -m pytest tests/ui/test_memory_views.py -q
"""

from __future__ import annotations

import re

import pandas as pd
import pytest

from tests.nvml_machines import fake_nvml  # noqa: F401
from tests.pages.test_every_page import open_page, texts


@pytest.fixture(autouse=True)
def cpu_machine(fake_nvml, monkeypatch):  # noqa: F811
    from tests.nvml_machines import pin_cuda_count

    fake_nvml(None)
    pin_cuda_count(monkeypatch, 0)


@pytest.mark.processes  # the estimate comes from the backend's inspector, a child process
def test_the_default_run_fits_in_the_hosts_memory_and_says_by_how_much(parallax_home):
    at = open_page("pages/launch.py")
    assert not at.exception, at.exception
    verdicts = [m for m in texts(at.markdown) if "to spare" in m or "needs about" in m]
    assert len(verdicts) == 1 and re.search(r"cpu: fits, [\d.]+ GB to spare", verdicts[0]), verdicts
    (table,) = [d.value for d in at.dataframe if "total GB" in d.value.columns]
    assert table["device"].tolist() == ["cpu"] and table["total GB"].iloc[0] > 0
    assert any(text.startswith("On CPU the run measures") for text in texts(at.caption))


@pytest.mark.processes  # the estimate comes from the backend's inspector, a child process
def test_compare_strategies_shows_every_strategys_estimate(parallax_home):
    at = open_page("pages/launch.py")
    at.radio(key="launch_mode").set_value("Compare strategies").run()
    assert not at.exception, at.exception
    (table,) = [d.value for d in at.dataframe if "fullest device GB" in d.value.columns]
    assert table["strategy"].tolist() == ["single", "ddp", "mp", "pp"]
    assert all(v.startswith("cpu: fits, ") for v in table["verdict"])
    single, ddp = table.set_index("strategy").loc[["single", "ddp"], "activations GB"]
    assert ddp < single  # each ddp process takes half the batch


# --- estimated against measured: Run, Compare and the sweep report ---------------------------

def add_run(engine, strategy: str, *, sweep_id: int | None = None, gpu: bool = False) -> int:
    """A finished run as the trainer records it: its estimate (measurements) and one epoch with the
    peak and the breakdown it measured."""
    from db import store

    labels = ["cuda:0", "cuda:1"] if gpu else ["rank0:cpu", "rank1:cpu"]
    run_id = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": strategy,
                                       "devices": ["cpu", "cpu"], "batch_size": 64, "image_size": 32,
                                       "epochs": 1}, status="completed", sweep_id=sweep_id)
    estimate = {label: {"parameters_mb": 10.0, "gradients_mb": 10.0, "optimizer_mb": 20.0, "activations_mb": 50.0,
                        "comm_mb": 10.0, "total_mb": 100.0} for label in labels}
    store.set_measurements(engine, run_id, {"memory_estimate": {"strategy": strategy, "devices": estimate}})
    breakdown = {label: {"parameters_mb": 10.0, "gradients_mb": 10.0, "optimizer_mb": 20.0 * 1.25,
                         "activations_other_mb": None} for label in labels}
    store.log_epoch(engine, run_id, {"epoch": 1, "train_loss": 1.0, "val_loss": 1.0, "train_acc": 0.5,
                                     "val_acc": 0.5, "epoch_time_s": 2.0, "train_time_s": 1.8, "images_per_s": 100.0,
                                     "peak_memory_mb": {label: 80.0 for label in labels},
                                     "extra": {"memory_breakdown": breakdown}})
    return run_id


def test_run_and_compare_show_the_estimate_against_what_was_measured(engine, parallax_home):
    cpu_id, gpu_id = add_run(engine, "ddp"), add_run(engine, "ddp", gpu=True)
    at = open_page("pages/run.py", run_id=cpu_id)
    assert not at.exception, at.exception
    (table,) = [d.value for d in at.dataframe if "estimated (MB)" in d.value.columns]
    assert table["device"].tolist() == ["rank0:cpu", "rank1:cpu"]
    assert set(table["compared"]) == {"parameters + gradients + optimizer"}
    assert table["estimated (MB)"].tolist() == [40.0, 40.0] and table["measured (MB)"].tolist() == [45.0, 45.0]
    assert table["error"].tolist() == ["-11.1%", "-11.1%"]

    at = open_page("pages/compare.py", compare_ids=[cpu_id, gpu_id])
    assert not at.exception, at.exception
    (table,) = [d.value for d in at.dataframe if "estimated (MB)" in d.value.columns]
    gpu_rows = table[table["device"].str.startswith("cuda")]
    assert set(gpu_rows["compared"]) == {"peak allocated"} and gpu_rows["error"].tolist() == ["+25.0%", "+25.0%"]


def test_the_sweep_report_has_each_strategys_estimate_error(engine, parallax_home):
    from db import store
    from reports.sweep_report import format_table, sweep_table

    sweep_id = store.create_sweep(engine, {"devices": ["cpu", "cpu"]}, ["ddp", "fsdp"])
    add_run(engine, "ddp", sweep_id=sweep_id)
    fsdp_id = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": "fsdp",
                                        "devices": ["cpu", "cpu"], "batch_size": 64}, status="completed",
                               sweep_id=sweep_id)  # recorded before estimates were stored
    table = sweep_table(engine, sweep_id)
    assert table["memory_estimate_error"].iloc[0] == pytest.approx(40 / 45 - 1)
    assert pd.isna(table.set_index("run_id").loc[fsdp_id, "memory_estimate_error"])
    text = format_table(table)
    assert "memory estimate error" in text and "-11.1%" in text
