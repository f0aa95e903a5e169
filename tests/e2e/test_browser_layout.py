"""Nothing cut at 1,400 px, in a real browser: the Runs table shows accuracy, images/s and tags
beside a run whose dataset is a long folder path; the Launch page's "Will it fit?" tables (one run
and a sweep) and the Run page's "Time per rank" table do not scroll sideways; no chart's axis title
runs into its title or out of the chart (the CPU and memory charts above all). The Run page of a CPU
run leads with its numbers, at 1,400 px and narrower: no note above the first metric, no metric cut,
the run's notes gathered below them, each once, and charts whose y axis starts at zero.

    .venv/bin/python -m pytest tests/e2e/test_browser_layout.py -q
"""

from __future__ import annotations

import os

import pytest

from bench.browser import CHROMIUM, CHROMIUM_ARGS, start_dashboard, wait_idle
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


# Every element of a metric whose text is wider than its box (cut, with or without an ellipsis).
CUT_METRICS = """() => Array.from(document.querySelectorAll('[data-testid=stMetric]')).flatMap(metric =>
  Array.from(metric.querySelectorAll('*')).filter(e => e.scrollWidth > e.clientWidth + 1).map(e =>
    `metric "${metric.textContent}": "${e.textContent}" is ${e.scrollWidth} px wide in ${e.clientWidth} px`))"""
# Every note (st.info, st.warning, st.error) and the Notes section, with where it stands against the metrics.
NOTES_AGAINST_METRICS = """() => {
  const metrics = Array.from(document.querySelectorAll('[data-testid=stMetric]'));
  const top = Math.min(...metrics.map(m => m.getBoundingClientRect().top));
  const bottom = Math.max(...metrics.map(m => m.getBoundingClientRect().bottom));
  const notes = Array.from(document.querySelectorAll('[data-testid=stAlert], [data-testid=stExpander]'))
    .filter(e => e.getBoundingClientRect().height > 0);
  return {metrics: metrics.length, above: notes.filter(e => e.getBoundingClientRect().top < top).map(e => e.textContent),
          notes_below: notes.filter(e => e.getBoundingClientRect().top >= bottom && e.textContent.includes('Notes ('))
                            .map(e => e.textContent)};
}"""
# The first y tick label of each chart of the Run page's epochs, by its title.
FIRST_Y_TICKS = """() => Object.fromEntries(Array.from(document.querySelectorAll('.js-plotly-plot')).map(plot => [
  (plot.querySelector('.gtitle') || {}).textContent,
  (Array.from(plot.querySelectorAll('.ytick text')).map(t => t.textContent)[0] || null)]))"""
RUN_PAGE_WIDTHS = (1400, 900)


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
    wait_idle(page, timeout_ms=UI_MS)
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


def test_the_run_page_of_a_cpu_run_leads_with_its_numbers(dashboard_with_runs):
    from playwright.sync_api import expect, sync_playwright

    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: apt-get install -y chromium"
    url, ddp_id = dashboard_with_runs
    ARTIFACTS.mkdir(exist_ok=True)
    problems = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            for width in RUN_PAGE_WIDTHS:
                page = browser.new_page(viewport={"width": width, "height": 2400})
                page.set_default_timeout(UI_MS)
                page.goto(f"{url}/run?run={ddp_id}")
                page.locator(".js-plotly-plot .gtitle", has_text="Peak memory per device").wait_for(timeout=UI_MS)
                settle(page)
                page.screenshot(path=str(ARTIFACTS / f"run-page-{width}.png"))
                placed = page.evaluate(NOTES_AGAINST_METRICS)
                assert placed["metrics"] >= 4, placed  # accuracy, best accuracy, images/s, MFU, training time
                problems += [f"{width} px: above the first metric: {text!r}" for text in placed["above"]]
                if len(placed["notes_below"]) != 1:
                    problems.append(f"{width} px: not one Notes section below the metrics: {placed['notes_below']}")
                problems += [f"{width} px: {problem}" for problem in page.evaluate(CUT_METRICS)]
                ticks = page.evaluate(FIRST_Y_TICKS)
                problems += [f"{width} px: the {title!r} chart's y axis starts at {tick}, not 0"
                             for title, tick in ticks.items()
                             if title in ("Loss", "Throughput", "Epoch time") or str(title).startswith("Peak memory")
                             if tick != "0"]
                page.close()

            page = browser.new_page(viewport=PAGE)
            page.goto(f"{url}/run?run={ddp_id}")
            # Drawn and settled first: a click while the page's first run still redraws it can fall between frames.
            page.locator(".js-plotly-plot .gtitle", has_text="Peak memory per device").wait_for(timeout=UI_MS)
            settle(page)
            notes = page.get_by_test_id("stExpander").filter(has_text="Notes (")
            notes.get_by_text("Notes (").click()
            listed = notes.get_by_test_id("stMarkdownContainer")
            expect(listed.filter(has_text="DDP on CPU: 2 processes on gloo")).to_have_count(1, timeout=UI_MS)
            wait_idle(page, timeout_ms=UI_MS)  # every note drawn, not those the run has sent so far
            lines = [line for line in listed.all_text_contents() if not line.startswith("Notes (")]  # not its label
            energy = [line for line in lines if "energy" in line.lower()]
            assert len(energy) <= 1, energy  # said once
            assert len(lines) == len(set(lines)) >= 3, lines
            page.screenshot(path=str(ARTIFACTS / "run-page-notes.png"))
        finally:
            browser.close()
    assert problems == [], "\n".join(problems)
