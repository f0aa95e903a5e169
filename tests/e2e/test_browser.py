"""The dashboard in a real browser, used as a new user would: launch a DDP run on two CPU
processes from the form, watch it complete with its charts, launch a single-device run, and
compare the two to read the speedup; and launch a sweep of four strategies and read its scaling
report. Screenshots of every step go to ``test-artifacts/``.

    .venv/bin/python -m pytest tests/e2e/test_browser.py -q

Needs Debian's chromium (``apt-get install -y chromium``) and the ``playwright`` package. Without
them this test fails: it never skips.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from bench.browser import CHROMIUM, CHROMIUM_ARGS, EPOCH_CHART_KEYS, EPOCH_CHARTS, start_dashboard, wait_idle
from tests.support import ROOT, run_dir
from tests.nvml_machines import subprocess_env
from db import dispose_engines, make_engine, store
from db.run_state import ACTIVE_STATUSES
from trainer_backend.control.lifecycle import cancel

ARTIFACTS = ROOT / "test-artifacts"
# Tall enough that each page fits whole: Streamlit scrolls inside its own container, so a
# "full page" screenshot would only hold the visible part.
VIEWPORT = {"width": 1400, "height": 2000}
SERVER_START_S = 30
RUN_DONE_MS = 150_000
UI_MS = 60_000  # the first render of a page imports torch and timm


@pytest.fixture(scope="module")
def dashboard_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def dashboard(dashboard_home):
    """``streamlit run app.py`` on a free port with its own PARALLAX_HOME; yields its URL. One server
    for the module's tests, as one user would keep it open (its start and first imports are paid
    once); the first test's first request is the server's first. Runs still active at the end are
    cancelled: they are detached and would outlive the tests."""
    parallax_home, db_url = dashboard_home, f"sqlite:///{dashboard_home / 'parallax.db'}"
    # A CPU machine, whatever GPUs this one has: the form's defaults (and the screenshots) depend on it.
    env = subprocess_env(None, {**os.environ, "PARALLAX_HOME": str(parallax_home), "PYTHONUNBUFFERED": "1"})
    env.pop("PARALLAX_DB_URL", None)
    server = start_dashboard(env, log=parallax_home / "streamlit.log", timeout_s=SERVER_START_S)
    try:
        yield server.url
    finally:
        server.stop(grace_s=15)
        engine = make_engine(db_url)
        for run in store.list_runs(engine):
            if run.status in ACTIVE_STATUSES:
                cancel(run.id, db_url=db_url)
        dispose_engines()


class Visitor:
    """A user at the browser: clicks and types like one, and keeps numbered screenshots."""

    def __init__(self, page, url: str):
        self.page, self.url = page, url
        self.started = time.monotonic()

    def shoot(self, name: str) -> None:
        ARTIFACTS.mkdir(exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"))
        # Where the time goes (seen with pytest -s).
        print(f"{time.monotonic() - self.started:6.1f} s  {name}.png")

    def wait_idle(self) -> None:
        """Until Streamlit has finished the current rerun (its 'Running…' widget stays away)."""
        wait_idle(self.page, timeout_ms=UI_MS)

    def choose(self, label: str, option: str) -> None:
        """Pick ``option`` in the selectbox labelled ``label`` by typing, as a user searches."""
        self.page.get_by_test_id("stSelectbox").filter(has_text=label).click()
        self.page.keyboard.type(option)
        self.page.get_by_role("option", name=option, exact=True).click()
        self.wait_idle()

    def set_number(self, label: str, value: int) -> None:
        field = self.page.get_by_label(label, exact=True)
        field.fill(str(value))
        field.press("Enter")
        field.blur()  # a focused field is drawn with a red ring that reads like an error
        self.wait_idle()

    def launch_from_form(self, *, strategy: str, epochs: int, shot: str) -> int:
        """Fill the Launch form (model test_resnet, the rest as given), launch; returns the run id."""
        from playwright.sync_api import expect

        page = self.page
        page.goto(self.url)
        launch_button = page.get_by_test_id("stBaseButton-primary").filter(has_text="Launch")
        launch_button.wait_for(timeout=UI_MS)
        self.choose("timm model", "test_resnet")
        # Always picked: the form starts from this session's last launch, which may be another strategy.
        page.get_by_test_id("stRadio").get_by_text(strategy, exact=True).click()
        self.wait_idle()
        self.set_number("Epochs", epochs)
        per_device = {"single": "One device takes all 128 images per step.",
                      "ddp": "Global batch: each of the 2 processes takes 64 images per step."}[strategy]
        # The form has settled on these values: on the server's first page that waits for torch and timm.
        expect(page.get_by_text(per_device)).to_be_visible(timeout=UI_MS)
        self.shoot(shot)
        launch_button.click()
        page.wait_for_url(re.compile(r"/run\?run=\d+"), timeout=UI_MS)
        return int(re.search(r"run=(\d+)", page.url).group(1))

    def watch_until_completed(self, run_id: int, epochs: int, shot: str) -> None:
        from playwright.sync_api import expect

        page = self.page
        expect(page.get_by_role("heading", name=f"Run #{run_id}")).to_be_visible(timeout=UI_MS)
        # The page refreshes itself every 2 s while the run is active: no reload needed.
        badge = page.get_by_role("paragraph").filter(has=page.get_by_role("img", name="check_circle icon"))
        expect(badge).to_have_text(re.compile(r"completed$"), timeout=RUN_DONE_MS)
        expect(page.locator(EPOCH_CHARTS)).to_have_count(len(EPOCH_CHART_KEYS), timeout=UI_MS)
        expect(page.get_by_text(f"Epoch {epochs} of {epochs} done")).to_be_visible()
        expect(page.get_by_role("link", name=re.compile("Download the best checkpoint"))).to_be_visible()
        self.wait_idle()
        self.shoot(shot)

    def compare(self, run_ids: list[int]) -> None:
        """Open Compare from the sidebar and pick the runs by typing their numbers."""
        page = self.page
        page.get_by_test_id("stSidebarNav").get_by_role("link", name="Compare").click()
        picker = page.get_by_test_id("stMultiSelect").filter(has_text="Runs to compare")
        picker.wait_for(timeout=UI_MS)
        for run_id in run_ids:
            picker.click()
            page.keyboard.type(f"#{run_id} ")
            page.keyboard.press("Enter")
            self.wait_idle()
        page.keyboard.press("Escape")


def test_new_user_launches_ddp_and_single_runs_and_compares_their_speed(dashboard, dashboard_home):
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: pip install playwright (it is in requirements-test.txt)")
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: apt-get install -y chromium"

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(UI_MS)
            user = Visitor(page, dashboard)

            # A bookmarked link as the very first request to the server still gets the whole app.
            page.goto(f"{dashboard}/compare")
            expect(page.get_by_role("heading", name="Compare runs")).to_be_visible(timeout=UI_MS)
            expect(page.get_by_test_id("stSidebarNav").get_by_role("link")).to_have_text(  # icon name, then title
                [re.compile(f"{title}$") for title in ("Launch", "Run", "Runs", "Compare", "Sweeps", "Search", "Profiler",
                                                                     "Settings")])

            ddp_id = user.launch_from_form(strategy="ddp", epochs=2, shot="01-launch-ddp-form")
            user.watch_until_completed(ddp_id, 2, "02-ddp-run-completed")
            notes = page.get_by_test_id("stExpander").filter(has_text="Notes (")  # Parallax's notes, below the numbers
            notes.get_by_text("Notes (").click()
            expect(notes.get_by_text("DDP on CPU: 2 processes on gloo")).to_be_visible(timeout=UI_MS)
            # The checkpoint is a link the server streams (it may open a tab of its own for the download).
            downloads = []

            def keep(download) -> None:
                downloads.append(download)

            page.on("download", keep)
            page.context.on("page", lambda popup: popup.on("download", keep))
            page.get_by_role("link", name=re.compile("Download the best checkpoint")).click()
            deadline = time.monotonic() + 30
            while not downloads:
                assert time.monotonic() < deadline, "clicking the checkpoint link downloaded nothing"
                page.wait_for_timeout(200)
            saved = run_dir(dashboard_home, ddp_id) / "best.pt"
            assert downloads[0].suggested_filename == f"parallax-run-{ddp_id}-best.pt"
            assert Path(downloads[0].path()).read_bytes() == saved.read_bytes()

            # Two epochs: throughput leaves out the first, which carries the start-up costs.
            single_id = user.launch_from_form(strategy="single", epochs=2, shot="03-launch-single-form")
            user.watch_until_completed(single_id, 2, "04-single-run-completed")

            user.compare([ddp_id, single_id])
            speedup = page.get_by_test_id("stMetric").filter(has_text=f"Speedup of #{ddp_id} ddp×2 test_resnet")
            expect(speedup).to_be_visible(timeout=UI_MS)
            value = speedup.get_by_test_id("stMetricValue").inner_text()
            assert re.fullmatch(r"\d+\.\d\d×", value), value
            expect(page.get_by_text("not like for like")).to_have_count(0)
            for key in ("speedup", "efficiency", "overlay"):  # the scaling view and the epoch curves
                expect(page.locator(f".st-key-{key} .stPlotlyChart")).to_have_count(1)
            user.wait_idle()
            user.shoot("05-compare-speedup")
        finally:
            browser.close()


def test_new_user_sweeps_four_strategies_and_reads_the_scaling_report(dashboard):
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: pip install playwright (it is in requirements-test.txt)")
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: apt-get install -y chromium"

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(UI_MS)
            user = Visitor(page, dashboard)

            page.goto(dashboard)
            page.get_by_test_id("stBaseButton-primary").filter(has_text="Launch").wait_for(timeout=UI_MS)
            page.get_by_test_id("stRadio").get_by_text("Compare strategies", exact=True).click()
            user.wait_idle()
            picked = page.get_by_test_id("stMultiSelect").filter(has_text="Strategies to compare")
            for strategy in ("single", "ddp", "mp", "pp"):
                expect(picked.get_by_text(strategy, exact=True)).to_be_visible()
            expect(page.get_by_label("CPU devices (processes or model stages)", exact=True)).to_have_value("2")
            user.choose("timm model", "test_resnet")
            user.set_number("Epochs", 1)
            # :visible: Streamlit keeps the replaced one-run button hidden in the page for a while.
            launch_button = page.locator("[data-testid=stBaseButton-primary]:visible",
                                         has_text="Launch the sweep (4 runs)")
            user.shoot("06-launch-sweep-form")
            expect(launch_button).to_be_enabled()
            launch_button.click()
            page.wait_for_url(re.compile(r"/sweep\?sweep=\d+"), timeout=UI_MS)
            expect(page.get_by_role("heading", name="Sweeps")).to_be_visible(timeout=UI_MS)
            user.shoot("07-sweep-running")

            # The page refreshes itself while any run of the sweep is queued or running.
            done = page.get_by_role("paragraph").filter(has=page.get_by_role("img", name="check_circle icon"))
            expect(done).to_have_count(4, timeout=4 * RUN_DONE_MS)
            advice = page.get_by_test_id("stAlert").filter(has_text="Fastest:")
            expect(advice).to_be_visible(timeout=UI_MS)
            report = page.get_by_test_id("stTable").first  # the report; the scaling forecast follows it
            expect(report.get_by_role("columnheader", name="speedup (×)")).to_be_visible()
            expect(report.get_by_role("row")).to_have_count(5)  # the header and one row per strategy
            expect(page.get_by_test_id("stDownloadButton").filter(has_text="report (HTML)")).to_be_visible()
            user.wait_idle()
            user.shoot("08-sweep-report")
        finally:
            browser.close()
