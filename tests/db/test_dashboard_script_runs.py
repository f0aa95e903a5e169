"""A script's run is a run like any other in the tables: what it summarised (``run.summary``) and logged fills the
same figures launched runs show (best accuracy, images/s) in the Runs table, ``parallax list`` and the export,
common names mapped (val/acc, val_acc, accuracy/val); its other summary keys come along for columns of their own.

    .venv/bin/python -m pytest tests/db/test_dashboard_script_runs.py -q
"""

from __future__ import annotations

import json

import pytest

from db import script_metrics, store
from db.dashboard import run_table
from db.run_figures import script_run_figures, shared_name
from trainer_backend.control.cli import main


def script_run(engine, *, summary: dict | None, points: list[tuple[str, int, float]]) -> int:
    run_id = script_metrics.create_script_run(engine, name="baseline", project="resnet", config={"lr": 0.1},
                                              key=f"script:id:{len(points)}-{sorted(summary or {})}")
    script_metrics.add_points(engine, run_id, [(name, step, step * 0.1, value) for name, step, value in points])
    if summary is not None:
        store.set_measurements(engine, run_id, {"summary": summary})
    return run_id


@pytest.mark.parametrize("name, shared", [("val/acc", "val_acc"), ("val_acc", "val_acc"), ("accuracy/val", "val_acc"),
                                          ("Val Accuracy", "val_acc"), ("train/loss", "train_loss"),
                                          ("images/s", None), ("samples_per_sec", "images_per_s"), ("lr", None)])
def test_common_names_map_onto_the_shared_series(name, shared):
    assert shared_name(name) == shared


def test_a_best_accuracy_the_script_set_wins_over_what_it_logged():
    figures = script_run_figures({"best_acc": 0.93, "val/acc": 0.9}, {"val_acc": {"max": 0.95, "mean": 0.5}})
    assert figures.best_val_acc == 0.93
    assert script_run_figures({"val/acc": 0.9}, {"val_acc": {"max": 0.95, "mean": 0.5}}).best_val_acc == 0.95
    assert script_run_figures({"val/acc": 0.9}, {}).best_val_acc == 0.9
    assert script_run_figures({"note": "text", "flag": True}, {}).best_val_acc is None


def test_the_runs_table_and_list_show_a_script_runs_summary_and_logged_figures(engine, db_url, capsys):
    logged = script_run(engine, summary=None, points=[("val/acc", 10, 0.5), ("val/acc", 20, 0.8),
                                                       ("val/acc", 30, 0.7), ("throughput", 10, 200.0),
                                                       ("throughput", 20, 300.0)])
    summarised = script_run(engine, summary={"best_val_acc": 0.91, "final_loss": 0.12, "optimizer": "sgd"},
                            points=[("train/loss", 1, 2.0)])
    rows = {row["id"]: row for row in run_table(engine)}
    assert rows[logged]["best_val_acc"] == pytest.approx(0.8)  # the best it logged, not the last
    assert rows[logged]["mean_images_per_s"] == pytest.approx(250.0)
    assert rows[summarised]["best_val_acc"] == pytest.approx(0.91)
    assert rows[summarised]["summary"] == {"best_val_acc": 0.91, "final_loss": 0.12, "optimizer": "sgd"}

    assert main(["--db", db_url, "list"]) == 0
    lines = {int(line.split()[0].split("=")[1]): line for line in capsys.readouterr().out.splitlines()}
    assert "best_val_acc=0.8000 images_per_s=250.0" in lines[logged]
    assert "best_val_acc=0.9100 images_per_s=-" in lines[summarised]
    assert main(["--db", db_url, "export", str(summarised)]) == 0
    assert json.loads(capsys.readouterr().out)["figures"]["best_val_acc"] == pytest.approx(0.91)
