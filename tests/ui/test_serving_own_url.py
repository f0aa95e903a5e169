"""Links point where the dashboard is: a dashboard started on a port of its own (``parallax ui --port``, as
``make run PORT=…`` starts it) records its address, and the message a real receiver gets when a run ends
links there; Settings shows a saved hook with its port.

    .venv/bin/python -m pytest tests/ui/test_serving_own_url.py -q
"""

from __future__ import annotations

import os

import pytest

from bench.browser import CHROMIUM, CHROMIUM_ARGS, start_dashboard
from db import dispose_engines, make_engine, notify, store
from tests.db.test_notify import SECRET, Receiver
from tests.nvml_machines import subprocess_env
from tests.support import run_cli

pytestmark = [pytest.mark.processes, pytest.mark.browser]

UI_MS = 60_000  # a server's first page imports torch


def test_a_runs_message_links_to_the_port_the_dashboard_was_started_on(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    home = tmp_path / "home"
    home.mkdir()
    env = subprocess_env(None, {**os.environ, "PARALLAX_HOME": str(home)})
    for name in ("PARALLAX_DB_URL", notify.DASHBOARD_URL_ENV, notify.WEBHOOKS_ENV):
        env.pop(name, None)
    receiver = Receiver()
    server = start_dashboard(env, log=home / "streamlit.log")  # a free port, never 8501
    try:
        port = server.url.rsplit(":", 1)[1]
        assert port != "8501"
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1200})
                page.goto(f"{server.url}/settings")
                expect(page.get_by_text(f"{server.url}/run?run=N")).to_be_visible(timeout=UI_MS)
                page.get_by_label("Replace the webhooks kept here").fill(receiver.url)
                page.get_by_role("button", name="Save").click()
                hook_port = receiver.server.server_address[1]
                expect(page.get_by_text(f"Kept here: http://127.0.0.1:{hook_port}/…")).to_be_visible()
                kept = page.get_by_text(f"Kept here: http://127.0.0.1:{hook_port}/…")
                assert SECRET not in kept.inner_text()

                engine = make_engine(f"sqlite:///{home / 'parallax.db'}")
                run_id = store.create_run(engine, {"dataset": "digits", "model": "resnet18", "strategy": "single",
                                                   "devices": ["cpu"]}, status="queued")
                for name in ("PARALLAX_DB_URL", notify.DASHBOARD_URL_ENV, notify.WEBHOOKS_ENV):
                    os.environ.pop(name, None)  # run_cli's process: the home's own settings alone
                cancelled = run_cli("cancel", str(run_id), home=home, timeout=120)
                assert cancelled.returncode == 0, cancelled.stderr
                [post] = receiver.wait_for(1)
                link = post["body"]["run"]["link"]
                assert link == f"{server.url}/run?run={run_id}" and post["body"]["text"].endswith(link)
                page.goto(link)  # the link takes a person to the run
                expect(page.get_by_role("heading", name=f"Run #{run_id}")).to_be_visible(timeout=UI_MS)
            finally:
                browser.close()
    finally:
        server.stop(grace_s=15)
        receiver.close()
        dispose_engines()

