"""A script's logged values, packed by block of steps (``db.point_chunks``), read back whole for an export
and as buckets of minimum, maximum and last value for a chart, on SQLite and PostgreSQL."""

from __future__ import annotations

import math

import pytest
from sqlalchemy.exc import IntegrityError

from db import make_engine, point_chunks, script_metrics
from db.point_chunks import BLOCK_STEPS


def script_run(engine) -> int:
    return script_metrics.create_script_run(engine, name="s", project="p", config={}, key="script:k")


def spiky(steps: int, spike_at: int) -> list[float]:
    """Values near 1 with one step of 100 and one NaN."""
    values = [1.0 + 0.01 * (step % 7) for step in range(steps)]
    values[spike_at] = 100.0
    values[spike_at + 3] = math.nan
    return values


@pytest.mark.parametrize("steps, spike_at", [(5_000, 2_345), (300_000, 123_457)])
def test_buckets_keep_a_one_step_spike_and_a_nan_whatever_the_series_length(backend_db_url, steps, spike_at):
    """A short series is reduced from its unpacked values, a long one from the chunks' summaries alone:
    either way every bucket has its minimum, maximum and last value, and the spike and the NaN stay."""
    engine = make_engine(backend_db_url)
    run_id = script_run(engine)
    values = spiky(steps, spike_at)
    for start in range(0, steps, 50_000):  # written in batches, as the writer does
        part = range(start, min(steps, start + 50_000))
        script_metrics.add_columns(engine, run_id, {"loss": (list(part), [s * 0.01 for s in part],
                                                             [values[s] for s in part])})
    buckets = script_metrics.read_points(engine, [run_id], max_points=500)
    assert 250 <= len(buckets) <= 500
    assert sum(b["n"] for b in buckets) == steps
    spike = max(buckets, key=lambda b: b["max"])
    assert spike["max"] == 100.0 and spike["step"] - spike["n"] < spike_at <= spike["step"]
    assert [b["nonfinite"] for b in buckets].count(1) == 1 and sum(b["nonfinite"] for b in buckets) == 1
    assert min(b["min"] for b in buckets) == 1.0
    assert buckets[-1]["step"] == steps - 1 and buckets[-1]["value"] == values[-1]  # the last value, not a mean
    for bucket in buckets:  # each bucket's last value is the series' value at its last step
        assert bucket["value"] is None or bucket["value"] == values[bucket["step"]]
        assert bucket["t_s"] == pytest.approx(bucket["step"] * 0.01)


def test_a_window_of_few_values_comes_back_whole_and_a_wider_one_bucketed(backend_db_url):
    """What a chart's zoom asks: a window of no more than max_points values is every value in it."""
    engine = make_engine(backend_db_url)
    run_id = script_run(engine)
    values = spiky(200_000, 150_000)
    script_metrics.add_columns(engine, run_id, {"loss": (range(200_000), [0.0] * 200_000, values)})
    window = script_metrics.read_points(engine, [run_id], max_points=1000, first_step=149_900, last_step=150_199)
    assert [p["step"] for p in window] == list(range(149_900, 150_200))
    assert all(p["n"] == 1 and p["min"] == p["max"] == p["value"] for p in window if p["nonfinite"] == 0)
    assert [p["value"] for p in window if p["step"] in (150_000, 150_003)] == [100.0, None]
    wider = script_metrics.read_points(engine, [run_id], max_points=1000, first_step=100_000, last_step=199_999)
    assert 500 < len(wider) <= 1000 and sum(p["n"] for p in wider) == 100_000
    assert max(p["max"] for p in wider) == 100.0


def test_values_logged_out_of_order_or_twice_at_a_step_are_kept_in_step_order(engine):
    run_id = script_run(engine)
    script_metrics.add_points(engine, run_id, [("a", 5, 0.5, 5.0), ("a", 2, 0.2, 2.0), ("a", 5, 0.6, 5.5)])
    script_metrics.add_points(engine, run_id, [("a", 3, 0.3, float("inf")), ("b", 300, 30.0, 1.0)])
    every = script_metrics.read_points(engine, [run_id], max_points=None)
    assert [(p["name"], p["step"], p["value"]) for p in every] == [
        ("a", 2, 2.0), ("a", 3, None), ("a", 5, 5.0), ("a", 5, 5.5), ("b", 300, 1.0)]
    assert script_metrics.last_logged_step(engine, run_id) == 300 and script_metrics.points_logged(engine, run_id) == 5


def test_a_chunk_holds_one_block_and_consecutive_steps_are_not_stored():
    rows = point_chunks.pack(range(100, 400), [0.0] * 300, [float(s) for s in range(100, 400)])
    assert [(r["block"], r["first_step"], r["last_step"], r["points"]) for r in rows] == [
        (0, 100, 127, 28), (1, 128, 255, 128), (2, 256, 383, 128), (3, 384, 399, 16)]
    assert all(r["steps"] is None and len(r["values"]) == 8 * r["points"] for r in rows)
    sparse = point_chunks.pack([0, 10, 20], [0.0, 1.0, 2.0], [1.0, None, 3.0])
    assert len(sparse) == 1 and sparse[0]["steps"] is not None and sparse[0]["finite"] == 2
    steps, _, values = point_chunks.unpack(sparse[0])
    assert steps.tolist() == [0, 10, 20] and math.isnan(values[1])
    assert BLOCK_STEPS == 128


def test_names_are_cut_to_the_columns_width_and_unknown_runs_refused(engine):
    run_id = script_run(engine)
    assert script_metrics.add_points(engine, run_id, [("x" * 300, 1, 0.0, 1.0)]) == 1
    assert script_metrics.metric_names(engine, [run_id]) == {run_id: ["x" * 255]}
    with pytest.raises(IntegrityError):  # the run's row is what a series hangs from
        script_metrics.add_points(engine, run_id + 99, [("a", 1, 0.0, 1.0)])
    with pytest.raises(ValueError, match="max_points must be a whole number of 2 or more"):
        script_metrics.read_points(engine, [run_id], max_points=1)
