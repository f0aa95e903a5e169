"""The Launch page's memory estimate in a real browser, on a machine with two GPUs that NVML
(faked at the edge) reports and torch is told it counts: a batch that does not fit says how much
it needs and what would fit, and a batch that fits says how much is to spare.

    .venv/bin/python -m pytest tests/e2e/test_browser_memory_estimate.py -q
"""

from __future__ import annotations

import os
import re

import pytest

from bench.browser import CHROMIUM, CHROMIUM_ARGS, start_dashboard
from tests.support import ROOT
from tests.nvml_machines import TWO_GPUS, subprocess_env
from tests.e2e.test_browser import ARTIFACTS, UI_MS, VIEWPORT, Visitor

SERVER_START_S = 30
ESTIMATE_MS = 120_000  # resnet50's traces on a busy two-core machine, and the suggestions' too

# Loaded by the dashboard's interpreter before anything else: torch counts the fake GPUs too, as
# the config's "does this GPU exist" check asks it (the same edge as nvml_machines.pin_cuda_count).
GPU_COUNT_HOOK = """
import os
import contract.config as config
config.cuda_device_count = lambda: int(os.environ["FAKE_CUDA_COUNT"])
"""


@pytest.fixture(scope="module")
def gpu_dashboard(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    hook = tmp_path_factory.mktemp("hook")
    (hook / "sitecustomize.py").write_text(GPU_COUNT_HOOK)
    env = subprocess_env(TWO_GPUS, {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1",
                                    "FAKE_CUDA_COUNT": str(len(TWO_GPUS))})
    env["PYTHONPATH"] = os.pathsep.join([str(hook), str(ROOT), env["PYTHONPATH"]])
    env.pop("PARALLAX_DB_URL", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    server = start_dashboard(env, log=home / "streamlit.log", timeout_s=SERVER_START_S)
    try:
        yield server.url
    finally:
        server.stop(grace_s=15)


def test_the_launch_page_says_whether_it_fits_on_each_gpu_and_what_would(gpu_dashboard):
    from playwright.sync_api import expect, sync_playwright

    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: apt-get install -y chromium"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            visitor = Visitor(page, gpu_dashboard)
            page.goto(gpu_dashboard)
            page.get_by_test_id("stBaseButton-primary").filter(has_text="Launch").wait_for(timeout=UI_MS)
            visitor.choose("timm model", "resnet50")
            visitor.set_number("Image size (pixels, square)", 224)
            visitor.set_number("Global batch size", 1024)
            # cuda:0 is the RTX 4090: 24,564 MB, 512 MB used.
            needs = page.get_by_text(re.compile(r"cuda:.?0: needs about \d+ GB, 23 GB free"))
            expect(needs).to_be_visible(timeout=ESTIMATE_MS)
            would = page.get_by_text(re.compile(r"Would fit \(each estimated\): a global batch of \d+"))
            expect(would).to_be_visible(timeout=ESTIMATE_MS)
            assert "fsdp on 2 GPUs" in would.inner_text()
            visitor.wait_idle()
            visitor.shoot("memory-estimate-does-not-fit")
            suggested = int(re.search(r"a global batch of (\d+)", would.inner_text()).group(1))
            assert 512 <= suggested < 1024  # halving fits (about 21 GB): the step above is filled in

            visitor.set_number("Global batch size", suggested)
            fits = page.get_by_text(re.compile(r"cuda:.?0: fits, [\d.]+ GB to spare"))
            expect(fits).to_be_visible(timeout=ESTIMATE_MS)
            expect(page.get_by_text("Would fit (each estimated)")).to_have_count(0)
            visitor.wait_idle()
            visitor.shoot("memory-estimate-fits")
        finally:
            browser.close()
    assert (ARTIFACTS / "memory-estimate-fits.png").exists()
