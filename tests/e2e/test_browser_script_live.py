"""A running script's Run page in a real browser: its charts grow while the script logs, from the page's own
document asking for the values after the last step it holds (ui/script_feed.py), with no rerun of the page and
no second whole read; once the script ends the page draws its final charts itself.

The dashboard is served as ``make run`` serves it; the script is a user's, logging through ``import parallax``.

    .venv/bin/python -m pytest tests/e2e/test_browser_script_live.py -q
"""

from __future__ import annotations

import os
import time

import pytest

from bench.browser import CHROMIUM, CHROMIUM_ARGS, start_dashboard
from db import dispose_engines, make_engine, store
from tests.nvml_machines import subprocess_env
from tests.parallax.scripts import finish_script, kill_group, start_script, wait_for_line, write_script

pytestmark = [pytest.mark.processes, pytest.mark.browser]

UI_MS = 60_000
# About a hundred values a second of one name, until told to stop.
LOGGING = """
    import time
    from pathlib import Path
    import parallax
    here = Path(__file__).parent
    run = parallax.init(project="tests", name="logging", config={"lr": 0.1})
    step = 0
    while not (here / "stop").exists():
        parallax.log({"train/loss": 1.0 + 1.0 / (step + 1)}, step=step)
        if step == 50:
            print("ready", run.run_id, flush=True)
        step += 1
        time.sleep(0.01)
    parallax.finish()
"""
# Values on the live loss chart: the whole draw's line and the raw values appended after it.
DRAWN = "chart => chart.data ? chart.data[2].x.length + chart.data[3].x.length : 0"


@pytest.fixture
def dashboard(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = subprocess_env(None, {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1"})
    env.pop("PARALLAX_DB_URL", None)
    server = start_dashboard(env, log=home / "streamlit.log")
    try:
        yield server.url, home
    finally:
        server.stop(grace_s=15)
        dispose_engines()


def test_a_running_scripts_chart_grows_from_its_own_document_without_page_reruns(dashboard, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    url, home = dashboard
    engine = make_engine(f"sqlite:///{home / 'parallax.db'}")
    folder = tmp_path / "script"
    folder.mkdir()
    process = start_script([str(write_script(folder, "train.py", LOGGING))], cwd=folder,
                           env_extra={"PARALLAX_HOME": str(home)})
    try:
        wait_for_line(process, "ready")
        (run,) = store.list_runs(engine)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 2000})
                page.goto(f"{url}/run?run={run.id}")
                expect(page.get_by_role("heading", name=f"Run #{run.id}")).to_be_visible(timeout=UI_MS)
                live = page.frame_locator("iframe").first
                chart = live.locator(".live-chart").first
                expect(chart.locator("text.gtitle", has_text="train/loss")).to_be_visible(timeout=UI_MS)
                frame = next(f for f in page.frames if f != page.main_frame and f.evaluate("() => !!window.bornAt"))
                born_at = frame.evaluate("() => window.bornAt")
                # Several growths within a few seconds: faster than any of the page's timers (its progress ticks
                # every 10 s), so each is the document's own ask, not a rerun.
                counts, deadline = [chart.evaluate(DRAWN)], time.monotonic() + 8
                while time.monotonic() < deadline:
                    page.wait_for_timeout(500)
                    if (count := chart.evaluate(DRAWN)) > counts[-1]:
                        counts.append(count)
                assert len(counts) >= 4, f"the live chart grew only {counts} in 8 s"
                assert frame.evaluate("() => window.bornAt") == born_at  # the same document, never reloaded
                assert frame.evaluate("() => window.wholeDraws") == 1  # read whole once; only new values since
                # Every value appended once: the chart's steps rise strictly.
                steps = chart.evaluate("chart => chart.data[2].x.concat(chart.data[3].x.slice(1))")
                assert steps == sorted(set(steps)) and steps[-1] >= 50
                # The route answers only links a page signed.
                forged = page.request.get(f"{url}/_parallax/script-live/{run.id}?expires=9999999999&sig={'0' * 64}"
                                          "&name=train/loss")
                assert forged.status == 403 and "not made by this dashboard" in forged.text()

                (folder / "stop").touch()
                code, _, err = finish_script(process, 60)
                assert code == 0, err
                # Ended: the page draws the final chart itself, at its next progress tick.
                expect(page.locator(".stPlotlyChart text.gtitle", has_text="train/loss")).to_be_visible(timeout=30_000)
                expect(page.locator("iframe")).to_have_count(0)
            finally:
                browser.close()
    finally:
        kill_group(process)
