"""The Run page in a real browser, as a person reads it: a queued run's state said once, never "queued" beside
"running"; the Cancel button whole and asking before it stops hours of training; the loss charts' log-scale
switch; a small checkpoint's size in kB; and which epochs the headline images/s is the mean of.

The dashboard is served as ``make run`` serves it; the runs it watches are launched as the Launch button launches
them (``parallax launch``) and train a model whose steps sleep (tests.plugins.sleeping_model).

    .venv/bin/python -m pytest tests/e2e/test_browser_run_page.py -q
"""

from __future__ import annotations

import os
import re

import pytest

from bench.browser import CHROMIUM, CHROMIUM_ARGS, start_dashboard
from db import dispose_engines, make_engine, store
from db.run_state import ACTIVE_STATUSES
from tests.nvml_machines import subprocess_env
from tests.support import SLEEPER, SLEEPER_ENV, run_cli, run_dir
from trainer_backend.control.lifecycle import cancel

pytestmark = [pytest.mark.processes, pytest.mark.browser]

UI_MS = 60_000  # the server's first page imports torch and timm
LONG_SLEEPER = (*SLEEPER, "--batch-size", "4", "--epochs", "5")  # minutes of sleeping steps


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


def launched(home, *flags: str) -> int:
    result = run_cli("launch", *flags, home=home, timeout=120, env_extra=SLEEPER_ENV)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.split()[0].split("=")[1])


def state_lines(page) -> list[str]:
    """Every line the page and its live frame say about the run's state, besides its status badge."""
    texts = page.locator("[data-testid='stMain']").inner_text().splitlines()
    texts = [t for t in texts if not re.fullmatch(r"\w+ (queued|running)", t.strip())]  # the badge: icon, status
    frame = page.frame_locator("iframe").first.locator("#state")
    texts += [frame.inner_text()] if page.locator("iframe").count() else []
    return [t for t in texts if any(w in t.lower() for w in ("queued", "running", "loading", "waiting"))]


def test_the_run_page_says_a_runs_state_once_and_cancel_asks_first(dashboard):
    from playwright.sync_api import expect, sync_playwright

    url, home, db_url = dashboard
    engine = make_engine(db_url)
    first = launched(home, *LONG_SLEEPER)
    second = launched(home, *LONG_SLEEPER)  # one CPU run at a time: this one waits in the queue
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            page.goto(f"{url}/run?run={second}")
            expect(page.get_by_role("heading", name=f"Run #{second}")).to_be_visible(timeout=UI_MS)
            expect(page.get_by_text("Queued: it starts when its devices are free")).to_be_visible()
            page.wait_for_timeout(3000)  # the live frame has polled the server a few times
            said = state_lines(page)
            assert not [line for line in said if "running" in line.lower()], said
            assert sum("queued" in line.lower() for line in said) == 1, said  # said once, not by every part

            cancel(first, db_url=db_url)  # its devices free up: the queued run starts
            expect(page.get_by_text("Queued: it starts when its devices are free")).to_have_count(0, timeout=UI_MS)
            said = state_lines(page)
            assert not [line for line in said if "queued" in line.lower()], said

            # Cancel: its whole label in sight, and a question before it stops anything.
            button = page.get_by_role("button", name="Cancel run")
            expect(button).to_be_visible()
            label = button.locator("p")
            assert label.evaluate("e => e.scrollWidth <= e.clientWidth"), "the button's label is cut"
            assert label.inner_text() == "Cancel run"
            button.click()
            dialog = page.get_by_role("dialog")
            expect(dialog).to_contain_text("Cancel this run?")
            assert store.get_run(engine, second).status == "running"  # nothing stopped on the first click
            dialog.get_by_role("button", name="Keep it running").click()
            expect(page.get_by_role("dialog")).to_have_count(0)
            assert store.get_run(engine, second).status == "running"
            page.get_by_role("button", name="Cancel run").click()
            page.get_by_role("dialog").get_by_role("button", name=f"Cancel run #{second}").click()
            # The page's state line (the run's log below may say it too)
            expect(page.get_by_test_id("stAlertContentWarning").get_by_text("cancelled by the user")).to_be_visible(
                timeout=UI_MS)
            assert store.get_run(engine, second).status == "cancelled"
        finally:
            browser.close()


def finished_run(engine, home, losses: list[float]) -> int:
    """A completed two-epoch run as Parallax records it, with a tiny model's best checkpoint."""
    run_id = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": "single",
                                       "devices": ["cpu"], "batch_size": 64, "epochs": len(losses)},
                              status="completed")
    for epoch, loss in enumerate(losses, start=1):
        store.log_epoch(engine, run_id, {"epoch": epoch, "train_loss": loss, "val_loss": loss, "train_acc": 0.5,
                                         "val_acc": 0.5, "epoch_time_s": 2.0, "train_time_s": 1.5,
                                         "images_per_s": 100.0 * epoch, "peak_memory_mb": {"cpu": 300.0}})
    folder = run_dir(home, run_id)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "best.pt").write_bytes(b"\0" * 42_000)
    return run_id


def test_a_finished_runs_page_reads_true_and_its_loss_switches_to_a_log_scale(dashboard):
    from playwright.sync_api import expect, sync_playwright

    url, home, db_url = dashboard
    run_id = finished_run(make_engine(db_url), home, [2.3, 1e12])  # it diverged in its second epoch
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            page.goto(f"{url}/run?run={run_id}")
            expect(page.get_by_role("heading", name=f"Run #{run_id}")).to_be_visible(timeout=UI_MS)
            expect(page.get_by_text("Download the best checkpoint (41.0 kB)")).to_be_visible(timeout=UI_MS)
            expect(page.get_by_text("Throughput (images/s, epoch 2; epoch 1 left out: start-up)")).to_be_visible()
            loss = page.locator(".js-plotly-plot", has=page.locator("text.gtitle", has_text="Loss")).first
            expect(loss).to_be_visible()
            assert loss.evaluate("e => e.layout.yaxis.type") == "linear"
            page.get_by_text("Loss on a log scale").click()
            page.wait_for_function(
                "() => [...document.querySelectorAll('.js-plotly-plot')].some("
                "e => /\\bLoss\\b/.test(e.layout.title.text) && e.layout.yaxis.type === 'log')",
                timeout=30_000)
        finally:
            browser.close()
