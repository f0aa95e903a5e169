"""A run sent to Slurm from the Launch form, in a real browser, onto the real test cluster (two slurmd on this
machine, tests/slurm_cluster.py): the form's Slurm section lists the cluster's partitions and takes the default
strategy, single, as it takes ddp; DDP over two nodes, one CPU process each, trains the sleeping test model; the
Run page shows the job's line from squeue and the sbatch script kept with the run, and the run completes with
every epoch.

    .venv/bin/python -m pytest tests/e2e/test_browser_slurm.py -q
"""

from __future__ import annotations

import os
import re

import pytest

from bench.browser import CHROMIUM, CHROMIUM_ARGS, start_dashboard, wait_idle
from db import dispose_engines, make_engine, store
from tests.nvml_machines import subprocess_env
from tests.support import ROOT
from trainer_backend.control.slurm_job import slurm_info

pytestmark = [pytest.mark.processes, pytest.mark.browser]

UI_MS = 60_000  # the server's first page imports torch and timm
RUN_DONE_MS = 300_000  # a job's processes import torch and timm on a shared 2-core machine
SLEEPER = "tests.plugins.sleeping_model:SleepsEachStep"  # importable on the nodes (the job's PYTHONPATH); its
# class names num_classes and in_chans, so the dataset sizes it


@pytest.fixture
def dashboard(slurm_cluster, tmp_path):
    """The dashboard with the cluster's SLURM_CONF, on a home of its own; what the test leaves queued is
    cancelled."""
    home = tmp_path / "home"
    home.mkdir()
    env = subprocess_env(None, {**os.environ, **slurm_cluster.env, "PARALLAX_HOME": str(home),
                                "PYTHONUNBUFFERED": "1", "PARALLAX_MODEL_ROOTS": str(ROOT / "tests" / "plugins")})
    env.pop("PARALLAX_DB_URL", None)
    server = start_dashboard(env, log=home / "streamlit.log")
    try:
        yield server.url, home
    finally:
        server.stop(grace_s=15)
        slurm_cluster.cancel_all()
        dispose_engines()


def test_a_two_node_ddp_run_launched_from_the_form_runs_on_slurm_and_completes(dashboard, slurm_cluster):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect, sync_playwright

    url, home = dashboard
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2000})
            page.goto(url)
            launch_button = page.get_by_test_id("stBaseButton-primary").filter(has_text="Launch")
            launch_button.wait_for(timeout=UI_MS)
            wait_idle(page, timeout_ms=UI_MS)

            page.get_by_test_id("stRadio").get_by_text("Your own", exact=True).click()
            wait_idle(page, timeout_ms=UI_MS)
            own = page.get_by_label("Your model", exact=True)
            own.fill(SLEEPER)
            own.press("Enter")
            wait_idle(page, timeout_ms=UI_MS)
            epochs = page.get_by_label("Epochs", exact=True)
            epochs.fill("2")
            epochs.press("Enter")
            wait_idle(page, timeout_ms=UI_MS)

            page.get_by_test_id("stExpander").get_by_text("Slurm", exact=True).click()
            where = page.get_by_test_id("stSelectbox").filter(has_text="Where the run goes")
            expect(where).to_be_visible()
            wait_idle(page, timeout_ms=UI_MS)
            for _ in range(3):  # a rerun that lands as the list opens (a check's answer) closes it again
                where.click()
                try:
                    page.get_by_role("option", name="a Slurm cluster (sbatch)").click(timeout=10_000)
                    break
                except PlaywrightTimeout:
                    wait_idle(page, timeout_ms=UI_MS)
            else:
                raise AssertionError("the Where selectbox never listed 'a Slurm cluster (sbatch)'")
            wait_idle(page, timeout_ms=UI_MS)
            # sinfo's partition of the test cluster, both nodes idle
            expect(page.get_by_text(re.compile(r"Slurm partitions: \S+ \(default\) 2 of 2 nodes free"))).to_be_visible(
                timeout=UI_MS)
            # single, the form's strategy so far, goes to Slurm too: a one-task job (was refused here)
            expect(page.get_by_text("Fix the values marked in red to launch.")).to_have_count(0)
            expect(page.get_by_text(re.compile("where slurm is not allowed"))).to_have_count(0)
            expect(launch_button).to_be_enabled(timeout=UI_MS)
            page.get_by_test_id("stRadio").get_by_text("ddp", exact=True).click()
            wait_idle(page, timeout_ms=UI_MS)
            nodes = page.get_by_label("Nodes", exact=True)
            nodes.fill("2")
            nodes.press("Enter")
            wait_idle(page, timeout_ms=UI_MS)
            expect(page.get_by_text("Fix the values marked in red to launch.")).to_have_count(0)
            expect(launch_button).to_be_enabled(timeout=UI_MS)
            launch_button.click()
            page.wait_for_url(re.compile(r"/run\?run=\d+"), timeout=UI_MS)
            run_id = int(re.search(r"run=(\d+)", page.url).group(1))

            engine = make_engine(f"sqlite:///{home / 'parallax.db'}")
            run = store.get_run(engine, run_id)
            job_id = slurm_info(run)["job_id"]
            assert (run.config["where"], run.config["strategy"], run.config["slurm_nodes"]) == ("slurm", "ddp", 2)
            expect(page.get_by_role("heading", name=f"Run #{run_id}")).to_be_visible(timeout=UI_MS)
            expect(page.get_by_text(re.compile(rf"^Slurm job {job_id}: "))).to_be_visible(timeout=UI_MS)
            page.get_by_test_id("stExpander").filter(has_text="Slurm job script").get_by_text(
                "Slurm job script").click()
            script = page.get_by_test_id("stCode").filter(has_text=f"#SBATCH --job-name=parallax-{run_id}")
            expect(script).to_be_visible(timeout=UI_MS)
            expect(script).to_contain_text("#SBATCH --nodes=2")

            badge = page.get_by_role("paragraph").filter(has=page.get_by_role("img", name="check_circle icon"))
            expect(badge).to_have_text(re.compile(r"completed$"), timeout=RUN_DONE_MS)
            expect(page.get_by_text("Epoch 2 of 2 done")).to_be_visible(timeout=UI_MS)
        finally:
            browser.close()
    run = store.get_run(engine, run_id)
    assert run.status == "completed" and run.nodes == 2 and run.world_size == 2, run.error
    assert [row["epoch"] for row in store.read_epoch_metrics(engine, [run_id])] == [1, 2]
