"""The Launch form's "your own model" in a real browser: typing the path of a model file in the model folder
shows the child process's verdict under the fields and leaves Launch enabled; a file whose forward raises
shows its one line and disables Launch. Prints how long each verdict took to appear after Enter.

    .venv/bin/python -m pytest tests/e2e/test_browser_own_model.py -q -s
"""

from __future__ import annotations

import os
import time

import pytest

from bench.browser import CHROMIUM, CHROMIUM_ARGS, start_dashboard
from tests.e2e.test_browser import ARTIFACTS, UI_MS, VIEWPORT, Visitor
from tests.nvml_machines import subprocess_env
from tests.pages.test_launch_own_model import BROKEN, GOOD

SERVER_START_S = 30
VERDICT_MS = 120_000  # the child imports torch: seconds on a busy two-core machine


@pytest.fixture(scope="module")
def cpu_dashboard(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    (home / "models").mkdir()  # the model folder the dashboard takes your own models from by default
    env = subprocess_env(None, {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1"})
    env.pop("PARALLAX_DB_URL", None)
    env.pop("PARALLAX_MODEL_ROOTS", None)
    server = start_dashboard(env, log=home / "streamlit.log", timeout_s=SERVER_START_S)
    try:
        yield server.url, home / "models"
    finally:
        server.stop(grace_s=15)


def type_into(visitor: Visitor, label: str, text: str) -> float:
    """Type ``text`` into the field labelled ``label`` as a user would and press Enter; the time of Enter."""
    field = visitor.page.get_by_label(label, exact=True)
    field.click()
    field.press("Control+a")
    visitor.page.keyboard.type(text)
    field.press("Enter")
    return time.monotonic()


def test_typing_a_model_path_shows_the_checks_verdict(cpu_dashboard):
    from playwright.sync_api import expect, sync_playwright

    url, models = cpu_dashboard
    good, broken = models / "mynet.py", models / "broken.py"
    good.write_text(GOOD)
    broken.write_text(BROKEN)
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: apt-get install -y chromium"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            visitor = Visitor(page, url)
            page.goto(url)
            launch = page.get_by_test_id("stBaseButton-primary").filter(has_text="Launch")
            launch.wait_for(timeout=UI_MS)
            page.get_by_test_id("stRadio").get_by_text("Your own", exact=True).click()
            visitor.wait_idle()
            type_into(visitor, "Model arguments (a JSON object)", '{"width": 4}')
            visitor.wait_idle()
            typed = type_into(visitor, "Your model", f"{good}:Net")
            expect(page.get_by_text("takes num_classes and in_chans")).to_be_visible(timeout=VERDICT_MS)
            good_s = time.monotonic() - typed
            visitor.wait_idle()
            expect(launch).to_be_enabled()
            visitor.shoot("own-model-good")

            typed = type_into(visitor, "Your model", f"{broken}:Net")
            expect(page.get_by_text("raises in forward")).to_be_visible(timeout=VERDICT_MS)
            broken_s = time.monotonic() - typed
            visitor.wait_idle()
            expect(page.get_by_text("undefined_scale")).to_be_visible()
            expect(launch).to_be_disabled()
            visitor.shoot("own-model-broken")

            typed = type_into(visitor, "Your model", f"{good}:Net")  # seen before: the cached verdict
            expect(page.get_by_text("takes num_classes and in_chans")).to_be_visible(timeout=VERDICT_MS)
            cached_s = time.monotonic() - typed
            print(f"verdict after Enter: good {good_s:.1f} s, broken {broken_s:.1f} s, cached {cached_s:.1f} s")
            (ARTIFACTS / "own-model-latency.txt").write_text(
                f"good {good_s:.2f} s\nbroken {broken_s:.2f} s\ncached {cached_s:.2f} s\n")
        finally:
            browser.close()
