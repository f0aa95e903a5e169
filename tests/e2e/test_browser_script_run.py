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
    """A finished launched run with its per-step loss, as Parallax records them."""
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
                live = page.frame_locator("iframe").first  # a running script's charts: their own document
                expect(title(live, "train/loss")).to_be_visible(timeout=UI_MS)
                expect(title(live, "val/acc")).to_have_count(0)
                (folder / "more").touch()  # the script logs a second metric from now on
                # A new name: the page's progress tick redraws it, with a document charting both.
                expect(title(page.frame_locator("iframe").first, "val/acc")).to_be_visible(timeout=30_000)

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


SUMMARISED = """
    import pathlib, time
    import parallax
    run = parallax.init(project="tests", name="summarised", config={"lr": 0.1, "batch_size": 32})
    for step in range(130):
        parallax.log({"train/loss": 2.0 / (step + 1)}, step=step)
        if step % 26 == 25:
            parallax.log({"val/acc": 0.5 + step / 1000}, step=step)
    run.summary["best_val_acc"] = 0.93
    print("ready", run.run_id, flush=True)
    while not pathlib.Path("stop").exists():
        time.sleep(0.1)
    parallax.finish()
"""


def sweep_of_identical_runs(engine) -> list[int]:
    """A finished sweep's single and ddp runs, as Parallax records them: the same work on 1 and 2 devices."""
    from contract.config import RunConfig

    sweep_id = store.create_sweep(engine, {"devices": ["cpu", "cpu"]}, ["single", "ddp"])
    run_ids = []
    for strategy, devices in (("single", "cpu"), ("ddp", "cpu,cpu")):
        config = RunConfig(model="test_resnet", strategy=strategy, devices=devices, batch_size=64, epochs=2).to_dict()
        run_id = store.create_run(engine, config, status="completed", sweep_id=sweep_id)
        for epoch in (1, 2):
            store.log_epoch(engine, run_id, {"epoch": epoch, "train_loss": 1.0, "val_loss": 1.0, "train_acc": 0.5,
                                             "val_acc": 0.4 * epoch, "epoch_time_s": 2.0, "train_time_s": 1.5,
                                             "images_per_s": 100.0, "peak_memory_mb": {"cpu": 300.0}})
        run_ids.append(run_id)
    return run_ids


def test_a_script_run_reads_as_a_run_on_its_page_and_beside_a_sweep_on_compare(dashboard, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    url, home = dashboard
    engine = make_engine(f"sqlite:///{home / 'parallax.db'}")
    sweep = sweep_of_identical_runs(engine)
    folder = tmp_path / "script"
    folder.mkdir()
    process = start_script([str(write_script(folder, "train.py", SUMMARISED))], cwd=folder,
                           env_extra={"PARALLAX_HOME": str(home)})
    try:
        wait_for_line(process, "ready")
        run_id = next(run.id for run in store.list_runs(engine) if run.id not in sweep)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 2000})
                page.goto(f"{url}/run?run={run_id}")
                expect(page.get_by_text("Logging: step 129 so far.")).to_be_visible(timeout=UI_MS)
                expect(page.get_by_text("Epoch 0 of")).to_have_count(0)
                (folder / "stop").touch()
                code, _, err = finish_script(process, 60)
                assert code == 0, err
                page.reload()
                expect(page.get_by_text("Logged up to step 129.")).to_be_visible(timeout=UI_MS)
                expect(title(page, "train/loss")).to_be_visible(timeout=UI_MS)
                expect(page.get_by_text("No per-step points")).to_have_count(0)

                page.goto(f"{url}/compare?runs={sweep[0]},{sweep[1]},{run_id}")
                expect(page.get_by_role("heading", name="Curves")).to_be_visible(timeout=UI_MS)
                mapped = page.get_by_text("Script runs on these charts:")
                expect(mapped).to_be_visible(timeout=UI_MS)
                assert "val/acc as val_acc" in mapped.inner_text().replace("\u2060", "").replace("\\", "")
                expect(page.get_by_text("not like for like")).to_have_count(0)  # the sweep's runs are the same work
                accuracy = page.locator(".js-plotly-plot",
                                        has=page.locator("text.gtitle", has_text="Validation accuracy")).first
                for each in (*sweep, run_id):
                    expect(accuracy.locator(".legendtext", has_text=f"#{each}")).to_be_visible(timeout=UI_MS)
            finally:
                browser.close()
    finally:
        kill_group(process)
def test_a_one_step_spike_among_a_million_steps_is_on_the_chart(dashboard):
    """A script's series of 1,000,000 steps, values near 1 and one step of 100: the Run page's chart, as the
    browser holds it, reaches 100 (the band of the spike's bucket) while its line of last values stays near 1."""
    from playwright.sync_api import sync_playwright

    from db import script_metrics

    url, home = dashboard
    engine = make_engine(f"sqlite:///{home / 'parallax.db'}")
    run_id = script_metrics.create_script_run(engine, name="long", project="p", config={}, key="script:long")
    steps = 1_000_000
    for start in range(0, steps, 250_000):
        part = range(start, start + 250_000)
        script_metrics.add_columns(engine, run_id, {"loss": (part, [0.0] * len(part),
                                                             [100.0 if s == 765_432 else 1.0 + (s % 5) * 0.01
                                                              for s in part])})
    store.set_status(engine, run_id, "completed")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1400})
            page.goto(f"{url}/run?run={run_id}")
            title(page, "loss").wait_for(timeout=UI_MS)
            drawn = page.evaluate("""() => {
                const chart = [...document.querySelectorAll('.js-plotly-plot')].find(
                    c => c._fullLayout && (c._fullLayout.title.text || '').includes('loss<br>'));
                const trace = name => chart._fullData.find(t => t.name === name);  // as plotly.js decoded it
                const values = name => Array.from(trace(name).y).filter(v => v !== null && !Number.isNaN(v));
                return {band: Math.max(...values('#RUN max')), line: Math.max(...values('#RUN')),
                        points: trace('#RUN').y.length,
                        top: chart._fullLayout.yaxis.range[1]};
            }""".replace("RUN", str(run_id)))
        finally:
            browser.close()
    assert drawn["band"] == 100.0 and drawn["top"] >= 100.0  # the spike's value, on the chart and its axis
    assert drawn["line"] < 2.0 and 500 <= drawn["points"] <= 1000  # about a thousand buckets for a million steps


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
