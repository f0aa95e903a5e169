"""Live pages cost little to watch: on a timer tick the Run page rebuilds its status and progress,
never its charts, and rebuilds the charts once when an epoch lands (at most every
``live.EPOCH_REDRAW_S``) or at once when the status changes.

A tick is what the browser asks for every few seconds: a rerun of the page's fragment alone.
AppTest has no call for that, so ``tick`` asks its script runner for one, as the browser would.

    .venv/bin/python -m pytest tests/ui/test_live_page.py -q
"""

from __future__ import annotations

import functools
import os
import socket
from unittest import mock

import pytest
from streamlit.runtime.scriptrunner_utils.script_requests import RerunData
from streamlit.testing.v1 import AppTest
from streamlit.testing.v1 import app_test, local_script_runner

from tests.support import ROOT
from db import run_state, store
from reports import charts
from ui import live

APP = str(ROOT / "app.py")
TIMEOUT_S = 90


def log_epoch(engine, run_id: int, epoch: int) -> None:
    store.log_epoch(engine, run_id, {"epoch": epoch, "train_loss": 1 / epoch, "val_loss": 1.1 / epoch,
                                     "train_acc": 0.3 * epoch, "val_acc": 0.25 * epoch, "epoch_time_s": 2.0,
                                     "train_time_s": 1.8, "images_per_s": 100.0,
                                     "peak_memory_mb": {"cpu": 900.0}})


@pytest.fixture
def running_run(engine) -> int:
    """A running run with one epoch, alive as far as any page can tell (its pid is this process)."""
    config = {"dataset": "digits", "model": "test_resnet", "strategy": "single", "devices": ["cpu"],
              "batch_size": 128, "image_size": 32, "amp": "auto", "epochs": 3, "tags": []}
    run_id = store.create_run(engine, config, status="running")
    store.set_process(engine, run_id, pid=os.getpid(), host=socket.gethostname())
    log_epoch(engine, run_id, 1)
    return run_id


@pytest.fixture
def loss_figures(monkeypatch) -> list[int]:
    """One entry per call of the Run page's first chart builder."""
    calls: list[int] = []
    real = charts.loss_figure

    def counted(epochs):
        calls.append(len(epochs))
        return real(epochs)

    monkeypatch.setattr(charts, "loss_figure", counted)
    return calls


def tick(at: AppTest) -> AppTest:
    """Rerun only the page's fragments, as their timer does in the browser.

    AppTest starts each run with a new script runner and page registry; a browser session keeps
    both. So the runner is asked for a fragment rerun, and the registry is given the pages that
    app.py's navigation registered (links in a fragment look them up)."""
    fragment_ids = list(at._fragment_storage._fragments)
    assert fragment_ids, "the page declared no fragment"

    class KnownPages(app_test.PagesManager):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._set_pages(at._registered_pages)

    rerun = functools.partial(RerunData, fragment_id_queue=fragment_ids, is_auto_rerun=True)
    with mock.patch.object(local_script_runner, "RerunData", rerun), \
            mock.patch.object(app_test, "PagesManager", KnownPages):
        return at.run()


def progress_texts(at: AppTest) -> list[str]:
    return [p.text for p in at.get("progress")]


def open_run_page(run_id: int) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.session_state["run_id"] = run_id
    at.switch_page("pages/run.py").run()
    assert not at.exception, at.exception
    return at


def test_a_tick_without_a_new_epoch_updates_progress_but_builds_no_chart(parallax_home, engine, running_run,
                                                                         loss_figures):
    at = open_run_page(running_run)
    assert loss_figures == [1] and len(at.get("plotly_chart")) == 5

    run_state.set_progress(engine, running_run, epoch=2, step=5, total_steps=12)
    tick(at)
    assert not at.exception, at.exception
    assert not at.title  # the fragment alone ran, not the page
    assert progress_texts(at) == ["Epoch 1 of 3 done", "Step 5 of 12 in epoch 2"]
    tick(at)
    assert loss_figures == [1]  # neither tick built a chart
    assert not at.get("plotly_chart")  # nor sent one: the browser keeps those of the last full run


def test_a_tick_after_an_epoch_lands_redraws_the_charts_once(parallax_home, engine, running_run, loss_figures,
                                                           monkeypatch):
    monkeypatch.setattr(live, "EPOCH_REDRAW_S", 0.0)
    at = open_run_page(running_run)
    log_epoch(engine, running_run, 2)
    tick(at)
    assert not at.exception, at.exception
    assert [t.value for t in at.title] == [f"Run #{running_run}"]  # the whole page ran again
    assert loss_figures == [1, 2] and len(at.get("plotly_chart")) == 5
    assert progress_texts(at)[0] == "Epoch 2 of 3 done"
    tick(at)
    assert loss_figures == [1, 2]


def test_epochs_landing_fast_redraw_the_page_at_most_every_few_seconds_and_a_new_status_at_once(
        parallax_home, engine, running_run, loss_figures, monkeypatch):
    monkeypatch.setattr(live, "EPOCH_REDRAW_S", 3600.0)
    at = open_run_page(running_run)
    log_epoch(engine, running_run, 2)
    tick(at)
    assert not at.exception, at.exception
    assert not at.title and loss_figures == [1]  # too soon after the last drawing: the charts wait
    assert progress_texts(at)[0] == "Epoch 2 of 3 done"  # while the bars move on

    run_state.finish(engine, running_run, "completed")
    tick(at)
    assert [t.value for t in at.title] == [f"Run #{running_run}"]  # a new status: the whole page, at once
    assert loss_figures == [1, 2]


def test_sweep_page_ticks_redraw_the_report_only_when_a_run_records_an_epoch(parallax_home, engine, monkeypatch):
    monkeypatch.setattr(live, "EPOCH_REDRAW_S", 0.0)
    from reports import sweep_report

    built: list[int] = []
    real = sweep_report.scaling_figure
    monkeypatch.setattr(sweep_report, "scaling_figure", lambda table: built.append(len(table)) or real(table))
    config = {"dataset": "digits", "model": "test_resnet", "devices": ["cpu", "cpu"], "batch_size": 64,
              "epochs": 3}
    sweep_id = store.create_sweep(engine, config, ["single", "ddp"])
    single = store.create_run(engine, {**config, "strategy": "single", "devices": ["cpu"]}, status="running",
                              sweep_id=sweep_id)
    store.set_process(engine, single, pid=os.getpid(), host=socket.gethostname())
    store.create_run(engine, {**config, "strategy": "ddp"}, status="queued", sweep_id=sweep_id)

    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.query_params["sweep"] = str(sweep_id)
    at.switch_page("pages/sweep.py").run()
    assert not at.exception, at.exception
    assert built == [2]

    run_state.set_progress(engine, single, epoch=1, step=3, total_steps=12)
    tick(at)
    assert not at.exception, at.exception
    assert built == [2] and not at.table  # the report was neither rebuilt nor resent
    assert progress_texts(at) == ["Epoch 1 of 3, step 3 of 12"]

    log_epoch(engine, single, 1)
    tick(at)
    assert built == [2, 2] and at.table  # the whole page, report included, ran again


# --- per-step and system charts -----------------------------------------------------------


def test_step_and_system_charts_tick_apart_from_the_epoch_charts_and_rebuild_only_on_new_rows(
        parallax_home, engine, running_run, loss_figures, monkeypatch):
    """While the run is active its step charts are the browser's (the live feed, drawn once into the page and
    fed by the server's route); the system charts tick on the server, rebuilt only on new rows. Once the run
    has ended the page draws the step charts itself, from every point."""
    from db import series, system_metrics
    from ui import live_feed
    from reports import series_charts

    monkeypatch.setattr(series_charts, "REBUILD_SHARE", float("inf"))  # new rows are charted at the next tick
    steps_built: list[int] = []
    systems_built: list[int] = []
    real_step, real_system = series_charts.step_figure, series_charts.system_figure
    monkeypatch.setattr(series_charts, "step_figure",
                        lambda steps, *args: steps_built.extend([len(steps)] if len(steps) else []) or real_step(steps, *args))
    monkeypatch.setattr(series_charts, "system_figure",
                        lambda system, *args: systems_built.append(len(system)) or real_system(system, *args))
    points = [{"epoch": 1, "step": s, "t_s": 0.5 * s, "train_loss": 1.0, "images_per_s": 90.0, "lr": 0.1}
              for s in range(1, 13)]
    series.add_steps(engine, running_run, points)
    sample = {"t_s": 1.0, "host_cpu_pct": 70.0, "host_memory_mb": 3000.0,
              "processes": [{"rank": 0, "cpu_pct": 99.0, "rss_mb": 700.0}], "gpus": []}
    system_metrics.add_samples(engine, running_run, [sample])
    at = open_run_page(running_run)
    assert steps_built == [] and systems_built == [2, 2] and loss_figures == [1]
    assert len(at.get("plotly_chart")) == 5 + 2  # epoch charts; CPU and memory
    live_frames = at.get("iframe")
    assert len(live_frames) == 1 and f"{live_feed.ROUTE}/{running_run}?" in str(live_frames[0].proto)

    tick(at)  # nothing new: nothing rebuilt, the epoch charts neither built nor sent
    assert not at.exception, at.exception
    assert systems_built == [2, 2] and loss_figures == [1] and len(at.get("plotly_chart")) == 2

    system_metrics.add_samples(engine, running_run, [{**sample, "t_s": 2.0}])
    tick(at)  # a new sample: the system charts alone are rebuilt, from the new rows
    assert systems_built == [2, 2, 4, 4] and steps_built == [] and loss_figures == [1]

    monkeypatch.setattr(series_charts, "REBUILD_SHARE", 1e-12)  # as if each rebuild were very costly
    system_metrics.add_samples(engine, running_run, [{**sample, "t_s": 3.0}])
    tick(at)  # new rows wait for their turn; the charts built before are sent meanwhile
    assert systems_built == [2, 2, 4, 4] and len(at.get("plotly_chart")) == 2

    run_state.finish(engine, running_run, "completed")
    tick(at)  # ended: the whole page, with the step charts drawn from every point and no live feed
    assert not at.exception, at.exception
    assert steps_built == [12, 12] and not at.get("iframe")


def test_step_charts_tick_on_their_own_only_while_epochs_outlast_the_pages_redraws():
    assert live.series_refresh_s(True, None) == live.SERIES_REFRESH_S  # no epoch yet: the first one may be long
    assert live.series_refresh_s(True, 10 * live.EPOCH_REDRAW_S) == live.SERIES_REFRESH_S
    assert live.series_refresh_s(True, live.EPOCH_REDRAW_S / 5) is None  # the page's redraws draw them
    assert live.series_refresh_s(False, 10 * live.EPOCH_REDRAW_S) is None  # ended: nothing moves


def test_a_run_just_launched_is_watched_every_second_while_it_is_queued_then_as_any_other():
    assert live.progress_refresh_s("queued", 0.5) == live.QUEUED_REFRESH_S == 1
    assert live.progress_refresh_s("queued", live.QUEUED_FAST_FOR_S + 1) == live.REFRESH_S  # waits for busy devices
    assert live.progress_refresh_s("running", 0.5) == live.REFRESH_S
    assert live.progress_refresh_s("completed", 0.5) is None


def test_a_queued_runs_page_redraws_when_it_starts_or_when_the_quick_look_is_over(parallax_home, engine, monkeypatch):
    config = {"dataset": "digits", "model": "test_resnet", "strategy": "single", "devices": ["cpu"], "epochs": 3}
    run_id = store.create_run(engine, config, status="queued")
    store.set_process(engine, run_id, pid=os.getpid(), host=socket.gethostname())
    at = open_run_page(run_id)
    tick(at)
    assert not at.exception, at.exception
    assert not at.title  # still queued, and young: the fragment alone ran
    monkeypatch.setattr(live, "QUEUED_FAST_FOR_S", 0.0)
    tick(at)
    assert [t.value for t in at.title] == [f"Run #{run_id}"]  # the whole page: it declares the slower timer
    tick(at)
    assert not at.title  # and then ticks quietly
    run_state.claim(engine, run_id)
    tick(at)
    assert [t.value for t in at.title] == [f"Run #{run_id}"]  # started: the whole page, at once
