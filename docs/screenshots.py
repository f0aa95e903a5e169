"""Remake the README's screenshots from the runs a new user makes, in a real dashboard and browser.

A fresh dashboard (its own PARALLAX_HOME in a temporary folder) is started and Debian's chromium
drives it through playwright as a user would: on Launch, Compare strategies with the form's default
sweep (resnet18 on the digits: single, ddp, mp and pp on two CPU devices) and wait for all of it;
then the two-process DDP run's page, its numbers, notes, epoch charts and time per rank ->
docs/img/run-page.png, and further down the same page its per-step and system charts ->
docs/img/run-steps-system.png; then Compare with the sweep's runs -> docs/img/compare-page.png.
Then a history logged from scripts (``import parallax``: forty trials of a tuning sweep and one run of
200,000 steps whose loss has a one-step spike and a NaN): the Runs page searched and filtered ->
docs/img/runs-search.png, and the long run's loss chart, its band and its NaN mark ->
docs/img/banded-chart.png. Then the README's search (``parallax search``, 8 trials, the median pruner) and its
Search page -> docs/img/search-page.png. Several minutes on 2 cores (the runs train one after the other).

    .venv/bin/python docs/screenshots.py
    .venv/bin/python docs/screenshots.py --home /tmp/shots --runs 1,2,3,4   # again from kept runs
    .venv/bin/python docs/screenshots.py --history-only                     # the Runs search and the banded chart
    .venv/bin/python docs/screenshots.py --search-only                      # only the search and its page
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.browser import CHROMIUM, EPOCH_CHART_KEYS, EPOCH_CHARTS, make_run_command  # noqa: E402

IMAGES = ROOT / "docs" / "img"
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
# Tall enough for the Run page whole (Streamlit scrolls inside itself); each shot is a clip of it.
VIEWPORT = {"width": 1400, "height": 6000}
SHOT_HEIGHT_PX = 2100  # the most of any shot: a Run page's top down to its time per rank
UI_MS = 120_000
RUN_MS = 30 * 60_000
SWEEP_RUNS = 4  # the form's default sweep: single, ddp, mp, pp
STEP_AND_SYSTEM_CHARTS = ".st-key-step_train_loss, .st-key-system_memory_mb"
CHROMIUM_WAIT_S = 600


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_chromium() -> None:
    """Wait for the browser (it may be installing while this starts)."""
    deadline = time.monotonic() + CHROMIUM_WAIT_S
    while not (CHROMIUM.exists() and os.access(CHROMIUM, os.X_OK)):
        if time.monotonic() > deadline:
            sys.exit(f"error: {CHROMIUM} is missing: apt-get install -y chromium")
        time.sleep(5)


def start_dashboard(home: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.pop("PARALLAX_DB_URL", None)
    log = open(home / "streamlit.log", "wb")
    process = subprocess.Popen(
        make_run_command("127.0.0.1", port),  # as make run starts it: the project's config, nothing added
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(120):
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2):
                return process, url
        except OSError:
            time.sleep(0.5)
    process.terminate()
    sys.exit(f"error: the dashboard did not start; see {home / 'streamlit.log'}")


def wait_idle(page) -> None:
    page.wait_for_timeout(500)
    page.get_by_test_id("stStatusWidget").wait_for(state="detached", timeout=UI_MS)


def shoot(page, name: str, top_px: float = 0.0, bottom_px: float | None = None, left_px: float = 0.0) -> Path:
    """The page from ``top_px`` to ``bottom_px`` (SHOT_HEIGHT_PX at most) and from ``left_px`` to the right edge."""
    page.mouse.move(VIEWPORT["width"] - 5, VIEWPORT["height"] - 5)  # no hover toolbar over a chart
    page.wait_for_timeout(500)
    bottom_px = min(top_px + SHOT_HEIGHT_PX, bottom_px if bottom_px is not None else top_px + SHOT_HEIGHT_PX)
    path = IMAGES / name
    page.screenshot(path=str(path), clip={"x": left_px, "y": top_px, "width": VIEWPORT["width"] - left_px,
                                          "height": bottom_px - top_px})
    return path


def open_launch_form(page, url: str):
    page.goto(url)
    button = page.get_by_test_id("stBaseButton-primary").filter(has_text="Launch")
    button.wait_for(timeout=UI_MS)
    wait_idle(page)
    return button


def completed_badges(page):
    return page.get_by_role("paragraph").filter(has=page.get_by_role("img", name="check_circle icon"))


def default_sweep(page, url: str) -> list[int]:
    """Compare strategies with the form's defaults; wait until every run has completed. Its run ids, in launch order."""
    from playwright.sync_api import expect

    open_launch_form(page, url)
    page.get_by_test_id("stRadio").get_by_text("Compare strategies", exact=True).click()
    wait_idle(page)
    page.locator("[data-testid=stBaseButton-primary]:visible", has_text="Launch the sweep").click()
    page.wait_for_url(re.compile(r"/sweep\?sweep=\d+"), timeout=UI_MS)
    expect(completed_badges(page)).to_have_count(SWEEP_RUNS, timeout=RUN_MS)
    wait_idle(page)
    links = page.get_by_role("link", name=re.compile(r"^Run #\d+ ")).all_text_contents()
    return sorted({int(re.search(r"Run #(\d+)", text).group(1)) for text in links})


def run_page(page, url: str, run_id: int) -> None:
    """The run's page: its top (numbers, notes, epoch charts, time per rank), then its per-step and system charts."""
    from playwright.sync_api import expect

    page.goto(f"{url}/run?run={run_id}")
    expect(page.locator(EPOCH_CHARTS)).to_have_count(len(EPOCH_CHART_KEYS), timeout=UI_MS)
    expect(page.locator(STEP_AND_SYSTEM_CHARTS)).to_have_count(2, timeout=UI_MS)
    wait_idle(page)
    page.wait_for_timeout(1500)  # the charts lay themselves out after the rerun
    ranks = page.get_by_test_id("stDataFrame").first.bounding_box()  # the per-rank table, under its chart
    print(f"run #{run_id} -> {shoot(page, 'run-page.png', bottom_px=ranks['y'] + ranks['height'] + 20)}", flush=True)
    main = page.get_by_test_id("stMain").bounding_box()
    # From the first per-step chart's row to the end of the system charts: the charts are the last on the page
    # before the log, two to a row.
    first = page.locator(".st-key-step_train_loss").bounding_box()
    last = page.locator(".stPlotlyChart").last.bounding_box()
    path = shoot(page, "run-steps-system.png", top_px=first["y"] - 20, bottom_px=last["y"] + last["height"] + 20,
                 left_px=main["x"])
    print(f"run #{run_id}, per-step and system charts -> {path}", flush=True)


def compare(page, run_ids: list[int]) -> None:
    from playwright.sync_api import expect

    page.get_by_test_id("stSidebarNav").get_by_role("link", name="Compare").click()
    picker = page.get_by_test_id("stMultiSelect").filter(has_text="Runs to compare")
    picker.wait_for(timeout=UI_MS)
    for count, run_id in enumerate(run_ids, start=1):
        picker.get_by_role("combobox").click()  # not the middle: a picked run's remove button may be there
        page.keyboard.type(f"#{run_id} ")
        page.get_by_role("option", name=re.compile(f"^#{run_id} ")).click()
        wait_idle(page)
        page.keyboard.press("Escape")
        expect(picker.locator("[data-tag]")).to_have_count(count, timeout=UI_MS)  # the picked runs
    page.locator(".stPlotlyChart").nth(2).wait_for(timeout=UI_MS)
    wait_idle(page)
    page.wait_for_timeout(1500)
    print(f"runs {run_ids} -> {shoot(page, 'compare-page.png')}", flush=True)


# Forty trials of a tuning sweep and one long run, logged as users' scripts log them; prints the long run's id.
HISTORY_SCRIPT = """
import math, random
import parallax

random.seed(7)
for trial in range(40):
    lr = (1e-4, 3e-4, 1e-3, 3e-3)[trial % 4]
    with parallax.init(project="lr-sweep", name=f"trial-{trial}", config={"lr": lr, "optimizer": "adam"},
                       tags=["sweep", "week-%d" % (trial % 3)]) as run:
        for step in range(30):
            run.log({"train/loss": 2.3 * math.exp(-lr * 900 * step) + random.random() * 0.05}, step=step)
        run.summary["val/acc"] = round(0.80 + 0.19 * random.random(), 3)
with parallax.init(project="long", name="200k-steps", config={"lr": 1e-3}, tags=["long"]) as run:
    for step in range(200_000):
        loss = 2.3 * math.exp(-step / 40_000) + 0.1 + random.random() * 0.05
        if step == 123_456:
            loss = 9.0  # a one-step spike: the band keeps it
        if step == 150_000:
            loss = float("nan")
        run.log({"train/loss": loss, "train/lr": 1e-3 * min(1.0, step / 5_000)}, step=step)
print(run.run_id)
"""


def logged_history(home: Path) -> int:
    """The script runs of ``HISTORY_SCRIPT`` in ``home``; the long run's id."""
    env = {**os.environ, "PARALLAX_HOME": str(home)}
    env.pop("PARALLAX_DB_URL", None)
    done = subprocess.run([sys.executable, "-c", HISTORY_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1800)
    if done.returncode != 0:
        sys.exit(f"error: the history script failed:\n{done.stderr[-3000:]}")
    return int(done.stdout.strip().splitlines()[-1])


def history_shots(page, url: str, long_run: int) -> None:
    """The Runs page searched and filtered, and a long run's banded loss chart."""
    page.goto(f"{url}/runs?q=sweep&where=lr >= 0.001 and summary.val/acc > 0.85")
    page.get_by_test_id("stDataFrame").first.wait_for(timeout=UI_MS)
    wait_idle(page)
    page.wait_for_timeout(1500)
    table = page.get_by_test_id("stDataFrame").first.bounding_box()
    print(f"Runs, searched -> {shoot(page, 'runs-search.png', bottom_px=table['y'] + table['height'] + 20)}",
          flush=True)
    page.goto(f"{url}/run?run={long_run}")
    page.locator(".stPlotlyChart .svg-container").nth(1).wait_for(timeout=UI_MS)
    wait_idle(page)
    page.wait_for_timeout(1500)
    main = page.get_by_test_id("stMain").bounding_box()
    first = page.locator(".stPlotlyChart").first.bounding_box()
    path = shoot(page, "banded-chart.png", top_px=first["y"] - 60, bottom_px=first["y"] + first["height"] + 20,
                 left_px=main["x"])
    print(f"run #{long_run}, its loss band -> {path}", flush=True)


def cancel_active_runs(home: Path) -> None:
    """Runs are detached from the dashboard: stop any this script leaves behind."""
    env = {**os.environ, "PARALLAX_HOME": str(home)}
    env.pop("PARALLAX_DB_URL", None)
    listed = subprocess.run([sys.executable, "-m", "trainer_backend", "list"], cwd=ROOT, env=env,
                            capture_output=True, text=True).stdout
    for run_id in re.findall(r"run_id=(\d+) status=(?:queued|running)", listed):
        subprocess.run([sys.executable, "-m", "trainer_backend", "cancel", run_id], cwd=ROOT, env=env,
                       capture_output=True)


def ddp_run(home: Path, run_ids: list[int]) -> int:
    """Which of ``run_ids`` is the DDP run (``parallax list``)."""
    env = {**os.environ, "PARALLAX_HOME": str(home)}
    env.pop("PARALLAX_DB_URL", None)
    listed = subprocess.run([sys.executable, "-m", "trainer_backend", "list"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120).stdout
    ddp = [int(n) for n in re.findall(r"run_id=(\d+) status=\w+ strategy=ddp ", listed) if int(n) in run_ids]
    if not ddp:
        sys.exit(f"error: none of the runs {run_ids} is a DDP run:\n{listed}")
    return ddp[0]


# The README's search, as written there.
README_SEARCH = ("search", "--param", "lr=1e-4:1e-1:log", "--param", "batch_size=32,64,128", "--trials", "8",
                 "--pruner", "median")


def search_page(page, url: str, home: Path) -> None:
    """The README's search, run from the command line to its end, then its Search page down to its charts."""
    from db import make_engine
    from db.searches import list_searches

    finished = [s.id for s in list_searches(make_engine(f"sqlite:///{home / 'parallax.db'}")) if s.status == "finished"]
    if finished:  # a kept --home: its search again
        search_id = finished[0]
    else:
        env = {**os.environ, "PARALLAX_HOME": str(home)}
        env.pop("PARALLAX_DB_URL", None)
        done = subprocess.run([sys.executable, "-m", "trainer_backend", *README_SEARCH], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=RUN_MS / 1000)
        if done.returncode != 0:
            sys.exit(f"error: the README's search failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        print(done.stdout, flush=True)
        search_id = int(re.search(r"search_id=(\d+) status=finished", done.stdout).group(1))
    page.goto(f"{url}/search?search={search_id}")
    page.locator(".st-key-search_parallel .js-plotly-plot .main-svg").first.wait_for(timeout=UI_MS)
    wait_idle(page)
    page.wait_for_timeout(1500)
    last = page.locator(".st-key-search_parallel").bounding_box()
    print(f"search #{search_id} -> {shoot(page, 'search-page.png', bottom_px=last['y'] + last['height'] + 20)}",
          flush=True)


def shoot_all(home: Path, kept_runs: list[int], *, history_only: bool = False,
              search_only: bool = False) -> None:
    from playwright.sync_api import sync_playwright

    server, url = start_dashboard(home)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(UI_MS)
            if not history_only and not search_only:
                sweep = kept_runs or default_sweep(page, url)
                run_page(page, url, ddp_run(home, sweep))
                compare(page, sweep)
            if not search_only:
                history_shots(page, url, logged_history(home))
            if not history_only:
                search_page(page, url, home)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
        cancel_active_runs(home)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--home", type=Path, help="PARALLAX_HOME to use and keep (default: a temporary one)")
    parser.add_argument("--runs", default="", help="shoot these runs of --home (a sweep's) instead of launching a sweep")
    parser.add_argument("--history-only", action="store_true", help="only the Runs search and the banded chart")
    parser.add_argument("--search-only", action="store_true", help="only the README's search and its Search page")
    args = parser.parse_args()
    kept_runs = [int(n) for n in args.runs.split(",") if n.strip()]
    wait_for_chromium()
    if args.home is not None:
        args.home.mkdir(parents=True, exist_ok=True)
        shoot_all(args.home, kept_runs, history_only=args.history_only, search_only=args.search_only)
        return
    with tempfile.TemporaryDirectory(prefix="parallax-screenshots-") as scratch:
        home = Path(scratch) / "parallax_home"
        home.mkdir()
        shoot_all(home, kept_runs, history_only=args.history_only, search_only=args.search_only)


if __name__ == "__main__":
    main()
