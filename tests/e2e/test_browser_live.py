"""The Run page is live in a real browser: a run's per-step loss and images/s are drawn, point by point, before
its first epoch ends, and the chart grows without a reload; the dashboard shows no "Deploy" button.

The dashboard is served as ``make run`` serves it; the run is launched as the Launch button launches it
(``python -m trainer_backend launch``) and trains a model whose steps sleep (tests.plugins.sleeping_model),
so that its first epoch lasts long enough to be watched on a loaded machine.

    .venv/bin/python -m pytest tests/e2e/test_browser_live.py -q
"""

from __future__ import annotations

import os
import time

import pytest

from bench.browser import CHROMIUM, CHROMIUM_ARGS, start_dashboard
from tests.nvml_machines import subprocess_env
from tests.support import SLEEPER_ENV, run_cli
from db import dispose_engines, make_engine, store
from db.run_state import ACTIVE_STATUSES
from trainer_backend.control.lifecycle import cancel

pytestmark = [pytest.mark.processes, pytest.mark.browser]

UI_MS = 60_000  # the server's first page imports torch and timm
# Batches of 4 of digits' ~1,440 training images: about 360 steps of STEP_S (0.05 s) asleep, so epoch 1
# lasts 18 s and more.
RUN_FLAGS = ("--dataset", "digits", "--model", "parallax_sleeps_each_step", "--batch-size", "4", "--epochs", "2",
             "--image-size", "8")
POINTS = ".live-chart#train_loss .scatterlayer .trace path.point"


@pytest.fixture
def dashboard(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = subprocess_env(None, {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1", **SLEEPER_ENV})
    env.pop("PARALLAX_DB_URL", None)
    server = start_dashboard(env, log=home / "streamlit.log")
    db_url = f"sqlite:///{home / 'parallax.db'}"
    try:
        yield server.url, home, db_url
    finally:
        server.stop(grace_s=15)
        for run in store.list_runs(make_engine(db_url)):
            if run.status in ACTIVE_STATUSES:
                cancel(run.id, db_url=db_url)
        dispose_engines()


def test_a_running_runs_page_draws_per_step_points_before_the_first_epoch_ends(dashboard):
    from playwright.sync_api import expect, sync_playwright

    url, home, db_url = dashboard
    engine = make_engine(db_url)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2000})
            page.goto(url)
            expect(page.get_by_role("heading", name="Launch a run")).to_be_visible(timeout=UI_MS)
            # The toolbar is drawn (its menu), without Streamlit's developer options: no Deploy button.
            expect(page.get_by_test_id("stMainMenu")).to_be_visible(timeout=UI_MS)
            expect(page.get_by_test_id("stAppDeployButton")).to_have_count(0)
            expect(page.get_by_role("button", name="Deploy")).to_have_count(0)

            launched = run_cli("launch", *RUN_FLAGS, home=home, timeout=120, env_extra=SLEEPER_ENV)
            assert launched.returncode == 0, launched.stdout + launched.stderr
            run_id = int(launched.stdout.split("run_id=")[1].split()[0])
            page.goto(f"{url}/run?run={run_id}")
            expect(page.get_by_role("heading", name=f"Run #{run_id}")).to_be_visible(timeout=UI_MS)

            live = page.frame_locator("iframe").first
            points = live.locator(POINTS)
            expect(points.first).to_be_attached(timeout=UI_MS)
            first_seen = points.count()
            assert store.read_epoch_metrics(engine, [run_id]) == [], "epoch 1 ended before a step was drawn"
            # The chart grows in place, without a reload of the page: more points within a few polls of
            # the next recorded ones (written a few seconds' worth at a time).
            deadline = time.monotonic() + 30
            while points.count() <= first_seen:
                assert time.monotonic() < deadline, f"the live chart stayed at {first_seen} points for 30 s"
                page.wait_for_timeout(500)
            expect(live.locator("#state")).to_contain_text("Live: step")
            expect(live.locator(".live-chart#images_per_s .scatterlayer .trace")).to_have_count(1)  # beside the loss
            # The feed answers only links a page signed.
            forged = page.request.get(f"{url}/_parallax/live/{run_id}?expires=9999999999&sig={'0' * 64}")
            assert forged.status == 403 and "not made by this dashboard" in forged.text()
        finally:
            browser.close()
