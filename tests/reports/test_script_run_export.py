"""A script run's export: every logged value in the JSON (``script_metrics``) and in ``metrics.csv``."""

from __future__ import annotations

import csv

from db import script_metrics, store
from reports.run_csv import write_run_csv


def test_a_script_runs_export_holds_every_logged_value_and_its_csv(engine, tmp_path):
    run_id = script_metrics.create_script_run(engine, name="baseline", project="p", config={"lr": 0.1}, key="script:x")
    script_metrics.add_points(engine, run_id, [("train/loss", step, step * 0.5, 1.0 / (step + 1)) for step in range(3000)]
                              + [("val/acc", 2999, 1500.0, float("nan"))])
    exported = store.export_run(engine, run_id)
    assert exported["kind"] == "script"
    assert len(exported["script_metrics"]) == 3001  # not thinned as charts are
    assert exported["script_metrics"][-1] == {"run_id": run_id, "name": "val/acc", "step": 2999, "t_s": 1500.0,
                                              "value": None, "n": 1}  # NaN is stored as a gap
    written = write_run_csv(exported, tmp_path / "out")
    assert (tmp_path / "out" / "metrics.csv") in written
    with open(tmp_path / "out" / "metrics.csv", newline="") as table:
        rows = list(csv.DictReader(table))
    assert len(rows) == 3001 and rows[1] == {"name": "train/loss", "step": "1", "t_s": "0.5", "value": "0.5"}


def test_a_launched_runs_export_has_no_script_metrics(engine):
    config = {"dataset": "digits", "model": "resnet18", "strategy": "single", "devices": ["cpu"]}
    exported = store.export_run(engine, store.create_run(engine, config))
    assert exported["kind"] == "launched" and "script_metrics" not in exported
