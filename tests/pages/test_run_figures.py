"""One run, one throughput: the same run's images/s and training time read from the Runs, Run, Compare and
Sweeps pages, the export and its CSV agree, and each column says what it holds. The run's first epoch is slow
(a profiled epoch, start-up): a mean over every epoch would differ from the mean after the first.

    .venv/bin/python -m pytest tests/pages/test_run_figures.py -q
"""

from __future__ import annotations

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from db import store
from db.run_figures import IMAGES_PER_S_LABEL, TRAINING_TIME_LABEL, run_figures
from reports.run_csv import write_run_csv
from tests.support import ROOT

APP = str(ROOT / "app.py")
TIMEOUT_S = 90  # the first page in a process imports torch and timm
# Epoch 1 profiled and starting up; then steady. After the first: 152.2 images/s; over all three: 134.8.
DDP_IMAGES_PER_S = (100.0, 150.0, 154.4)
STEADY = 152.2
TRAIN_TIME_S = (3.0, 2.0, 2.0)  # training steps only: 7.0 s
EPOCH_TIME_S = (4.0, 2.5, 2.5)  # with validation: 9.0 s


def add_run(engine, sweep_id: int, strategy: str, images_per_s: tuple[float, ...]) -> int:
    devices = ["cpu"] if strategy == "single" else ["cpu", "cpu"]
    run_id = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": strategy,
                                       "devices": devices, "batch_size": 64, "image_size": 32, "amp": "auto",
                                       "epochs": 3}, status="completed", sweep_id=sweep_id)
    for epoch, (ips, train_s, epoch_s) in enumerate(zip(images_per_s, TRAIN_TIME_S, EPOCH_TIME_S), start=1):
        store.log_epoch(engine, run_id, {"epoch": epoch, "train_loss": 1.0, "val_loss": 1.0, "train_acc": 0.5,
                                         "val_acc": 0.3 * epoch, "epoch_time_s": epoch_s, "train_time_s": train_s,
                                         "images_per_s": ips, "peak_memory_mb": {"cpu": 500.0}})
    return run_id


def open_page(page: str, **query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    for key, value in query.items():
        at.query_params[key] = value
    at.switch_page(page).run()
    assert not at.exception, at.exception
    return at


def test_the_runs_figures_agree_on_every_page_and_in_the_export(engine, parallax_home, tmp_path):
    sweep_id = store.create_sweep(engine, {"devices": ["cpu", "cpu"]}, ["single", "ddp"])
    single_id = add_run(engine, sweep_id, "single", (120.0, 170.0, 176.0))
    ddp_id = add_run(engine, sweep_id, "ddp", DDP_IMAGES_PER_S)

    runs = open_page("pages/runs.py").dataframe[0].value.set_index("run")
    assert runs.loc[ddp_id, IMAGES_PER_S_LABEL] == pytest.approx(STEADY)
    assert runs.loc[ddp_id, TRAINING_TIME_LABEL] == pytest.approx(7.0)  # not 9.0: validation is left out

    metrics = {m.label: m.value for m in open_page("pages/run.py", run=str(ddp_id)).metric}
    # The headline says which epochs it is the mean of: the first is left out, and the page says so.
    assert metrics["Throughput (images/s, epochs 2–3; epoch 1 left out: start-up)"] == "152"
    assert metrics["Training time"] == "7.0 s"

    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.session_state["compare_ids"] = [single_id, ddp_id]
    at.switch_page("pages/compare.py").run()
    assert not at.exception, at.exception
    compared = at.dataframe[0].value.set_index("run")
    assert compared[IMAGES_PER_S_LABEL].tolist() == [173.0, 152.0]
    assert compared["speedup (×)"].tolist() == [1.0, pytest.approx(0.88)]  # 152.2 / 173: the sweep's figure

    sweep = open_page("pages/sweep.py", sweep=str(sweep_id)).table[0].value
    assert sweep[IMAGES_PER_S_LABEL].tolist() == ["173", "152"] and sweep["speedup (×)"].tolist() == ["1.00×", "0.88×"]

    exported = store.export_run(engine, ddp_id)
    assert exported["figures"] == run_figures(exported["epochs"]).to_dict()
    assert exported["figures"]["images_per_s"] == pytest.approx(STEADY)
    assert exported["figures"]["images_per_s_epochs"] == [2, 3]
    assert exported["figures"]["training_time_s"] == pytest.approx(7.0)
    assert exported["figures"]["epochs_time_s"] == pytest.approx(9.0)
    write_run_csv(exported, tmp_path)
    [row] = pd.read_csv(tmp_path / "figures.csv").to_dict("records")
    assert row["run_id"] == ddp_id and row["images_per_s"] == pytest.approx(STEADY)
    assert row["training_time_s"] == pytest.approx(7.0) and row["images_per_s_epochs"] == "2 3"


def test_a_training_time_with_an_epoch_that_did_not_measure_it_is_unknown_not_partial():
    figures = run_figures([{"epoch": 1, "images_per_s": 10.0, "train_time_s": 2.0, "epoch_time_s": 3.0},
                           {"epoch": 2, "images_per_s": 20.0, "train_time_s": None, "epoch_time_s": 3.0}])
    assert figures.training_time_s is None and figures.epochs_time_s == 6.0
    assert figures.images_per_s == 20.0 and figures.images_per_s_epochs == (2,)
    assert run_figures([]).images_per_s is None and run_figures([]).best_val_acc is None
    one = run_figures([{"epoch": 1, "images_per_s": 10.0, "val_acc": float("nan")}])
    assert one.images_per_s == 10.0 and one.best_val_acc is None
