"""Nothing cut at 1,400 px, in a real browser: the Runs table shows accuracy, images/s and tags
beside a run whose dataset is a long folder path; the Launch page's "Will it fit?" tables (one run
and a sweep) and the Run page's "Time per rank" table do not scroll sideways; no chart's axis title
runs into its title or out of the chart (the CPU and memory charts above all).

    .venv/bin/python -m pytest tests/e2e/test_browser_layout.py -q
"""

from __future__ import annotations

import os

import pytest

from bench.browser import CHROMIUM, CHROMIUM_ARGS, start_dashboard
from db import dispose_engines, make_engine, store
from tests.e2e.test_browser import ARTIFACTS, UI_MS
from tests.nvml_machines import subprocess_env
from tests.support import run_cli

SERVER_START_S = 30
# 1,400 px wide; tall enough for the Run page whole (Streamlit scrolls inside its own container).
PAGE = {"width": 1400, "height": 5000}
LONG_PATH = "/home/someone/datasets/satellite-imagery-2026/eurosat-rgb-64px-train-balanced-v3"

# A table (Streamlit's data grid) cut at the right scrolls sideways: its scroller is wider inside than out.
CUT_TABLES = """() => Array.from(document.querySelectorAll('[data-testid=stDataFrame]')).flatMap(table => {
  const scroller = table.querySelector('.dvn-scroller');
  return scroller && scroller.scrollWidth > scroller.clientWidth + 1
    ? [`a table ${scroller.scrollWidth} px wide in ${scroller.clientWidth} px`] : [];
})"""
# The column headers a data grid draws (it draws only the columns in view).
SHOWN_COLUMNS = """(table) => Array.from(table.querySelectorAll('table [role=columnheader]')).map(h => h.textContent)"""
# Every chart: its titles and tick labels inside it, and the axis titles clear of the chart's title.
CHART_PROBLEMS = """() => {
  const out = [];
  const inside = (r, box) => r.left >= box.left - 1 && r.right <= box.right + 1
                             && r.top >= box.top - 1 && r.bottom <= box.bottom + 1;
  const overlap = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  for (const plot of document.querySelectorAll('.js-plotly-plot')) {
    const box = plot.querySelector('.main-svg').getBoundingClientRect();
    const title = plot.querySelector('.gtitle');
    const name = title ? title.textContent : '(untitled)';
    for (const text of plot.querySelectorAll('.xtick text, .ytick text, .g-xtitle text, .g-ytitle text, .gtitle')) {
      const r = text.getBoundingClientRect();
      if (r.width > 0 && !inside(r, box)) out.push(`${name}: "${text.textContent}" outside the chart`);
    }
    if (!title) continue;
    for (const axis of plot.querySelectorAll('.g-xtitle text, .g-ytitle text')) {
      if (overlap(axis.getBoundingClientRect(), title.getBoundingClientRect()))
        out.push(`${name}: axis title "${axis.textContent}" runs into the chart's title`);
    }
  }
  return out;
}"""


@pytest.fixture(scope="module")
def dashboard_with_runs(tmp_path_factory):
    """A real two-process DDP run (times per rank, CPU and memory samples) and a recorded run on a
    folder with a long path; the dashboard serving them."""
    home = tmp_path_factory.mktemp("home")
    done = run_cli("run", "--model", "test_resnet", "--image-size", "16", "--epochs", "2", "--strategy", "ddp",
                   "--devices", "cpu,cpu", "--tags", "baseline,fp32", home=home, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    ddp_id = int(done.stdout.strip().splitlines()[-1].split()[0].split("=")[1])
    engine = make_engine(f"sqlite:///{home / 'parallax.db'}")
    long_id = store.create_run(engine, {"dataset": LONG_PATH, "model": "resnet18", "strategy": "single",
                                        "devices": ["cpu"], "batch_size": 64, "epochs": 2, "tags": ["long-path"]},
                               status="completed")
    for epoch in (1, 2):
        store.log_epoch(engine, long_id, {"epoch": epoch, "train_loss": 1.0, "val_loss": 1.0, "train_acc": 0.5,
                                          "val_acc": 0.4 * epoch, "epoch_time_s": 2.0, "train_time_s": 1.8,
                                          "images_per_s": 150.0})
    dispose_engines()
    env = subprocess_env(None, {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1"})
    env.pop("PARALLAX_DB_URL", None)
    server = start_dashboard(env, log=home / "streamlit.log", timeout_s=SERVER_START_S)
    try:
        yield server.url, ddp_id
    finally:
        server.stop(grace_s=15)


def settle(page) -> None:
    page.wait_for_timeout(500)
    page.get_by_test_id("stStatusWidget").wait_for(state="detached", timeout=UI_MS)
    page.wait_for_timeout(1500)  # the grids and charts lay themselves out after the rerun


def test_nothing_is_cut_at_1400_px(dashboard_with_runs):
    from playwright.sync_api import expect, sync_playwright

    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: apt-get install -y chromium"
    url, ddp_id = dashboard_with_runs
    ARTIFACTS.mkdir(exist_ok=True)
    problems = []  # every page's, then one assertion: a failure names all that is cut
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=PAGE)
            page.set_default_timeout(UI_MS)

            page.goto(f"{url}/runs")
            runs_table = page.get_by_test_id("stDataFrame").first
            runs_table.wait_for(timeout=UI_MS)
            settle(page)
            page.screenshot(path=str(ARTIFACTS / "layout-runs.png"))
            shown = runs_table.evaluate(SHOWN_COLUMNS)
            problems += [f"Runs: column {column!r} is off screen (shown: {shown})" for column in ("best val acc", "tags")
                         if column not in shown]
            if not any("images/s" in column for column in shown):
                problems.append(f"Runs: images/s is off screen (shown: {shown})")

            page.goto(f"{url}/run?run={ddp_id}")
            expect(page.get_by_role("heading", name="Time per rank")).to_be_visible(timeout=UI_MS)
            page.locator(".js-plotly-plot .gtitle", has_text="Memory").first.wait_for(timeout=UI_MS)
            settle(page)
            page.screenshot(path=str(ARTIFACTS / "layout-run.png"))
            problems += [f"Run: {problem}" for problem in page.evaluate(CUT_TABLES) + page.evaluate(CHART_PROBLEMS)]

            page.goto(url)
            expect(page.get_by_text("Will it fit?")).to_be_visible(timeout=UI_MS)
            settle(page)
            page.screenshot(path=str(ARTIFACTS / "layout-launch.png"))
            problems += [f"Launch: {problem}" for problem in page.evaluate(CUT_TABLES)]
            page.get_by_test_id("stRadio").get_by_text("Compare strategies", exact=True).click()
            expect(page.get_by_text("Estimated peak memory of each strategy's fullest device")).to_be_visible(
                timeout=UI_MS)
            settle(page)
            page.screenshot(path=str(ARTIFACTS / "layout-launch-sweep.png"))
            problems += [f"Launch, sweep: {problem}" for problem in page.evaluate(CUT_TABLES)]
        finally:
            browser.close()
    assert problems == [], "\n".join(problems)
