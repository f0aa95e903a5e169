"""The Search page in a real browser, served as ``make run`` serves it: a finished search's answer, its charts
(best so far, importance, parallel coordinates) drawn, "Launch with these settings" opening the Launch form with
the best trial's settings, and the downloaded HTML report whole offline.

    .venv/bin/python -m pytest tests/e2e/test_browser_search.py -q
"""

from __future__ import annotations

import os

import pytest

from bench.browser import CHROMIUM, CHROMIUM_ARGS, start_dashboard
from db import dispose_engines, make_engine
from db.search_study import forget_storages
from tests.e2e.test_browser import ARTIFACTS, UI_MS
from tests.e2e.test_browser_reports import CLIPPED, PAGE, SERVER_START_S, download
from tests.nvml_machines import subprocess_env
from tests.pages.test_search import a_finished_search


@pytest.fixture(scope="module")
def dashboard_with_a_search(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    url = f"sqlite:///{home / 'parallax.db'}"
    search_id = a_finished_search(make_engine(url), url)
    forget_storages()
    dispose_engines()
    env = subprocess_env(None, {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1"})
    env.pop("PARALLAX_DB_URL", None)
    server = start_dashboard(env, log=home / "streamlit.log", timeout_s=SERVER_START_S)
    try:
        yield server.url, search_id
    finally:
        server.stop(grace_s=15)


def test_the_search_page_draws_its_answer_and_charts_and_launches_the_best_settings(dashboard_with_a_search,
                                                                                   tmp_path):
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: apt-get install -y chromium"
    url, search_id = dashboard_with_a_search
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=PAGE, accept_downloads=True)
            page.set_default_timeout(UI_MS)
            page.goto(f"{url}/search?search={search_id}")
            page.get_by_text("Best: trial 1 (lr=0.003, batch_size=64), best validation accuracy 90.00%.").wait_for()
            for key in ("search_history", "search_importance", "search_parallel"):
                page.locator(f".st-key-{key} .js-plotly-plot .main-svg").first.wait_for()
            assert page.locator(".st-key-search_history .js-plotly-plot .scatter").count() >= 2  # trials, best so far
            assert page.locator(".st-key-search_parallel .parcoords").count() == 1
            assert page.locator(".st-key-search_importance .trace.bars .point path").count() == 2  # lr, batch_size
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "search-page.png"), full_page=True)
            report = download(page, "report (HTML)", tmp_path)

            page.get_by_role("button", name="Launch with these settings").click()
            page.get_by_text(f"The form holds search #{search_id}'s best settings (trial 1)").wait_for()
            page.get_by_role("heading", name="Launch a run").wait_for()  # the Launch page, the dashboard's first

            offline = browser.new_context(viewport=PAGE, offline=True)
            reader = offline.new_page()
            reader.set_default_timeout(UI_MS)  # as every page here: a 4 MB page of inline plotly.js to load
            reader.goto(report.as_uri())
            reader.locator(".js-plotly-plot .main-svg").first.wait_for(timeout=UI_MS)
            assert "Best: trial 1 (lr=0.003, batch_size=64)" in reader.inner_text("body")
            assert reader.evaluate(CLIPPED) == []
        finally:
            browser.close()
