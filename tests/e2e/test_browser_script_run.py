"""A script logging through ``import parallax`` seen in a real browser: its Run page draws a metric the
script starts logging while the page is open, without a reload, and Compare puts it beside a launched
run's own loss, matched by name; a script that logged 10,000 metric names gets its page drawn, the
first metrics charted and any other found by the search box.

    .venv/bin/python -m pytest tests/e2e/test_browser_script_run.py -q
"""

from __future__ import annotations

import os
import time

import pytest

from bench.browser import CHROMIUM, CHROMIUM_ARGS, start_dashboard
from db import dispose_engines, make_engine, series, store
from tests.nvml_machines import subprocess_env
from tests.parallax import scripts
from tests.parallax.scripts import finish_script, kill_group, run_script, start_script, wait_for_line, write_script

pytestmark = [pytest.mark.processes, pytest.mark.browser]

UI_MS = 60_000  # the server's first page imports torch and timm


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


def launched_run(engine) -> int:
    """A finished launched run with its per-step loss, as the engine records them."""
    config = {"dataset": "digits", "model": "resnet18", "strategy": "single", "devices": ["cpu"], "batch_size": 64,
              "epochs": 1}
    run_id = store.create_run(engine, config, status="completed")
    series.add_steps(engine, run_id, [{"epoch": 1, "step": step, "t_s": step * 0.2, "train_loss": 2.5 / step,
                                       "images_per_s": 300.0, "lr": 0.1} for step in range(1, 31)])
    return run_id


def title(page, text: str):
    """A chart's title as drawn (a chart being replaced by its next draw may linger hidden beside it)."""
    return page.locator("text.gtitle >> visible=true", has_text=text)


def test_a_running_scripts_page_updates_live_and_compare_puts_it_beside_a_launched_run(dashboard, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    url, home = dashboard
    engine = make_engine(f"sqlite:///{home / 'parallax.db'}")
    other = launched_run(engine)
    folder = tmp_path / "script"
    folder.mkdir()
    script = write_script(folder, "train.py", scripts.WATCHED)
    process = start_script([str(script)], cwd=folder, env_extra={"PARALLAX_HOME": str(home)})
    try:
        wait_for_line(process, "ready")
        run_id = next(run.id for run in store.list_runs(engine) if run.id != other)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 2000})
                page.goto(f"{url}/run?run={run_id}")
                expect(page.get_by_role("heading", name=f"Run #{run_id}")).to_be_visible(timeout=UI_MS)
                expect(title(page, "train/loss")).to_be_visible(timeout=UI_MS)
                expect(title(page, "val/acc")).to_have_count(0)
                (folder / "more").touch()  # the script logs a second metric from now on
                expect(title(page, "val/acc")).to_be_visible(timeout=30_000)  # drawn by the page's own tick

                page.goto(f"{url}/compare?runs={other},{run_id}")
                expect(page.get_by_role("heading", name="Logged metrics (script runs)")).to_be_visible(timeout=UI_MS)
                loss = page.locator(".js-plotly-plot", has=page.locator("text.gtitle", has_text="train/loss")).last
                expect(loss.locator(".legendtext", has_text=f"#{other}")).to_be_visible(timeout=UI_MS)
                expect(loss.locator(".legendtext", has_text=f"#{run_id}")).to_be_visible()
            finally:
                browser.close()
        (folder / "stop").touch()
        code, _, err = finish_script(process, 60)
        assert code == 0, err
    finally:
        kill_group(process)
    assert store.get_run(engine, run_id).status == "completed"


def test_a_run_of_ten_thousand_metric_names_draws_its_first_charts_and_finds_any_other(dashboard, tmp_path):
    """Was: the page read and charted all 10,000 metrics, and had not drawn after two minutes. The bound here
    only says it draws (a minute, on a busy two-core machine); the time it takes is reported, not judged."""
    from playwright.sync_api import expect, sync_playwright

    url, home = dashboard
    folder = tmp_path / "script"
    folder.mkdir()
    code, out, err = run_script([str(write_script(folder, "wide.py", scripts.WIDE))], cwd=folder,
                                env_extra={"PARALLAX_HOME": str(home)}, timeout_s=300)
    assert code == 0, err
    run_id = int(out.split("run_id")[1].split()[0])
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2000})
            page.goto(f"{url}/run?run={run_id}")  # the server's first page: it imports torch and timm
            expect(page.get_by_role("heading", name=f"Run #{run_id}")).to_be_visible(timeout=UI_MS)
            expect(title(page, "layer000/unit00")).to_be_visible(timeout=UI_MS)
            started = time.monotonic()
            page.goto(f"{url}/run?run={run_id}")
            expect(title(page, "layer000/unit11")).to_be_visible(timeout=60_000)
            drawn_s = time.monotonic() - started
            expect(title(page, "layer000/unit12")).to_have_count(0)
            search = page.get_by_label("Search the 10,000 logged metric names")
            search.fill("layer042 unit07")
            search.press("Enter")
            expect(title(page, "layer042/unit07")).to_be_visible(timeout=30_000)
            expect(title(page, "layer000/unit00")).to_have_count(0)
        except Exception:
            page.screenshot(path=str(tmp_path / "wide-run-page.png"), full_page=True)
            raise
        finally:
            browser.close()
    print(f"Run page of 10,000 metric names: first charts drawn {drawn_s:.1f} s after navigation")
