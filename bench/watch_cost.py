"""Watch cost: what the dashboard costs with a tab left open, and what one tab watching a running run
costs the run.

The dashboard is started as ``make run`` starts it (bench/browser.py: ``parallax ui``, i.e. ``streamlit run app.py`` from the
project folder, its .streamlit/config.toml, nothing added). Phases, each a window of ``--window``
seconds in which the Streamlit server's CPU time (its process tree, from /proc) per second of wall
time is measured, i.e. cores, with the browser's (chromium and the playwright driver), the run's
(its supervisor and ranks), and everything else on the machine (/proc/stat's busy time less all of
these and this process):

1. no tab open; 2. one tab settled on the Launch page (3 s after its heading shows, then until a second
   in which the server used under 0.05 of a core, at most 60 s: the first page load has the backend's
   inspector, a child process, import torch); then Runs, Compare and Sweeps each opened in a tab and settled
   alike, and the server's memory read (RSS and PSS, /proc) with the files of torch it maps (none: it never
   imports torch) and the inspector's memory beside it;
3. a real run trains (resnet18 on digits, 32 px, batch 128, ``python -m trainer_backend launch``);
   after its first epoch, windows alternate: unwatched (no tab) and watched (one headless chromium
   tab on the run's page, opened and settled for 3 s before the window starts); the run's training
   throughput is Parallax's images/s of every epoch that began and ended inside the window. At the
   end of each watched window the page must still show its five charts, redrawn for an epoch that
   landed while it was watched;
4. the run is cancelled, and one tab settles (as in 2.) on its finished page.

Latency, beside the cost: from the launch, this process polls the run's row and its step points every
0.1 s with a tab open on the run's page, for when the run leaves the queue (running), when its first step
point is recorded, and when the page has drawn it (the live charts' ``drawnUpTo``: every step recorded
up to it is on the charts). After each watched window, for another window, each step point recorded is
timed from when this process first saw it in the database to when the watching tab had drawn it.

    python bench/watch_cost.py                  # 5 pairs of 40 s windows
    python bench/watch_cost.py --repeats 3 --window 30
    python bench/watch_cost.py --quick          # test_resnet, one pair of 3 s windows
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.browser import (CHROMIUM, CHROMIUM_ARGS, EPOCH_CHART_KEYS, EPOCH_CHARTS, browser_missing,  # noqa: E402
                           dashboard_server, make_run_command)
from bench.common import parallax_command, parallax_home, parse_args, run_id_from, run_timed  # noqa: E402
from bench.machine import CpuShare, child_pids, memory_mb, process_tree_cpu_s, torch_files_mapped  # noqa: E402
from bench.report import Report  # noqa: E402
from bench.stats import at_least, at_most  # noqa: E402
from ui import live, live_feed  # noqa: E402

METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
SETTLE_S = 3.0
SETTLED_CORES, SETTLE_MAX_S = 0.05, 60.0
PAGE_MS = 120_000


KINDS = ("no tab", "Launch tab", "unwatched", "watched", "finished run tab")
# The pages opened, in this order, before the server's memory is read: each by its path and heading.
PAGES = (("/", "Launch a run"), ("/runs", "Runs"), ("/compare", "Compare runs"), ("/sweep", "Sweeps"))
POLL_S = 0.1
LATENCY_MIN_S = 12.0
# What the watching tab has drawn: every step up to this one (ui/live_feed.py), 0 before the first.
DRAWN_UP_TO = "() => window.drawnUpTo || 0"


def add_window(parser) -> None:
    parser.add_argument("--window", type=float, default=None, help="seconds per window (default 40; 3 with --quick)")


def run_flags(quick: bool) -> list[str]:
    if quick:
        return ["--model", "test_resnet", "--image-size", "16", "--epochs", "200"]
    return ["--model", "resnet18", "--image-size", "32", "--epochs", "200"]


class Watch:
    """The server, the browser and (once launched) the run; one window at a time."""

    def __init__(self, server_pid: int, url: str, browser):
        self.server_pid, self.url, self.browser = server_pid, url, browser
        self.engine, self.run_id = None, None
        self.windows: dict[str, list[dict]] = {kind: [] for kind in KINDS}

    def follow(self, engine, run_id: int) -> None:
        self.engine, self.run_id = engine, run_id
        self.latencies_s: list[float] = []
        self.start: dict[str, float] = {}

    def recorded_step(self) -> int:
        from db import series

        return series.last_step(self.engine, [self.run_id])[self.run_id]

    @staticmethod
    def drawn_step(page) -> int:
        """The last step the page's live charts hold (0 before they are there)."""
        for frame in page.frames[1:]:
            try:
                return int(frame.evaluate(DRAWN_UP_TO))
            except Exception:  # a frame still loading, or not the live charts'
                continue
        return 0

    def watch_start(self, launched_at: float, timeout_s: float = 300) -> None:
        """A tab on the run's page from its launch: seconds from the launch to the run leaving the queue, its
        first step point recorded, and that point drawn on the page."""
        from db import store

        page = self.browser.new_page(viewport={"width": 1400, "height": 1600})
        try:
            page.set_default_timeout(PAGE_MS)
            page.goto(f"{self.url}/run?run={self.run_id}", wait_until="commit")  # polls start while it loads
            deadline = time.monotonic() + timeout_s
            while len(self.start) < 3:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"run {self.run_id}: only {sorted(self.start)} within {timeout_s:.0f} s")
                now = time.perf_counter() - launched_at
                if "running" not in self.start and store.get_run(self.engine, self.run_id).status != "queued":
                    self.start["running"] = now
                if "recorded" not in self.start and self.recorded_step() > 0:
                    self.start["recorded"] = now
                if "recorded" in self.start and "drawn" not in self.start and self.drawn_step(page) > 0:
                    self.start["drawn"] = now
                page.wait_for_timeout(POLL_S * 1000)
        finally:
            page.close()
        self.server_idle()

    def server_idle(self) -> None:
        """Until a second in which the server used under SETTLED_CORES (a closed tab's last rerun is over), or
        SETTLE_MAX_S."""
        deadline = time.monotonic() + SETTLE_MAX_S
        while time.monotonic() < deadline:
            before = process_tree_cpu_s(self.server_pid)
            time.sleep(1.0)
            if process_tree_cpu_s(self.server_pid) - before < SETTLED_CORES:
                return

    def time_points(self, page, window_s: float) -> None:
        """For ``window_s`` (at least LATENCY_MIN_S: points are written a few seconds' worth at a time): each step
        point recorded, from when this process saw it to when the page drew it."""
        window_s = max(window_s, LATENCY_MIN_S)
        seen: dict[int, float] = {}
        known = self.recorded_step()
        end = time.monotonic() + window_s
        while time.monotonic() < end or (seen and time.monotonic() < end + 10):
            if time.monotonic() < end and (step := self.recorded_step()) > known:
                seen[step], known = time.perf_counter(), step
            drawn = self.drawn_step(page)
            for step in [s for s in seen if s <= drawn]:
                self.latencies_s.append(time.perf_counter() - seen.pop(step))
            page.wait_for_timeout(POLL_S * 1000)
        if seen:
            raise RuntimeError(f"steps {sorted(seen)} were recorded but not drawn within 10 s")

    def last_epoch(self) -> int:
        from db import store

        return store.last_epochs(self.engine, [self.run_id])[self.run_id] if self.run_id else 0

    def wait_for_epoch(self, epoch: int, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while self.last_epoch() < epoch:
            if time.monotonic() > deadline:
                raise RuntimeError(f"run {self.run_id} did not record epoch {epoch} in {timeout_s:.0f} s")
            time.sleep(0.5)

    def _run_cpu_s(self) -> float:
        """CPU seconds of the run's supervisor and its ranks (0 before a run, or once it has ended)."""
        from db import store

        run = store.get_run(self.engine, self.run_id) if self.run_id else None
        return process_tree_cpu_s(run.pid) if run is not None and run.pid else 0.0

    def _own_cpu_s(self) -> float:
        times = os.times()
        return times.user + times.system

    def measure(self, kind: str, window_s: float, page=None) -> None:
        first = self.last_epoch()
        machine = CpuShare()
        start = time.perf_counter()
        server0, browser0, run0, own0 = (process_tree_cpu_s(self.server_pid), self._browser_cpu_s(),
                                         self._run_cpu_s(), self._own_cpu_s())
        if page is None:
            time.sleep(window_s)
        else:
            page.wait_for_timeout(window_s * 1000)  # playwright serves the page's events meanwhile
        elapsed = time.perf_counter() - start
        server1, browser1, run1, own1 = (process_tree_cpu_s(self.server_pid), self._browser_cpu_s(),
                                         self._run_cpu_s(), self._own_cpu_s())
        last = self.last_epoch()
        # A child that exits within the window (the launch command) takes its CPU time out of the tree: never
        # below 0.
        cores = {"server_cores": (server1 - server0) / elapsed,
                 "browser_cores": max(0.0, browser1 - browser0) / elapsed,
                 "run_cores": max(0.0, run1 - run0) / elapsed, "own_cores": (own1 - own0) / elapsed}
        # CpuShare counts this process and its reaped children as its own; the server and the browser are
        # live children, the run a detached process: take them out too.
        others = machine.others_cores() - cores["server_cores"] - cores["browser_cores"] - cores["run_cores"]
        # Epochs first+2 .. last began and ended inside the window.
        self.windows[kind].append({**cores, "others_cores": max(0.0, others),
                                   "epochs": list(range(first + 2, last + 1)) if self.run_id else []})

    def _browser_cpu_s(self) -> float:
        """CPU seconds of this process's children but the server (playwright's driver and chromium)."""
        return process_tree_cpu_s(os.getpid()) - self._own_cpu_s() - process_tree_cpu_s(self.server_pid)

    def settle(self, page) -> None:
        """Wait until a page's first load is over (the server's first page imports torch, timm and the
        datasets): a second in which the server used under SETTLED_CORES, or SETTLE_MAX_S. A page that keeps
        the server busy never settles, and its window measures that."""
        deadline = time.monotonic() + SETTLE_MAX_S
        while time.monotonic() < deadline:
            before = process_tree_cpu_s(self.server_pid)
            page.wait_for_timeout(1000)
            if process_tree_cpu_s(self.server_pid) - before < SETTLED_CORES:
                return

    def settled_tab(self, kind: str, path: str, heading: str, window_s: float) -> None:
        """One tab opened on ``path``, left ``SETTLE_S`` after ``heading`` shows, then a window."""
        from playwright.sync_api import expect

        page = self.browser.new_page(viewport={"width": 1400, "height": 1600})
        try:
            page.set_default_timeout(PAGE_MS)
            page.goto(f"{self.url}{path}")
            expect(page.get_by_role("heading", name=heading)).to_be_visible(timeout=PAGE_MS)
            page.wait_for_timeout(SETTLE_S * 1000)
            self.settle(page)
            self.measure(kind, window_s, page)
        finally:
            page.close()

    def open_pages(self) -> dict:
        """Each of PAGES opened in a tab and settled as Launch's is, then the server's memory and the files of
        torch it maps, and the memory of its children (the inspector)."""
        from playwright.sync_api import expect

        for path, heading in PAGES:
            page = self.browser.new_page(viewport={"width": 1400, "height": 1600})
            try:
                page.set_default_timeout(PAGE_MS)
                page.goto(f"{self.url}{path}")
                expect(page.get_by_role("heading", name=heading)).to_be_visible(timeout=PAGE_MS)
                page.wait_for_timeout(SETTLE_S * 1000)
                self.settle(page)
            finally:
                page.close()
        children = [memory_mb(pid) for pid in child_pids(self.server_pid)]
        return {**memory_mb(self.server_pid), "torch_files": torch_files_mapped(self.server_pid),
                "children_rss_mb": sum(child["rss_mb"] for child in children),
                "children_pss_mb": sum(child["pss_mb"] for child in children)}

    def watched(self, window_s: float) -> None:
        from playwright.sync_api import expect

        expect.set_options(timeout=PAGE_MS)
        page = self.browser.new_page(viewport={"width": 1400, "height": 1600})
        try:
            page.set_default_timeout(PAGE_MS)
            page.goto(f"{self.url}/run?run={self.run_id}")
            expect(page.get_by_role("heading", name=f"Run #{self.run_id}")).to_be_visible()
            expect(page.locator(EPOCH_CHARTS)).to_have_count(len(EPOCH_CHART_KEYS))
            shown = self.last_epoch()
            page.wait_for_timeout(SETTLE_S * 1000)
            self.measure("watched", window_s, page)
            self.time_points(page, window_s)
            # The charts stayed on the page between ticks, and were redrawn as epochs landed: the
            # loss chart has one training-loss marker per recorded epoch.
            charts = page.locator(EPOCH_CHARTS)
            expect(charts).to_have_count(len(EPOCH_CHART_KEYS))
            if self.last_epoch() <= shown:
                raise RuntimeError(f"no epoch landed in a {window_s:.0f} s window: use a longer --window")
            markers = page.locator(".st-key-loss .stPlotlyChart").locator(".scatterlayer .trace").first.locator("path.point")
            # Epochs may keep landing while we look: the chart must catch up with every epoch
            # recorded before the look, and show none that was not recorded after it.
            # The page redraws for new epochs at most every EPOCH_REDRAW_S, at a tick.
            catch_up_s = live.EPOCH_REDRAW_S + live.REFRESH_S + 5
            recorded, deadline = self.last_epoch(), time.monotonic() + catch_up_s
            while (shown_markers := markers.count()) < recorded:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the loss chart shows {shown_markers} epochs {catch_up_s} s after {recorded} "
                                       "were recorded")
                page.wait_for_timeout(500)
            if shown_markers > self.last_epoch():
                raise RuntimeError(f"the loss chart shows {shown_markers} epochs, more than were recorded")
        finally:
            page.close()

    def print_last(self, kind: str, label: str) -> None:
        w = self.windows[kind][-1]
        print(f"  {label}: server {w['server_cores']:.3f} cores, browser {w['browser_cores']:.2f}, run "
              f"{w['run_cores']:.2f}, others {w['others_cores']:.2f}, epochs {w['epochs']}", flush=True)


def wait_until_finished(engine, run_id: int, timeout_s: float = 120) -> None:
    from db import store
    from db.run_state import ACTIVE_STATUSES

    deadline = time.monotonic() + timeout_s
    while store.get_run(engine, run_id).status in ACTIVE_STATUSES:
        if time.monotonic() > deadline:
            raise RuntimeError(f"run {run_id} was still active {timeout_s:.0f} s after it was cancelled")
        time.sleep(0.5)


def main() -> None:
    args = parse_args(__doc__, add_window)
    window_s = args.window or (3.0 if args.quick else 40.0)
    report = Report("watch_cost", "Watch cost", method=METHOD)
    report.settings = {"pairs of windows": args.repeats, "window_s": window_s,
                       "run": " ".join(run_flags(args.quick)), "server": " ".join(make_run_command("127.0.0.1", 0)[1:])}
    if missing := browser_missing():
        report.skip(missing)
        report.finish(args)
        return
    from playwright.sync_api import sync_playwright

    from db import make_engine, store
    from trainer_backend.control.lifecycle import cancel

    with parallax_home("parallax-bench-watch-") as home, dashboard_server(home) as (server, url, _):
        db_url = f"sqlite:///{home / 'parallax.db'}"
        engine, run_id = make_engine(db_url), None
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
                try:
                    watch = Watch(server.pid, url, browser)
                    memory = None
                    for repeat in range(1, args.repeats + 1):
                        watch.measure("no tab", window_s)
                        watch.print_last("no tab", f"no tab #{repeat}")
                        watch.settled_tab("Launch tab", "/", "Launch a run", window_s)
                        watch.print_last("Launch tab", f"Launch tab #{repeat}")
                        if memory is None:
                            memory = watch.open_pages()
                            print(f"  after {', '.join(h for _, h in PAGES)}: server RSS {memory['rss_mb']:.0f} MB, "
                                  f"PSS {memory['pss_mb']:.0f} MB, torch files mapped {len(memory['torch_files'])}; "
                                  f"its children (the inspector) RSS {memory['children_rss_mb']:.0f} MB", flush=True)
                    launched_at = time.perf_counter()
                    launched = run_timed(parallax_command("launch", "--dataset", "digits", "--batch-size", "128",
                                                        *run_flags(args.quick), "--tags", "bench"))
                    run_id = run_id_from(launched.stdout)
                    watch.follow(engine, run_id)
                    watch.watch_start(launched_at)
                    print(f"  from the launch: running {watch.start['running']:.2f} s, first point recorded "
                          f"{watch.start['recorded']:.2f} s, drawn {watch.start['drawn']:.2f} s", flush=True)
                    watch.wait_for_epoch(1)  # the first epoch carries start-up costs
                    for repeat in range(1, args.repeats + 1):
                        watch.measure("unwatched", window_s)
                        watch.print_last("unwatched", f"unwatched #{repeat}")
                        watch.watched(window_s)
                        watch.print_last("watched", f"watched #{repeat}")
                    report.cpu.count_as_own(watch._run_cpu_s())  # a detached run: not this process's child
                    cancel(run_id, db_url=db_url)
                    wait_until_finished(engine, run_id)
                    for repeat in range(1, args.repeats + 1):
                        watch.settled_tab("finished run tab", f"/run?run={run_id}", f"Run #{run_id}", window_s)
                        watch.print_last("finished run tab", f"finished run's page #{repeat}")
                finally:
                    browser.close()
            recorded = store.export_run(engine, run_id)["epochs"]
            epochs = {e["epoch"]: e["images_per_s"] for e in recorded}
            epoch_times_s = [e["epoch_time_s"] for e in recorded if e.get("epoch_time_s")]
        finally:
            if run_id is not None and store.get_run(engine, run_id).status in ("queued", "running"):
                cancel(run_id, db_url=db_url)
            engine.dispose()
    add_memory(report, memory)
    add_figures(report, watch.windows, epochs, epoch_times_s)
    add_latency(report, watch.start, watch.latencies_s)
    report.finish(args)


def add_memory(report: Report, memory: dict) -> None:
    pages = ", ".join(heading for _, heading in PAGES)
    report.add(f"server memory (RSS) after {pages} were opened", [memory["rss_mb"]], unit=" MB", target=at_most(300))
    report.add(f"server memory (PSS) after {pages} were opened", [memory["pss_mb"]], unit=" MB", headline=False)
    report.add("files of torch or torchvision the server maps", [len(memory["torch_files"])], target=at_most(0),
               headline=False)
    report.add("the inspector's memory (RSS; the child that imports torch for the Launch form)",
               [memory["children_rss_mb"]], unit=" MB", headline=False)
    report.note("Memory: the server never imports torch, timm or torchvision; what the Launch form needs from them "
                "(every timm model, a model's parameter count, a dataset's description, the memory estimate) comes "
                "from one child process, the inspector, started at the first Launch page. Before, the server "
                "imported them itself: 95 MB before the first page, 930-950 MB RSS once Launch, Runs, Compare and "
                "Sweeps had been opened (2026-12-07, 2 cores).")


def add_latency(report: Report, start: dict[str, float], latencies_s: list[float]) -> None:
    if latencies_s:
        report.add("a recorded step point drawn on the watching page, after it was recorded", latencies_s, unit=" s",
                   target=at_most(2.0))
    else:  # a run that ended or wrote no point in the windows after the watched ones: no figure, and why
        report.note(f"No step point was recorded in the {LATENCY_MIN_S:g}-second windows after the watched ones "
                    "(the run ended or wrote none then): the drawing latency of a recorded point is not measured.")
    report.add("launch to the run leaving the queue (an idle machine)", [start["running"]], unit=" s",
               headline=False)
    report.add("launch to its first step point recorded", [start["recorded"]], unit=" s", headline=False)
    report.add("its first step point recorded to drawn on a tab opened at the launch",
               [start["drawn"] - start["recorded"]], unit=" s", target=at_most(2.0), headline=False)
    report.note("Latency and cost side by side: the live step charts are fed by a route the page's own document "
                f"asks every {live_feed.POLL_S:g} s for the points after the last one it holds (two index seeks, "
                "no Streamlit rerun), so they cost the server little whatever the cadence; a point is recorded a "
                "few seconds' worth at a time (the run's first at once), and the latency counts from when this "
                f"process saw it in the database (polled every {POLL_S:g} s: up to that much later than it was "
                "written).")
    report.note("Where an idle machine's queue wait went (launch to running, 4.4 s on 2 cores before): the "
                "launched supervisor imported torch, timm and the training code (3.9 s) before it claimed the run. It now "
                "claims it first, then imports: the run holds its devices while it imports, and the page shows it "
                "running. Launch to first step is unchanged by that (bench/launch_latency.py); its page ticks "
                f"every {live.QUEUED_REFRESH_S} s while it is queued, for its first {live.QUEUED_FAST_FOR_S} s.")


def add_figures(report: Report, windows: dict[str, list[dict]], epochs: dict[int, float],
                epoch_times_s: list[float]) -> None:
    def cores(kind: str, what: str) -> list[float]:
        return [w[what] for w in windows[kind]]

    report.add("server CPU, one tab settled on Launch", cores("Launch tab", "server_cores"), unit=" cores",
               target=at_most(0.02))
    report.add("server CPU while one tab watches a running run", cores("watched", "server_cores"), unit=" cores",
               target=at_most(0.05))
    report.add("server CPU, one tab on a finished run's page", cores("finished run tab", "server_cores"),
               unit=" cores")
    report.add("server CPU, no tab open", cores("no tab", "server_cores"), unit=" cores", headline=False)
    report.add("server CPU, no tab open, a run training", cores("unwatched", "server_cores"), unit=" cores",
               headline=False)
    for kind, label in (("Launch tab", "a tab on Launch"), ("watched", "watching a running run"),
                        ("finished run tab", "a tab on a finished run's page")):
        report.add(f"browser CPU, {label} (chromium)", cores(kind, "browser_cores"), unit=" cores", headline=False)
    throughput = {kind: [[epochs[n] for n in w["epochs"] if epochs.get(n)] for w in windows[kind]]
                  for kind in ("watched", "unwatched")}
    # Each watched window against the unwatched one just before it: the pair shares the machine's state.
    pairs = [(statistics.median(w), statistics.median(u))
             for w, u in zip(throughput["watched"], throughput["unwatched"]) if w and u]
    if pairs:
        report.ratio("run's images/s, watched / unwatched", [w for w, _ in pairs], [u for _, u in pairs],
                     target=at_least(0.95))
        report.add("run's images/s, watched", [x for w in throughput["watched"] for x in w], unit=" images/s",
                   headline=False)
        report.add("run's images/s, unwatched", [x for u in throughput["unwatched"] for x in u], unit=" images/s",
                   headline=False)
    else:
        report.note("No epoch began and ended inside a window: use a longer --window.")
    for kind in ("unwatched", "watched"):
        report.add(f"the run's own CPU, {kind}", cores(kind, "run_cores"), unit=" cores", headline=False)
        report.add(f"other processes' CPU, {kind} (neither run, server, browser nor this script)",
                   cores(kind, "others_cores"), unit=" cores", headline=False)
    report.note(where_the_time_goes(windows))
    report.note("Where the server's share goes (sampled once per second on 2026-11-25): a progress tick costs the "
                "server 0.10-0.13 s of CPU and a whole-page redraw for new epochs 0.33-0.45 s; the tick's database "
                "reads take about 1 ms of it (cProfile), the rest is Streamlit's rerun. With ticks every 5 s and "
                "redraws every 20 s a watching tab cost the server 0.074 of a core and the run 6 % of its images/s "
                "on the quiet machine; the timers below are what brought it under 0.05.")
    report.note("Before the dashboard's own config turned the file watcher off, `make run` served it with "
                "Streamlit's default watcher, which re-walked the project folder (.venv included): one tab on "
                "Launch or on a finished run cost the server a whole core, 0.62-0.92 watching a running run.")
    report.note(f"The progress ticks every {live.REFRESH_S} s: Streamlit spends tens of ms of CPU on each rerun "
                "whatever it draws (a fragment with one progress bar every 2 s costs its server about 0.03 of a core "
                f"here). New epochs redraw the page at most every {live.EPOCH_REDRAW_S} s; the step and system charts "
                f"tick every {live.SERIES_REFRESH_S} s of their own only while epochs last longer than that "
                f"(this run's epochs lasted {statistics.median(epoch_times_s or [float('nan')]):.1f} s: "
                "where that is less, the page's redraws draw them).")


def where_the_time_goes(windows: dict[str, list[dict]]) -> str:
    """What the watched windows spent beside the run, against the unwatched ones, in cores (medians)."""
    def median(kind: str, what: str) -> float:
        values = [w[what] for w in windows[kind]]
        return statistics.median(values) if values else float("nan")

    beside = {what: (median("watched", what), median("unwatched", what))
              for what in ("run_cores", "browser_cores", "server_cores", "others_cores")}

    def pair(what: str) -> str:
        return f"{beside[what][0]:.2f} (unwatched {beside[what][1]:.2f})"

    return ("Where a watched run's time goes: on a machine of few cores the run trains on all of them, so any CPU "
            "used beside it is taken from it. In cores, watched against unwatched: the run itself "
            f"{pair('run_cores')}; "
            f"the browser {pair('browser_cores')}; the server {pair('server_cores')}, every database read the page "
            f"makes included; other processes {pair('others_cores')}.")


if __name__ == "__main__":
    main()
