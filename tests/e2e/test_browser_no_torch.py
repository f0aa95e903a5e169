"""The dashboard's server never imports torch, served as `make run` serves it: once Launch (its form complete,
every model listed, the parameter count and the memory estimate shown), Runs, Compare (two runs) and Sweeps
have each been opened in chromium, the server maps no file of torch or torchvision (a process that imported
torch maps its compiled extension and libraries; timm, pure Python, imports torch). What the form needs from
them came from the backend's inspector, a child process of the server, which does.

    .venv/bin/python -m pytest tests/e2e/test_browser_no_torch.py -q
"""

from __future__ import annotations

import os

import pytest

from bench.browser import CHROMIUM, CHROMIUM_ARGS, start_dashboard, wait_idle
from bench.machine import child_pids, torch_files_mapped
from db import dispose_engines, make_engine, store
from tests.e2e.test_browser import UI_MS
from tests.nvml_machines import subprocess_env

SERVER_START_S = 30


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Two recorded runs in one sweep, and the dashboard serving them."""
    home = tmp_path_factory.mktemp("home")
    engine = make_engine(f"sqlite:///{home / 'parallax.db'}")
    sweep_id = store.create_sweep(engine, {"dataset": "digits", "model": "test_resnet", "batch_size": 64, "epochs": 1},
                                  ["single", "ddp"])
    for strategy, devices in (("single", ["cpu"]), ("ddp", ["cpu", "cpu"])):
        run_id = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": strategy,
                                           "devices": devices, "batch_size": 64, "epochs": 1},
                                  status="completed", sweep_id=sweep_id)
        store.log_epoch(engine, run_id, {"epoch": 1, "train_loss": 1.0, "val_loss": 1.0, "train_acc": 0.5,
                                         "val_acc": 0.5, "epoch_time_s": 2.0, "train_time_s": 1.8,
                                         "images_per_s": 150.0})
    dispose_engines()
    env = subprocess_env(None, {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1"})
    env.pop("PARALLAX_DB_URL", None)
    server = start_dashboard(env, log=home / "streamlit.log", timeout_s=SERVER_START_S)
    try:
        yield server
    finally:
        server.stop(grace_s=15)


def test_the_server_never_imports_torch_after_launch_runs_compare_and_sweeps(served):
    from playwright.sync_api import expect, sync_playwright

    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: apt-get install -y chromium"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            page.set_default_timeout(UI_MS)
            page.goto(served.url)
            expect(page.get_by_text("11.2 M parameters for 10 classes")).to_be_visible(timeout=UI_MS)
            expect(page.get_by_text("Will it fit?")).to_be_visible(timeout=UI_MS)
            wait_idle(page, timeout_ms=UI_MS)
            for path, heading in (("/runs", "Runs"), ("/compare?runs=1,2", "Compare runs"), ("/sweep?sweep=1", "Sweeps")):
                page.goto(f"{served.url}{path}")
                expect(page.get_by_role("heading", name=heading)).to_be_visible(timeout=UI_MS)
                wait_idle(page, timeout_ms=UI_MS)
            expect(page.get_by_text("Fastest:")).to_be_visible(timeout=UI_MS)  # the sweep's report was drawn
        finally:
            browser.close()
    assert torch_files_mapped(served.process.pid) == []
    # The inspector answered the form: it is the server's child, and it has torch.
    assert any(torch_files_mapped(pid) for pid in child_pids(served.process.pid))
