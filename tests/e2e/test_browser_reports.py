"""The downloaded HTML reports in a real browser, opened from the file with the network off: the
profiler's report and a sweep's report, downloaded from the dashboard's own buttons. Nothing is
clipped (every tick label and axis title inside its chart, every table inside the page) and the
bars are drawn in the colours the dashboard draws the same chart in.

    .venv/bin/python -m pytest tests/e2e/test_browser_reports.py -q
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.browser import CHROMIUM, CHROMIUM_ARGS, start_dashboard
from db import dispose_engines, make_engine, profiles, store
from tests.e2e.test_browser import ARTIFACTS, UI_MS
from tests.nvml_machines import subprocess_env

SERVER_START_S = 30
PAGE = {"width": 1400, "height": 1000}
# Op names as torch names them: long enough that a chart without room for them cuts them short.
OP_NAMES = ("aten::convolution_backward", "aten::native_batch_norm_backward", "aten::cudnn_convolution",
            "aten::max_pool2d_with_indices", "aten::threshold_backward", "Optimizer.step#Adam.step",
            "aten::addmm", "aten::div")

# Every text of a Plotly chart that a reader must see whole, against the chart's own box; every table
# against the page (the window's width, and the page scrolled by none of it).
CLIPPED = """() => {
  const out = [];
  const inside = (r, box) => r.left >= box.left - 1 && r.right <= box.right + 1
                             && r.top >= box.top - 1 && r.bottom <= box.bottom + 1;
  for (const plot of document.querySelectorAll('.js-plotly-plot')) {
    const box = plot.querySelector('.main-svg').getBoundingClientRect();
    for (const text of plot.querySelectorAll('.xtick text, .ytick text, .g-xtitle text, .g-ytitle text, .gtitle')) {
      const r = text.getBoundingClientRect();
      if (r.width > 0 && !inside(r, box)) out.push(`"${text.textContent}" outside its chart`);
    }
  }
  const width = document.documentElement.clientWidth;
  document.querySelectorAll('table').forEach((table, i) => {
    const r = table.getBoundingClientRect();
    if (r.left < 0 || r.right > width) out.push(`table ${i} spans ${r.left}-${r.right} px of ${width}`);
  });
  if (document.documentElement.scrollWidth > width) out.push(`the page is ${document.documentElement.scrollWidth} px wide`);
  return out;
}"""

BAR_COLOURS = """(root) => Array.from(root.querySelectorAll('.trace.bars .point path'))
  .map(path => getComputedStyle(path).fill)"""


def seed(engine) -> tuple[int, int]:
    """A profiled ddp run (two ranks) and a sweep of single, ddp and mp with ddp at 1.8x."""
    run_id = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": "ddp",
                                       "devices": ["cpu", "cpu"], "batch_size": 64, "epochs": 1, "profile": True},
                              status="completed")
    for rank in (0, 1):
        ops = [{"name": name, "calls": 12, "self_cpu_us": 90_000.0 / (i + 1), "cpu_total_us": 120_000.0 / (i + 1),
                "self_device_us": 0.0, "device_total_us": 0.0, "self_cpu_memory_bytes": 2**20 * (4 - i),
                "self_device_memory_bytes": 0} for i, name in enumerate(OP_NAMES)]
        steps = [{"step": s, "data_loading_ms": 1.0, "forward_ms": 10.0, "backward_ms": 20.0,
                  "optimizer_step_ms": 3.0, "communication_ms": 5.0, "other_ms": 2.0, "total_ms": 36.0}
                 for s in (3, 4)]
        profiles.save_profile(engine, run_id, rank, ops=ops, steps=steps, trace_gz=b"", trace_bytes=0)
    sweep_id = store.create_sweep(engine, {"dataset": "digits", "model": "test_resnet", "devices": ["cpu", "cpu"],
                                           "batch_size": 64}, ["single", "ddp", "mp"])
    for strategy, images_per_s in (("single", 100.0), ("ddp", 180.0), ("mp", 90.0)):
        devices = ["cpu"] if strategy == "single" else ["cpu", "cpu"]
        sweep_run = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": strategy,
                                              "devices": devices, "batch_size": 64, "image_size": 32, "amp": "auto",
                                              "epochs": 2}, status="completed", sweep_id=sweep_id)
        for epoch in (1, 2):
            store.log_epoch(engine, sweep_run, {
                "epoch": epoch, "train_loss": 1.0, "val_loss": 1.0, "train_acc": 0.5, "val_acc": 0.45 * epoch,
                "epoch_time_s": 2.0, "train_time_s": 1.8, "images_per_s": images_per_s,
                "peak_memory_mb": {f"rank{r}:cpu": 500.0 for r in range(len(devices))}})
    return run_id, sweep_id


@pytest.fixture(scope="module")
def seeded_dashboard(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    engine = make_engine(f"sqlite:///{home / 'parallax.db'}")
    run_id, sweep_id = seed(engine)
    dispose_engines()
    env = subprocess_env(None, {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1"})
    env.pop("PARALLAX_DB_URL", None)
    server = start_dashboard(env, log=home / "streamlit.log", timeout_s=SERVER_START_S)
    try:
        yield server.url, run_id, sweep_id
    finally:
        server.stop(grace_s=15)


def download(page, label: str, folder: Path) -> Path:
    """Click the download button labelled ``label``; returns where the file was saved."""
    button = page.get_by_test_id("stDownloadButton").filter(has_text=label)
    with page.expect_download(timeout=UI_MS) as info:
        button.click()
    path = folder / info.value.suggested_filename
    info.value.save_as(path)
    return path


def dashboard_bar_colours(page, chart_key: str) -> list[str]:
    chart = page.locator(f".st-key-{chart_key} .js-plotly-plot")
    chart.locator(".trace.bars .point path").first.wait_for(timeout=UI_MS)
    return chart.evaluate(BAR_COLOURS)


def report_bar_colours(page, title_start: str) -> list[str]:
    charts = page.locator(".js-plotly-plot").filter(has=page.locator(".gtitle", has_text=title_start))
    return charts.first.evaluate(BAR_COLOURS)


def test_downloaded_reports_render_whole_offline_in_the_dashboards_colours(seeded_dashboard, tmp_path):
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: apt-get install -y chromium"
    url, run_id, sweep_id = seeded_dashboard
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=PAGE, accept_downloads=True)
            page.set_default_timeout(UI_MS)
            page.goto(f"{url}/profiler?run={run_id}")
            dashboard_top_ops = dashboard_bar_colours(page, "top_ops")
            profile_report = download(page, "HTML report", tmp_path)
            page.goto(f"{url}/sweep?sweep={sweep_id}")
            dashboard_speedup = dashboard_bar_colours(page, "sweep_scaling")
            sweep_report = download(page, "report (HTML)", tmp_path)

            offline = browser.new_context(viewport=PAGE, offline=True)
            reader = offline.new_page()
            for report, title, dashboard in ((profile_report, "Top 8 ops by self time (rank 0)", dashboard_top_ops),
                                             (sweep_report, "Speedup over one device", dashboard_speedup)):
                reader.goto(report.as_uri())
                reader.locator(".js-plotly-plot .main-svg").first.wait_for(timeout=UI_MS)
                ARTIFACTS.mkdir(exist_ok=True)
                reader.screenshot(path=str(ARTIFACTS / f"report-{report.stem}.png"), full_page=True)
                assert reader.evaluate(CLIPPED) == [], report.name
                assert report_bar_colours(reader, title) == dashboard, report.name
            # The sweep report's speedup axis reads 1.5, not .5 (its ticks are whole).
            ticks = reader.locator(".js-plotly-plot").first.locator(".ytick text").evaluate_all(
                "texts => texts.map(text => text.textContent)")
            assert "1.5" in ticks, ticks
        finally:
            browser.close()
