"""The names a script run logged (db/script_metrics.py's ``run_metric_names``), on SQLite and PostgreSQL: every
name once, sorted as the index keeps them, without reading every point; and the points of the few names a page
draws.

    .venv/bin/python -m pytest tests/db/test_script_metrics_names.py -q
"""

from __future__ import annotations

import pytest

from db import script_metrics


@pytest.fixture
def db_url(backend_db_url):
    return backend_db_url


def test_a_runs_names_are_each_listed_once_in_order_and_only_its_own(engine):
    run_id = script_metrics.create_script_run(engine, name="wide", project="p", config={}, key="script:a")
    other = script_metrics.create_script_run(engine, name="other", project="p", config={}, key="script:b")
    names = [f"layer{i:02d}/unit{j}" for i in range(30) for j in range(4)] + ["loss", "Lr"]
    script_metrics.add_points(engine, run_id, [(name, step, step * 0.1, float(step)) for step in range(5)
                                               for name in names])
    script_metrics.add_points(engine, other, [("zz/other", 0, 0.0, 1.0), ("layer00/unit0", 0, 0.0, 1.0)])
    listed = script_metrics.run_metric_names(engine, run_id)
    # In the database's own order (its collation), as SELECT DISTINCT ... ORDER BY name gives them.
    assert listed == script_metrics.metric_names(engine, [run_id])[run_id] and sorted(listed) == sorted(names)
    assert script_metrics.run_metric_names(engine, other) == ["layer00/unit0", "zz/other"]
    assert script_metrics.run_metric_names(engine, 999) == []
    drawn = script_metrics.read_points(engine, [run_id], names=["loss", "layer29/unit3", "not logged"], max_points=2)
    assert {(row["name"], row["n"]) for row in drawn} == {("layer29/unit3", 3), ("layer29/unit3", 2), ("loss", 3),
                                                          ("loss", 2)}
