"""Series reads: what charting a long run costs the dashboard, whatever the run's length.

One run on a fresh SQLite database (WAL) holds 200,000 step points (20 epochs; at one point per
0.5 s, 28 hours of training) and 200,000 system samples of 2 ranks and 2 GPUs (at one a second,
56 hours), written with ``db.series.add_steps`` / ``db.system_metrics.add_samples`` in batches of 10,000.
Timed, five repeats each, in turn: ``read_steps`` and ``system_metrics.read_metric`` (the charted metrics,
each series in buckets of min, max and last) downsampled to 1,000 points (what the Run page reads), the
change detector of a live page's tick (``last_step`` and ``last_sample``), the Run page's whole rebuild of its step and system figures (both reads, the
frames, the epoch marks and six Plotly figures, after one untimed build, as in a running server),
and, for scale, ``export``'s read of every step point (``max_points=None``).

    python bench/series_read.py            # full
    python bench/series_read.py --quick    # 5,000 rows, one repeat
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import parallax_home, parse_args  # noqa: E402
from bench.report import Report  # noqa: E402
from bench.stats import at_most  # noqa: E402

METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
ROWS, QUICK_ROWS = 200_000, 5_000
BATCH = 10_000
EPOCHS = 20
MAX_POINTS = 1000  # pages/run.py LIVE_MAX_POINTS


def fill(engine, run_id: int, rows: int) -> float:
    """Write ``rows`` step points and samples to the run; returns the seconds it took."""
    from db import series, system_metrics

    per_epoch = rows // EPOCHS
    started = time.perf_counter()
    for start in range(0, rows, BATCH):
        stop = min(rows, start + BATCH)
        series.add_steps(engine, run_id, [
            {"epoch": 1 + s // per_epoch, "step": s + 1, "t_s": 0.5 * s, "train_loss": 2.0 / (1 + s / 1000),
             "images_per_s": 2400.0 + s % 13, "lr": 0.1} for s in range(start, stop)])
        system_metrics.add_samples(engine, run_id, [
            {"t_s": float(t), "host_cpu_pct": 40.0 + t % 20, "host_memory_mb": 30_000.0,
             "processes": [{"rank": r, "cpu_pct": 99.0, "rss_mb": 3100.0} for r in range(2)],
             "gpus": [{"index": i, "util_pct": 95.0, "memory_used_mb": 20_000.0, "power_w": 410.0,
                       "temperature_c": 66.0, "sm_clock_mhz": 1980.0} for i in range(2)]}
            for t in range(start, stop)])
    return time.perf_counter() - started


def rebuild_figures(engine, run_id: int, epochs) -> int:
    """What pages/run.py's build_series does on a tick with new rows; returns the number of figures."""
    from db import series, system_metrics
    from reports import series_charts

    steps = series_charts.steps_frame(series.read_steps(engine, [run_id], max_points=MAX_POINTS))
    system = series_charts.system_frame(
        system_metrics.read_metric(engine, [run_id], series_charts.SYSTEM_METRICS, max_points=MAX_POINTS))
    marks = series_charts.epoch_marks(epochs, steps)
    figures = [series_charts.step_figure(steps, column, marks) for column in series_charts.STEP_TITLES]
    figures += [series_charts.system_figure(system, metric, marks)
                for metric in series_charts.system_charts_for(system)]
    return len(figures)


def timed(work) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def main() -> None:
    args = parse_args(__doc__)
    rows = QUICK_ROWS if args.quick else ROWS
    report = Report("series_read", "Series reads", method=METHOD)
    report.settings = {"rows": rows, "max_points": MAX_POINTS, "repeats": args.repeats}
    with parallax_home("parallax-bench-series-") as home:
        from db import make_engine, series, store, system_metrics
        from reports.scaling import epochs_frame
        from reports.series_charts import SYSTEM_METRICS

        engine = make_engine(f"sqlite:///{home / 'parallax.db'}")
        run_id = store.create_run(engine, {"dataset": "digits", "model": "resnet18", "strategy": "ddp",
                                           "devices": ["cuda:0", "cuda:1"]})
        for epoch in range(1, EPOCHS + 1):
            store.log_epoch(engine, run_id, {"epoch": epoch, "extra": {"t_end_s": epoch * rows / EPOCHS * 0.5}})
        write_s = fill(engine, run_id, rows)
        print(f"  wrote {rows:,} step points and {rows:,} samples in {write_s:.1f} s", flush=True)
        epochs = epochs_frame(store.read_epoch_metrics(engine, [run_id]))
        rebuild_figures(engine, run_id, epochs)  # plotly builds its validators on first use; a server has them
        contenders = {
            "steps": lambda: series.read_steps(engine, [run_id], max_points=MAX_POINTS),
            "system": lambda: system_metrics.read_metric(engine, [run_id], SYSTEM_METRICS, max_points=MAX_POINTS),
            "detector": lambda: (series.last_step(engine, [run_id]), series.last_sample(engine, [run_id])),
            "figures": lambda: rebuild_figures(engine, run_id, epochs),
            "export_steps": lambda: series.read_steps(engine, [run_id], max_points=None),
        }
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for repeat in range(1, args.repeats + 1):
            for name, work in contenders.items():
                times[name].append(timed(work))
            print(f"  repeat #{repeat}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items()), flush=True)
        assert len(contenders["steps"]()) <= MAX_POINTS + EPOCHS
        per_series: dict[tuple, int] = {}
        for row in contenders["system"]():
            key = (row["node"], row["kind"], row["device"], row["metric"])
            per_series[key] = per_series.get(key, 0) + 1
        assert max(per_series.values()) <= MAX_POINTS, per_series
    report.add(f"read_steps of {rows:,} points, downsampled to {MAX_POINTS:,}", times["steps"], unit=" s",
               target=at_most(1.0))
    report.add(f"read_metric of {rows:,} samples' charted series, downsampled to {MAX_POINTS:,}", times["system"],
               unit=" s",
               target=at_most(1.0))
    report.add("a live tick's change detector (last_step + last_sample)", [t * 1000 for t in times["detector"]],
               unit=" ms", target=at_most(10.0))
    report.add("Run page: both reads and its six step and system figures", times["figures"], unit=" s",
               target=at_most(1.0), headline=False)
    report.add(f"export: every one of {rows:,} step points", times["export_steps"], unit=" s", headline=False)
    report.add("writing the rows (not a read; for scale)", [write_s], unit=" s", headline=False)
    report.finish(args)


if __name__ == "__main__":
    main()
