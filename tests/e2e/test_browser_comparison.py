"""A comparison in a real browser. One colour per run: on Compare every chart that draws runs (speedup,
efficiency, the epoch curves, the per-step series) shows each run in one colour under one name, and the Sweeps
page's speedup chart shows the same runs in the same colours; the colours are read from the charts as Plotly drew
them (after its defaults and Streamlit's theme were applied), as a person sees them. And the Sweeps page names no
verdict while a run is still training, says what it waits for, and names the fastest by itself once it has ended.

    .venv/bin/python -m pytest tests/e2e/test_browser_comparison.py -q
"""

from __future__ import annotations

import os
import re

import pytest

from bench.browser import CHROMIUM, CHROMIUM_ARGS, start_dashboard
from db import dispose_engines, make_engine, series, store
from reports.scaling import run_label
from tests.e2e.test_browser import UI_MS, VIEWPORT, Visitor
from tests.nvml_machines import subprocess_env

SERVER_START_S = 30
COMPARE_CHARTS = ("speedup", "efficiency", "overlay", "series_overlay")
# Each drawn trace's name and colour(s): a bar trace gives one colour per bar, named by its x labels.
READ_COLOURS = """element => element.querySelector('.js-plotly-plot')._fullData.flatMap(trace => {
    if (trace.type === 'bar') {
        const colours = Array.isArray(trace.marker.color) ? trace.marker.color : trace.x.map(() => trace.marker.color);
        return trace.x.map((x, i) => [String(x), colours[i]]);
    }
    const colour = trace.mode.includes('lines') ? trace.line.color : trace.marker.color;
    return [[trace.name, colour]];
})"""


def add_run(engine, sweep_id: int, strategy: str, images_per_s: float, n_devices: int, status: str = "completed",
            epochs: int = 2) -> int:
    run_id = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": strategy,
                                       "devices": ["cpu"] * n_devices, "batch_size": 64, "image_size": 32,
                                       "amp": "auto", "epochs": 2}, status=status, sweep_id=sweep_id)
    for epoch in range(1, epochs + 1):
        store.log_epoch(engine, run_id, {"epoch": epoch, "train_loss": 1.0 / epoch, "val_loss": 1.0, "train_acc": 0.5,
                                         "val_acc": 0.3 * epoch, "epoch_time_s": 2.0, "train_time_s": 1.8,
                                         "images_per_s": images_per_s, "peak_memory_mb": {"cpu": 500.0}})
    series.add_steps(engine, run_id, [{"epoch": 1 + step // 5, "step": step, "t_s": 0.4 * step, "train_loss": 1.0,
                                       "images_per_s": images_per_s, "lr": 1e-3} for step in range(10)])
    return run_id


@pytest.fixture(scope="module")
def sweep_dashboard(tmp_path_factory):
    """A sweep of three runs, recorded as its supervisor would, and the dashboard on it."""
    home = tmp_path_factory.mktemp("home")
    engine = make_engine(f"sqlite:///{home / 'parallax.db'}")
    sweep_id = store.create_sweep(engine, {"devices": ["cpu", "cpu"]}, ["single", "ddp", "fsdp"])
    runs = {"single": add_run(engine, sweep_id, "single", 100.0, 1), "ddp": add_run(engine, sweep_id, "ddp", 150.0, 2),
            "fsdp": add_run(engine, sweep_id, "fsdp", 120.0, 2)}
    dispose_engines()
    env = subprocess_env(None, {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1"})
    env.pop("PARALLAX_DB_URL", None)
    server = start_dashboard(env, log=home / "streamlit.log", timeout_s=SERVER_START_S)
    try:
        yield server.url, sweep_id, runs, home
    finally:
        server.stop(grace_s=15)


def colours_in(page, key: str) -> dict[str, str]:
    """Each run's colour in the chart with streamlit key ``key``; fails if a run shows two."""
    chart = page.locator(f".st-key-{key} .stPlotlyChart")
    chart.wait_for(timeout=UI_MS)
    pairs = page.locator(f".st-key-{key}").evaluate(READ_COLOURS)
    found: dict[str, str] = {}
    for name, colour in pairs:
        if name.startswith("#"):  # a run; not the ideal line
            assert found.setdefault(name, colour) == colour, f"{name} in two colours in {key}"
    return found


def test_a_run_keeps_its_colour_and_name_in_every_chart_and_page(sweep_dashboard):
    from playwright.sync_api import sync_playwright

    url, sweep_id, runs, _ = sweep_dashboard
    labels = {run_id: run_label(run_id, strategy, 1 if strategy == "single" else 2, "test_resnet")
              for strategy, run_id in runs.items()}
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: apt-get install -y chromium"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(UI_MS)
            visitor = Visitor(page, url)
            # Picked in an order of their own: the colours follow the runs, not the picking.
            picked = [runs["fsdp"], runs["single"], runs["ddp"]]
            page.goto(f"{url}/compare?runs={','.join(map(str, picked))}")
            for key in COMPARE_CHARTS:
                page.locator(f".st-key-{key} .stPlotlyChart").wait_for(timeout=UI_MS)
            visitor.wait_idle()
            visitor.shoot("compare-run-colours")
            charts = {key: colours_in(page, key) for key in COMPARE_CHARTS}
            assert all(set(colours) == set(labels.values()) for colours in charts.values()), charts
            colour_of = charts["overlay"]
            assert len(set(colour_of.values())) == 3, colour_of  # three runs, three colours
            for key, colours in charts.items():
                assert colours == {name: colour_of[name] for name in colours}, (key, colours, colour_of)

            page.goto(f"{url}/sweep?sweep={sweep_id}")
            visitor.wait_idle()
            on_sweep = colours_in(page, "sweep_scaling")
            assert set(on_sweep) == set(labels.values())
            assert on_sweep == colour_of, (on_sweep, colour_of)
        finally:
            browser.close()


def test_the_sweeps_page_waits_for_its_runs_and_names_the_fastest_when_they_end(sweep_dashboard):
    from playwright.sync_api import expect, sync_playwright

    url, _, _, home = sweep_dashboard
    engine = make_engine(f"sqlite:///{home / 'parallax.db'}")
    sweep_id = store.create_sweep(engine, {"devices": ["cpu", "cpu"]}, ["single", "ddp"])
    add_run(engine, sweep_id, "single", 100.0, 1)
    ddp_id = add_run(engine, sweep_id, "ddp", 80.0, 2, status="running", epochs=1)  # its first epoch only
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(UI_MS)
            visitor = Visitor(page, url)
            page.goto(f"{url}/sweep?sweep={sweep_id}")
            alerts = page.get_by_test_id("stAlert")
            expect(alerts.filter(has_text=f"Waiting for #{ddp_id} ddp×2 test_resnet (running) to finish")).to_be_visible(
                timeout=UI_MS)
            expect(page.get_by_text("the forecast is fitted on the sweep's finished runs")).to_be_visible()
            expect(alerts.filter(has_text=re.compile("Fastest:"))).to_have_count(0)  # has_text alone ignores case
            visitor.wait_idle()
            visitor.shoot("sweep-waiting-for-its-runs")

            # The run ends, as its supervisor would record it: the open page redraws by itself (its 10 s timer).
            store.log_epoch(engine, ddp_id, {"epoch": 2, "images_per_s": 180.0, "epoch_time_s": 2.0,
                                             "train_time_s": 1.8, "val_acc": 0.6, "peak_memory_mb": {"cpu": 500.0}})
            store.set_status(engine, ddp_id, "completed")
            expect(alerts.filter(has_text="Fastest: DDP")).to_be_visible(timeout=30_000)
            expect(alerts.filter(has_text="Waiting for")).to_have_count(0)
            visitor.wait_idle()
            visitor.shoot("sweep-verdict-once-its-runs-ended")
        finally:
            browser.close()
            dispose_engines()
