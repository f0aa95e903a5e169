"""System samples stored per metric (``db.system_metrics``): a sample comes back whole, written in batches as
the sampler writes them; a chart's read of one metric is a bounded number of buckets whatever the run's
length, each keeping its extremes; a mean over the run comes from the blocks' summaries; a bad sample is
refused naming its field; deleting the run deletes its series. Real SQLite, and PostgreSQL where marked.

    .venv/bin/python -m pytest tests/db/test_system_metrics.py -q
"""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

import db
from db import store, system_metrics
from db.tables import SystemChunk, SystemSeries

CONFIG = {"dataset": "digits", "model": "test_resnet", "strategy": "ddp", "devices": ["cpu", "cpu"], "batch_size": 64,
          "image_size": 16, "amp": "auto", "epochs": 1, "tags": []}


def sample(t_s: float, *, node: int = 0, ranks: int = 2, gpus: int = 2, util: float | None = None) -> dict:
    """A sample whose figures hold its time, so that a value read back shows which moment it is of."""
    return {"t_s": t_s, "node": node, "host_cpu_pct": 40.0 + t_s % 10, "host_memory_mb": 9000.0 + t_s,
            "processes": [{"rank": rank, "cpu_pct": 90.0 + rank, "rss_mb": 800.0 + t_s} for rank in range(ranks)],
            "gpus": [{"index": index, "util_pct": 50.0 + index if util is None else util,
                      "memory_used_mb": 1000.0 + t_s, "power_w": 200.0 + index, "temperature_c": 60.0,
                      "sm_clock_mhz": None} for index in range(gpus)]}


def test_a_sample_written_in_batches_comes_back_whole(backend_db_url):
    engine = db.make_engine(backend_db_url)
    run_id = store.create_run(engine, CONFIG)
    samples = [sample(t * 0.7) for t in range(200)]  # 140 s: three blocks, their chunks grown batch by batch
    samples[5]["processes"][1]["rss_mb"] = None  # a figure not measured
    samples += [{"t_s": 3.3, "node": 1, "host_cpu_pct": None, "host_memory_mb": None,  # a rank with no host figures
                 "processes": [{"rank": 2, "cpu_pct": 70.0, "rss_mb": 700.0}], "gpus": []}]
    for start in range(0, len(samples), 7):  # the sampler's batches of a few seconds
        assert system_metrics.add_samples(engine, run_id, samples[start:start + 7]) > 0
    back = system_metrics.read_samples(engine, [run_id])
    assert back == sorted(({"run_id": run_id, **s} for s in samples), key=lambda s: (s["t_s"], s["node"]))
    with engine.connect() as connection:  # one chunk per series and block, however many batches filled it
        chunks = connection.scalar(select(func.count()).select_from(SystemChunk))
        series = connection.scalar(select(func.count()).select_from(SystemSeries))
    assert series == 2 + 2 * 2 + 2 * 5 + 2 and chunks == (series - 2) * 3 + 2
    assert system_metrics.samples_stored(engine, [run_id]) == {run_id: 200 * 16 + 2}
    db.dispose_engines()


@pytest.mark.parametrize("seconds", [1_000, 36_000])
def test_a_chart_read_is_bounded_whatever_the_runs_length_and_keeps_a_one_second_spike(engine, seconds):
    run_id = store.create_run(engine, CONFIG)
    samples = [sample(float(t), ranks=1, gpus=2) for t in range(seconds)]
    samples[seconds // 3]["gpus"][1]["util_pct"] = 100.0  # one second of GPU 1
    for start in range(0, seconds, 3600):
        system_metrics.add_samples(engine, run_id, samples[start:start + 3600])
    rows = system_metrics.read_metric(engine, [run_id], [("gpu", "util_pct")], max_points=200)
    assert {row["metric"] for row in rows} == {"util_pct"}  # no other metric is read
    for device in (0, 1):
        of_gpu = [row for row in rows if row["device"] == device]
        assert len(of_gpu) <= 200 and sum(row["n"] for row in of_gpu) == seconds
        assert [row["bucket"] for row in of_gpu] == sorted(row["bucket"] for row in of_gpu)
    spiked = [row for row in rows if row["device"] == 1]
    assert max(row["max"] for row in spiked) == 100.0  # the band's top
    assert max(row["value"] for row in spiked) == 51.0  # the line: each bucket's last reading, never a mean
    assert min(row["min"] for row in spiked) == 51.0
    whole = system_metrics.read_metric(engine, [run_id], [("gpu", "util_pct")], max_points=None)
    assert len(whole) == 2 * seconds


def test_a_mean_over_the_run_comes_from_the_summaries(engine):
    run_id = store.create_run(engine, CONFIG)
    system_metrics.add_samples(engine, run_id, [sample(float(t), util=10.0 * (t % 3)) for t in range(300)])
    totals = system_metrics.metric_totals(engine, [run_id], [("gpu", "util_pct")])
    assert [(row["device"], row["points"], row["finite"]) for row in totals] == [(0, 300, 300), (1, 300, 300)]
    assert all(row["total"] == pytest.approx(100 * (0 + 10 + 20)) for row in totals)


def test_a_misspelt_field_is_refused_naming_it_and_nothing_is_written(engine):
    run_id = store.create_run(engine, CONFIG)
    with pytest.raises(ValueError, match=r"unknown gpu fields \['util'\]; allowed: index, util_pct"):
        system_metrics.add_samples(engine, run_id, [sample(1.0), {**sample(2.0), "gpus": [{"index": 0, "util": 5}]}])
    with pytest.raises(LookupError, match="no run with id 999"):
        system_metrics.add_samples(engine, 999, [sample(1.0)])
    assert system_metrics.read_samples(engine, [run_id]) == []
    with pytest.raises(ValueError, match="max_points must be a whole number of 2 or more"):
        system_metrics.read_metric(engine, [run_id], [("gpu", "util_pct")], max_points=1)


def test_deleting_a_run_deletes_its_series_and_chunks(engine):
    kept, deleted = store.create_run(engine, CONFIG), store.create_run(engine, CONFIG)
    for run_id in (kept, deleted):
        system_metrics.add_samples(engine, run_id, [sample(float(t)) for t in range(90)])
    store.delete_runs(engine, [deleted])
    with engine.connect() as connection:
        left = set(connection.scalars(select(SystemSeries.run_id).distinct()))
        orphans = connection.scalar(select(func.count()).select_from(SystemChunk).where(
            SystemChunk.series_id.not_in(select(SystemSeries.id))))
    assert left == {kept} and orphans == 0
    assert len(system_metrics.read_samples(engine, [kept])) == 90
