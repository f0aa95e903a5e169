"""Sweeps: the scaling report of one strategy sweep (the same training under several strategies):
one sentence of advice, the table of throughput, speedup over the sweep's single run, efficiency,
peak memory, time to a target accuracy, mean GPU (or CPU) utilisation and energy per image, the
speedup chart, the step breakdown when profiled, and each run's status, live while any of them is
queued or running. ``?sweep=N`` picks the sweep.

Sweeps are launched from the Launch page ("Compare strategies") or the CLI:
``python -m trainer_backend sweep --strategies single,ddp,mp,pp --devices cpu,cpu --model test_resnet``."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from db import store
from db.run_figures import IMAGES_PER_S_LABEL
from reports import scaling
from db.run_state import ACTIVE_STATUSES
from reports.scaling_forecast import HYPOTHETICAL_HEADING, forecast_display, hypothetical, possible, sweep_forecast
from reports.sweep_report import (ESTIMATE_ERROR_NOTE, energy_gaps_line, mfu_note, scaling_figure, strategy_advice,
                           sweep_html, sweep_table, waiting_for)
from ui import efficiency_views, live, state, widgets
from ui.profile_views import step_breakdown_chart
from ui.text import escape_markdown

state.enter_through_app("pages/sweep.py")

def sweep_label(sweep: dict) -> str:
    # A sweep over device counts lists a strategy once per count: name each strategy once.
    return f"Sweep #{sweep['id']} · {', '.join(dict.fromkeys(sweep['strategies']))} · {sweep['created_at']:%Y-%m-%d %H:%M} UTC"


def numbers(column: pd.Series, pattern: str) -> pd.Series:
    """A column that is None until its run has measured it, as text: '—' until then."""
    return column.map(lambda v: "—" if v is None or pd.isna(v) else pattern.format(v))


def report_display(table: pd.DataFrame, target_acc: float) -> pd.DataFrame:
    return pd.DataFrame({
        "run": table["label"],
        "strategy": table["strategy"],
        "devices": table["devices"],
        "status": table["status"],
        "effective batch": table["effective_batch"],
        IMAGES_PER_S_LABEL: numbers(table["throughput_images_per_s"], "{:,.0f}"),
        "MFU": numbers(table["mfu"], "{:.1%}"),
        "of peak TFLOP/s": numbers(table["peak_tflops"], "{:.3g}"),
        "speedup (×)": numbers(table["speedup"], "{:.2f}×"),
        "efficiency": numbers(table["efficiency"], "{:.0%}"),
        "peak memory per device (MB)": numbers(table["peak_memory_mb"], "{:,.0f}"),
        "memory estimate error": numbers(table["memory_estimate_error"], "{:+.1%}"),
        f"time to {target_acc:.0%} val acc": table["time_to_target_s"].map(
            lambda s: widgets.format_duration(s) if pd.notna(s) else "not reached"),
        "mean utilisation": [f"{value:.0f}% {of}" if pd.notna(value) else "—"
                             for value, of in zip(table["utilisation_pct"], table["utilisation_of"])],
        "energy per image (J)": numbers(table["energy_j_per_image"], "{:.3g}"),
    })


def sweep_state(engine, run_ids: list[int]) -> tuple[list[store.RunRecord], dict[int, int]]:
    """Each run of the sweep and its last recorded epoch: a few indexed queries per run, whatever
    the runs' lengths."""
    return [store.get_run(engine, run_id) for run_id in run_ids], store.last_epochs(engine, run_ids)


def report_version(runs: list[store.RunRecord], last_epochs: dict[int, int]) -> tuple:
    """What the report is drawn from: it changes when a run changes status or records an epoch."""
    return tuple((run.id, run.status, last_epochs[run.id]) for run in runs)


def run_statuses(run_ids: list[int], reported: tuple, reported_at: float) -> None:
    """One line per run: a link to it, its status, and its progress while it is not finished.

    A fragment with a timer while any run is active. The report around it (table, charts) is drawn
    by the page, so a tick neither rebuilds nor resends it; when a run changes status, the tick
    reruns the whole page, once, and when runs record epochs, as often as ``live.redraw_due`` allows."""
    runs, last_epochs = sweep_state(state.engine_with_fresh_states(), run_ids)
    now = report_version(runs, last_epochs)
    if live.redraw_due([r[:2] for r in now] != [r[:2] for r in reported], now != reported, reported_at):
        st.rerun()  # the report was drawn from older numbers (a full rerun also stops the timer at the end)
    for run in runs:
        epochs_total = max(1, int(run.config.get("epochs") or 1))
        epochs_done = last_epochs[run.id]
        link_col, badge_col, progress_col = st.columns([2, 1, 3], vertical_alignment="center")
        link_col.page_link(state.RUN_PAGE, label=f"Run #{run.id} · {run.strategy} on "
                           f"{len(run.config.get('devices', []))} device(s)",
                           icon=":material/monitoring:", query_params={"run": run.id})
        with badge_col:
            widgets.status_badge(run.status)
        if run.status == "running":
            step, total = run.progress_step or 0, run.progress_total_steps or 0
            fraction = (epochs_done + (step / total if total else 0)) / epochs_total
            progress_col.progress(min(1.0, fraction), text=f"Epoch {min(epochs_done + 1, epochs_total)} of "
                                  f"{epochs_total}" + (f", step {step} of {total}" if total else ""))
        elif run.status == "queued":
            progress_col.caption("Waiting for its turn: the sweep's runs train one after another.")
        elif run.status in ("failed", "lost", "cancelled") and run.error:
            progress_col.caption(escape_markdown(run.error.partition("\n")[0]))


def missing_breakdown(runs: list[store.RunRecord]) -> str:
    """Why the step breakdown is not drawn: profiling off, or the profiled runs have not stored their window yet."""
    profiled = [run for run in runs if run.config.get("profile")]
    if not profiled:
        return ("Launch the sweep with **Profile the first steps** on to see where each strategy's step time goes "
                "(data loading, forward, backward, optimizer, communication).")
    if any(run.status in ACTIVE_STATUSES for run in profiled):
        return ("The sweep is profiled: the step breakdown appears when its runs have stored their profiled steps "
                "(at the end of each run's first epoch).")
    return "The sweep was profiled, but none of its runs stored a profile (see each run's log)."


def show_report(engine, sweep_id: int, target_acc: float) -> None:
    """The scaling report and the runs' live statuses; the report is redrawn only on a full run."""
    run_ids = store.sweep_run_ids(engine, sweep_id)
    # Read before the table: an epoch landing in between then costs one extra redraw, never a missed one.
    runs, last_epochs = sweep_state(engine, run_ids)
    active = any(run.status in ACTIVE_STATUSES for run in runs)
    table = sweep_table(engine, sweep_id, target_acc=target_acc)
    if waiting := waiting_for(table):
        st.info(escape_markdown(waiting), icon=":material/hourglass_top:")
    else:
        st.success(strategy_advice(table), icon=":material/lightbulb:")
    st.fragment(run_statuses, run_every=live.REFRESH_S if active else None)(run_ids, report_version(runs, last_epochs),
                                                                     time.monotonic())
    # A plain table: a handful of rows, every number readable (and selectable) at once.
    st.table(report_display(table, target_acc).set_index("run"))
    st.caption("Mean utilisation: of the run's GPUs (the mean over them) over its samples, or of the host's CPU "
               "where it had no GPU samples.")
    st.caption(ESTIMATE_ERROR_NOTE)
    if gaps := energy_gaps_line(table, run_name=lambda run_id: f"#{run_id}"):
        st.caption(escape_markdown(gaps))
    if table["speedup"].notna().any():
        st.caption("Speedup: throughput over the sweep's single-device run; efficiency: speedup per device "
                   "(100 % is perfect scaling). On CPU every process shares the same cores. With one epoch, "
                   "throughput includes start-up costs: sweep two or more epochs for a fair figure.")
    if note := mfu_note(table):
        st.caption(note)
    left, right = st.columns(2)
    left.plotly_chart(scaling_figure(table), key="sweep_scaling")
    with right:
        if not step_breakdown_chart(engine, run_ids, key="sweep_breakdown"):
            st.caption(missing_breakdown(runs))
    efficiency_views.memory_breakdown(scaling.epochs_frame(store.read_epoch_metrics(engine, run_ids)),
                                      dict(zip(table["run_id"], table["label"])), key="sweep_memory")
    show_forecast(engine, sweep_id)


def show_forecast(engine, sweep_id: int) -> None:
    """What 2x and 4x the devices would give, beside what the sweep (or a later sweep of the same work)
    measured, and the model's assumptions; counts this machine cannot give apart, each with its reason."""
    st.subheader("Scaling forecast")
    forecast = sweep_forecast(engine, sweep_id)
    table = forecast.table
    if not possible(table).empty:
        st.table(forecast_display(possible(table)).set_index(["strategy", "devices"]))
    if not hypothetical(table).empty:
        st.warning(f"{HYPOTHETICAL_HEADING}: what the model gives, not what this machine can measure.",
                   icon=":material/science:")
        st.table(forecast_display(hypothetical(table)).set_index(["strategy", "devices"]))
    if not table.empty and table["memory_mb_predicted"].isna().all():
        st.caption("Memory per device: not forecast — the sweep's runs recorded no memory breakdown.")
    for note in forecast.notes:
        st.caption(note)
    if table.empty and not forecast.notes:
        st.caption("No forecast: the sweep has no multi-device strategy to scale (single and DataParallel on "
                   "CPU run on one device).")
    if not table.empty:
        st.caption(" ".join(forecast.assumptions))


st.title("Sweeps")
engine = state.engine_with_fresh_states()
sweeps = store.list_sweeps(engine)
if not sweeps:
    st.info("No sweeps yet. A sweep trains the same model under several strategies and reports which is fastest: "
            "on the Launch page choose **Compare strategies**, or run "
            "`parallax sweep --strategies single,ddp,mp,pp --devices cpu,cpu`.")
    st.page_link(state.LAUNCH_PAGE, label="Launch a sweep", icon=":material/rocket_launch:")
    st.stop()

labels = {sweep["id"]: sweep_label(sweep) for sweep in sweeps}
ids = list(labels)
if problem := state.unknown_url_id("sweep", ids, noun="Sweep"):
    st.error(problem, icon=":material/error:")
    st.page_link(state.SWEEP_PAGE, label="All sweeps", icon=":material/stacked_bar_chart:")
    st.stop()
wanted = state.requested_sweep_id()
picker_col, target_col = st.columns([3, 1], vertical_alignment="bottom")
sweep_id = picker_col.selectbox("Sweep", ids, index=ids.index(wanted) if wanted in ids else 0,
                                format_func=labels.__getitem__, key="sweep_picker")
if sweep_id != wanted:
    st.query_params["sweep"] = sweep_id
    st.session_state[state.SWEEP_ID_KEY] = sweep_id
target_acc = target_col.number_input(
    "Target validation accuracy", min_value=0.0, max_value=1.0, value=0.9, step=0.05, key="sweep_target_acc",
    help="Time to target: wall-clock training time until validation accuracy first reaches this.")

show_report(engine, sweep_id, target_acc)

st.download_button(
    "Download the report (HTML)", lambda: sweep_html(engine, sweep_id, target_acc=target_acc),
    file_name=f"parallax-sweep-{sweep_id}.html", mime="text/html", on_click="ignore", icon=":material/download:",
    help="One self-contained page (charts included) that opens offline.",
)
