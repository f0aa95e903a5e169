"""History at scale: the Runs page with 100, 10,000 and 100,000 runs, a script run of a million steps, SDK
ingest, and what the database holds per run and per value.

The history is written through Parallax's own write paths (``bench/history_build.py``): each run as a rank
records it (``store.create_run``, the ``Recorder``'s three epochs and step points, ten system samples,
``run_state.finish``; one in thirteen failed), one run in ten a script's through the SDK (``parallax.init``,
fifty ``log`` calls, ``finish``); the database grows from one size to the next and each size is measured
as it stands. At each size: ``db.dashboard.run_page`` alone (the first screen, sorted by best accuracy, a
filter line, a search), and the Runs page as ``make run`` serves it, in chromium, from navigation until the
table and its count have drawn (the first screen, the filter line and the search given in the address).
Then a script in a process of its own logs 1,000,000 steps of 4 values in a tight loop (one step a spike
of 100 among values near 1): every value stored, the values per second until ``finish`` returned, how long
``log`` waited (back-pressure), the bytes per value; its Run page in chromium cold (a fresh server) and
warm until its charts have drawn, and the spike's value on its chart; Compare of 20 such runs (2 with
``--quick``); 8 ranks' and a simulated 64 ranks' system samples over 24 hours (10 minutes with ``--quick``),
written through the sampler's ``db.system_metrics.add_samples`` an hour at a time, read for the Run page's
system charts (one GPU's one-second spike found on them). Where ``PARALLAX_BENCH_PG_URL``
names an empty PostgreSQL database, the ingest and the run table at 100 and 1,000 runs are measured there too.

    python bench/history.py                       # full: 100, 10,000, 100,000 runs; 1,000,000 steps
    python bench/history.py --quick               # 50 and 150 runs; 10,000 steps; one repeat
    python bench/history.py --sizes 100,10000 --compare-runs 5   # smaller: the run table and Compare
    python bench/history.py --home /tmp/kept --sizes 10000,100000     # grow a history kept from an earlier run
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.browser import CHROMIUM, CHROMIUM_ARGS, browser_missing, running_dashboard  # noqa: E402
from bench.common import child_env, parallax_home, parse_args  # noqa: E402
from bench.report import Report  # noqa: E402
from bench.stats import at_least, at_most  # noqa: E402

METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
SIZES, QUICK_SIZES = (100, 10_000, 100_000), (50, 150)
STEPS, QUICK_STEPS, NAMES, SPIKE_AT = 1_000_000, 10_000, 4, 654_321
COMPARE_RUNS, QUICK_COMPARE_RUNS = 20, 2
PG_SIZES, QUICK_PG_SIZES = (100, 1_000), (50,)  # PostgreSQL: the run table at these sizes, and the ingest
SYSTEM_RANKS, SYSTEM_S, QUICK_SYSTEM_S = (8, 64), 24 * 3600, 600  # 64: a simulated wide job's ranks and GPUs
SYSTEM_CHART_POINTS = 600  # the Run page's buckets per chart (pages/run.py LIVE_MAX_POINTS)
WHERE = "lr > 0.001 and best_val_acc >= 0.8"
SEARCH = "week-7"
PAGE_MS = 120_000
# What the peers say of themselves (their docs and issue trackers), beside what is measured here.
PEERS = ("Peers, as published: MLflow compares more than 100 runs 'really slow' and lists 30,000 runs in over 15 "
         "minutes (issue tracker), and samples a chart to 320 points by default, which drops spikes; Aim draws "
         "500 random points of a series; TensorBoard keeps 1,000 reservoir-sampled points per scalar; W&B draws "
         "min/max bands over 1,000 buckets per chart and advises at most 10,000 runs per self-hosted project. "
         "MLflow stores a row per logged value (run_uuid, key, value, timestamp, step, is_nan: about 100 bytes "
         "with its primary-key index).")


def median(values: list[float]) -> float:
    return statistics.median(values)


def timed(function, repeats: int) -> list[float]:
    function()  # the first call pays for imports and the statement cache
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return times


def table_queries(engine, repeats: int) -> dict[str, list[float]]:
    from db import dashboard

    return {
        "first screen": timed(lambda: dashboard.run_page(engine), repeats),
        "sorted by best accuracy": timed(lambda: dashboard.run_page(engine, sort="best_val_acc"), repeats),
        "filter line": timed(lambda: dashboard.run_page(engine, dashboard.RunFilters(where=WHERE)), repeats),
        "search": timed(lambda: dashboard.run_page(engine, dashboard.RunFilters(text=SEARCH)), repeats),
    }


def page_times(playwright, url: str, paths: dict[str, tuple[str, str]], repeats: int) -> dict[str, list[float]]:
    """Seconds from navigation until each page's ``ready`` selector is visible and Streamlit's run has ended,
    ``repeats`` times each after one untimed visit (the server's imports)."""
    browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
    times: dict[str, list[float]] = {name: [] for name in paths}
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        for attempt in range(repeats + 1):
            for name, (path, ready) in paths.items():
                started = time.perf_counter()
                page.goto(url + path)
                page.wait_for_selector(ready, state="visible", timeout=PAGE_MS)
                page.wait_for_function("() => document.querySelector('[data-testid=stApp]')"
                                       "?.getAttribute('data-test-script-state') === 'notRunning'", timeout=PAGE_MS)
                if attempt:
                    times[name].append(time.perf_counter() - started)
    finally:
        browser.close()
    return times


def charts_drawn(count: int) -> str:
    """The ``count``-th Plotly chart of the page drawn (its SVG in place)."""
    return f".stPlotlyChart .svg-container >> nth={count - 1}"


def main() -> None:
    def extra(parser):
        parser.add_argument("--sizes", default="", help="comma list of run counts (default 100,10000,100000)")
        parser.add_argument("--compare-runs", type=int, default=None, help=f"runs on Compare (default {COMPARE_RUNS})")
        parser.add_argument("--home", type=Path, default=None,
                            help="grow the history kept in this PARALLAX_HOME (kept afterwards) instead of a new one")

    args = parse_args(__doc__, extra)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()] or list(QUICK_SIZES if args.quick else SIZES)
    steps = QUICK_STEPS if args.quick else STEPS
    compare_runs = args.compare_runs or (QUICK_COMPARE_RUNS if args.quick else COMPARE_RUNS)
    system_s = QUICK_SYSTEM_S if args.quick else SYSTEM_S
    report = Report("history", "History at scale (runs, a million steps, ingest)", method=METHOD)
    report.settings = {"sizes": sizes, "steps": steps, "values per step": NAMES, "compare runs": compare_runs,
                       "system samples": f"{' and '.join(map(str, SYSTEM_RANKS))} ranks x {system_s:,} s",
                       "repeats": args.repeats}
    missing = browser_missing()
    if missing:
        report.note(f"Pages not timed in a browser: {missing}.")
    with (contextlib.nullcontext(args.home) if args.home else parallax_home("parallax-bench-history-")) as home:
        from db import make_engine

        url = f"sqlite:///{home / 'parallax.db'}"
        engine = make_engine(url)
        runs_section(report, engine, url, home, sizes, args.repeats, missing)
        steps_section(report, engine, url, home, steps, compare_runs, args.repeats, missing)
        for ranks in SYSTEM_RANKS:
            system_section(report, engine, ranks, system_s, args.repeats)
        if pg_url := os.environ.get("PARALLAX_BENCH_PG_URL"):
            postgres_section(report, pg_url, QUICK_PG_SIZES if args.quick else PG_SIZES, min(steps, 200_000),
                             args.repeats)
        else:
            report.note("PostgreSQL not measured here: set PARALLAX_BENCH_PG_URL to an empty database to measure it.")
    report.note(PEERS)
    report.finish(args)


def runs_section(report: Report, engine, url: str, home: Path, sizes: list[int], repeats: int,
                 missing: str | None) -> None:
    from bench.history_build import add_runs, database_bytes
    from db import dashboard

    built = dashboard.run_page(engine, limit=1).matching  # a kept history (--home) grows from what it holds
    sizes = [size for size in sizes if size >= built]

    with contextlib.ExitStack() as stack:
        playwright = server = None
        if not missing:  # one server, as a dashboard left open while the history grows
            from playwright.sync_api import sync_playwright

            env = child_env(PARALLAX_HOME=str(home), PARALLAX_DB_URL=url)
            server = stack.enter_context(running_dashboard(env, log=home / "streamlit.log"))
            playwright = stack.enter_context(sync_playwright())
        for size in sizes:
            started = time.perf_counter()
            spent = add_runs(engine, size - built, first_index=built)
            build_s = time.perf_counter() - started
            print(f"  {size:,} runs: built {size - built:,} in {build_s:.0f} s ({spent})", flush=True)
            added, built = size - built, size
            held = dashboard.run_page(engine, limit=1).matching
            if held != size:  # every run written where the history is, the SDK's too
                raise RuntimeError(f"the history holds {held:,} runs where {size:,} were written")
            report.details.setdefault("build", {})[size] = {"seconds": build_s, **spent, "runs_added": added}
            report.add(f"{size:,} runs: writing the {added:,} runs up to it, per run", [build_s / max(1, added)],
                       unit=" s", headline=False)
            report.add(f"{size:,} runs: database per run", [database_bytes(engine) / size / 1024], unit=" KiB",
                       headline=False)
            for name, times in table_queries(engine, repeats).items():
                report.add(f"{size:,} runs: run_page alone, {name}", times, unit=" s", target=at_most(1.0),
                           headline=size == sizes[-1] and name == "first screen")
            if server is None:
                continue
            ready = "[data-testid=stDataFrame]"
            paths = {"first screen": ("/runs", ready), "filter line": (f"/runs?where={WHERE}", ready),
                     "search": (f"/runs?q={SEARCH}", ready)}
            for name, times in page_times(playwright, server.url, paths, repeats).items():
                report.add(f"{size:,} runs: Runs page in chromium, {name}", times, unit=" s", target=at_most(1.0),
                           headline=size == sizes[-1])


def steps_section(report: Report, engine, url: str, home: Path, steps: int, compare_runs: int, repeats: int,
                  missing: str | None) -> None:
    from bench.history_build import database_bytes, log_steps_script
    from db import script_metrics, store

    spike_at = SPIKE_AT % steps
    before = database_bytes(engine)
    ran = log_steps_script(url, steps=steps, names=NAMES, spike_at=spike_at)
    values = steps * NAMES
    run_id = ran["run_id"]
    stored = script_metrics.points_logged(engine, run_id)
    per_value = (database_bytes(engine) - before) / values
    wait = store.get_run(engine, run_id).measurements.get(script_metrics.LOG_WAIT_KEY) or {}
    print(f"  {steps:,} steps: {stored:,} of {values:,} values stored; {ran}", flush=True)
    report.add(f"a script logging {steps:,} steps of {NAMES} values: values stored", [stored], unit="",
               target=at_least(values))
    report.add(f"SDK ingest into SQLite ({steps:,} steps x {NAMES} in a tight loop), values per second",
               [values / ran["total_s"]], unit=" values/s", target=at_least(200_000))
    report.add("the same: time log waited for the writer (back-pressure)", [wait.get("waited_s", 0.0)], unit=" s",
               headline=False)
    report.add("the same: bytes per stored value (SQLite, packed chunks with their summaries)", [per_value],
               unit=" B", headline=False)
    buckets = script_metrics.read_points(engine, [run_id], names=["metric/0"])
    spike = max(bucket["max"] for bucket in buckets)
    report.add("the one-step spike's value in the chart's buckets (100 expected)", [spike], unit="",
               target=at_least(100.0), headline=False)
    report.add(f"read_points alone, {NAMES} series of {steps:,} steps",
               timed(lambda: script_metrics.read_points(engine, [run_id]), repeats), unit=" s", headline=False)
    compared = [run_id]
    for _ in range(compare_runs - 1):
        compared.append(log_steps_script(url, steps=steps, names=NAMES, spike_at=spike_at)["run_id"])
    report.add(f"read_points alone, {compare_runs} runs x {NAMES} series of {steps:,} steps",
               timed(lambda: script_metrics.read_points(engine, compared), repeats), unit=" s", headline=False)
    if missing:
        return
    from playwright.sync_api import sync_playwright

    env = child_env(PARALLAX_HOME=str(home), PARALLAX_DB_URL=url)
    run_path = (f"/run?run={run_id}", charts_drawn(NAMES))
    compare_path = (f"/compare?runs={','.join(map(str, compared))}", ".st-key-compare_script_metric_0 .svg-container")
    times: dict[str, list[float]] = {"cold": [], "warm": [], "compare": []}
    for _ in range(repeats):  # a fresh server each time: the first visit is a cold one
        with running_dashboard(env, log=home / "streamlit.log") as server, sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1600})
                for label, (path, ready) in (("cold", run_path), ("warm", run_path), ("compare", compare_path)):
                    started = time.perf_counter()
                    page.goto(server.url + path)
                    page.wait_for_selector(ready, state="visible", timeout=PAGE_MS)
                    times[label].append(time.perf_counter() - started)
            finally:
                browser.close()
    report.add(f"Run page of {steps:,} steps x {NAMES}, cold (a fresh server), until its charts are drawn",
               times["cold"], unit=" s", target=at_most(2.0))
    report.add(f"Run page of {steps:,} steps x {NAMES}, warm, until its charts are drawn", times["warm"], unit=" s",
               target=at_most(1.0))
    report.add(f"Compare of {compare_runs} runs of {steps:,} steps, until the first logged metric's chart is drawn",
               times["compare"], unit=" s", target=at_most(2.0))


def system_section(report: Report, engine, ranks: int, seconds: int, repeats: int) -> None:
    from bench.history_build import SYSTEM_SPIKE_PCT, add_system_day
    from db import script_metrics, system_metrics
    from reports import series_charts

    run_id = script_metrics.create_script_run(engine, name=f"{ranks} ranks", project="history", config={},
                                              key=f"script:bench-system-{ranks}", world_size=ranks)
    started = time.perf_counter()
    add_system_day(engine, run_id, ranks=ranks, seconds=seconds)
    print(f"  {seconds:,} s of samples of {ranks} ranks written in {time.perf_counter() - started:.0f} s", flush=True)
    drawn = {}

    def charts() -> None:  # as the Run page builds them: the charted metrics' buckets, then the figures
        rows = system_metrics.read_metric(engine, [run_id], series_charts.SYSTEM_METRICS,
                                          max_points=SYSTEM_CHART_POINTS)
        system = series_charts.system_frame(rows)
        drawn["rows"] = len(rows)
        drawn["figures"] = {metric: series_charts.system_figure(system, metric)
                            for metric in series_charts.system_charts_for(system)}

    report.add(f"system charts of {ranks} ranks and GPUs x {seconds:,} one-second samples (read and built)",
               timed(charts, repeats), unit=" s", target=at_most(1.0), headline=False)
    highest = max(max((y for y in trace.y if y is not None), default=0.0)
                  for trace in drawn["figures"]["util_pct"].data)
    report.note(f"{ranks} ranks: the charts read {drawn['rows']:,} rows (at most {SYSTEM_CHART_POINTS} buckets per "
                f"series; a run of more than {SYSTEM_CHART_POINTS // 4} minutes from the minutes' summaries alone), "
                f"and GPU 1's one-second spike of {SYSTEM_SPIKE_PCT:g} % is "
                f"{'on' if highest >= SYSTEM_SPIKE_PCT else 'NOT on'} the utilisation chart (its top: {highest:g} %).")


def postgres_section(report: Report, pg_url: str, sizes: list[int], steps: int, repeats: int) -> None:
    from bench.history_build import add_runs, log_steps_script
    from db import make_engine

    engine = make_engine(pg_url)
    ran = log_steps_script(pg_url, steps=steps, names=NAMES, spike_at=SPIKE_AT % steps)
    report.add(f"SDK ingest into PostgreSQL ({steps:,} steps x {NAMES}), values per second",
               [steps * NAMES / ran["total_s"]], unit=" values/s", headline=False)
    built = 0
    for size in sizes:
        add_runs(engine, size - built, first_index=built)
        built = size
        for name, times in table_queries(engine, repeats).items():
            report.add(f"PostgreSQL, {size:,} runs: run_page alone, {name}", times, unit=" s", target=at_most(1.0),
                       headline=False)


if __name__ == "__main__":
    main()
