"""Sweeps: the scaling report of one strategy sweep (the same training under several strategies):
one sentence of advice, the table of throughput, speedup over the sweep's single run, efficiency,
peak memory and time to a target accuracy, the speedup chart, the step breakdown when profiled,
and each run's status, live while any of them is queued or running. ``?sweep=N`` picks the sweep.

Sweeps are launched from the Launch page ("Compare strategies") or the CLI:
``python -m trainer_backend sweep --strategies single,ddp,mp,pp --devices cpu,cpu --model test_resnet``."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from db import store
from db.lifecycle import ACTIVE_STATUSES
from reports.sweep import scaling_figure, strategy_advice, sweep_html, sweep_table
from ui import state, widgets
from ui.profile_views import step_breakdown_chart

state.enter_through_app("pages/sweep.py")

REFRESH_S = 2


def sweep_label(sweep: dict) -> str:
    return f"Sweep #{sweep['id']} · {', '.join(sweep['strategies'])} · {sweep['created_at']:%Y-%m-%d %H:%M} UTC"


def numbers(column: pd.Series, pattern: str) -> pd.Series:
    """A column that is None until its run has measured it, as text: '—' until then."""
    return column.map(lambda v: "—" if v is None or pd.isna(v) else pattern.format(v))


def report_display(table: pd.DataFrame, target_acc: float) -> pd.DataFrame:
    return pd.DataFrame({
        "run": table["label"],
        "strategy": table["strategy"],
        "devices": table["devices"],
        "status": table["status"],
        "throughput (images/s)": numbers(table["throughput_images_per_s"], "{:,.0f}"),
        "speedup (×)": numbers(table["speedup"], "{:.2f}×"),
        "efficiency": numbers(table["efficiency"], "{:.0%}"),
        "peak memory per device (MB)": numbers(table["peak_memory_mb"], "{:,.0f}"),
        f"time to {target_acc:.0%} val acc": table["time_to_target_s"].map(
            lambda s: widgets.format_duration(s) if pd.notna(s) else "not reached"),
    })


def run_statuses(run_ids: list[int]) -> None:
    """One line per run: a link to it, its status, and its progress while it is not finished."""
    engine = state.engine()
    done_epochs = pd.DataFrame(store.read_epoch_metrics(engine, run_ids), columns=["run_id", "epoch"])
    for run_id in run_ids:
        run = store.get_run(engine, run_id)
        epochs_total = max(1, int(run.config.get("epochs") or 1))
        epochs_done = int((done_epochs["run_id"] == run_id).sum())
        link_col, badge_col, progress_col = st.columns([2, 1, 3], vertical_alignment="center")
        link_col.page_link(state.RUN_PAGE, label=f"Run #{run_id} · {run.strategy} on "
                           f"{len(run.config.get('devices', []))} device(s)",
                           icon=":material/monitoring:", query_params={"run": run_id})
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
            progress_col.caption(run.error.partition("\n")[0])


def live_report(sweep_id: int, target_acc: float, was_active: bool) -> None:
    """The parts that change while the sweep's runs train; a fragment with a timer only while active."""
    engine = state.engine_with_fresh_states()
    table = sweep_table(engine, sweep_id, target_acc=target_acc)
    if was_active and not table["status"].isin(ACTIVE_STATUSES).any():
        st.rerun()  # a full rerun declares the fragment again without its timer
    st.success(strategy_advice(table), icon=":material/lightbulb:")
    run_statuses(table["run_id"].tolist())
    # A plain table: a handful of rows, every number readable (and selectable) at once.
    st.table(report_display(table, target_acc).set_index("run"))
    if table["speedup"].notna().any():
        st.caption("Speedup: throughput over the sweep's single-device run; efficiency: speedup per device "
                   "(100 % is perfect scaling). On CPU every process shares the same cores. With one epoch, "
                   "throughput includes start-up costs: sweep two or more epochs for a fair figure.")
    left, right = st.columns(2)
    left.plotly_chart(scaling_figure(table), key="sweep_scaling")
    with right:
        if not step_breakdown_chart(engine, table["run_id"].tolist(), key="sweep_breakdown"):
            st.caption("Launch the sweep with **Profile the first steps** on to see where each strategy's "
                       "step time goes (data loading, forward, backward, optimizer, communication).")


st.title("Sweeps")
engine = state.engine_with_fresh_states()
sweeps = store.list_sweeps(engine)
if not sweeps:
    st.info("No sweeps yet. A sweep trains the same model under several strategies and reports which is fastest: "
            "on the Launch page choose **Compare strategies**, or run "
            "`python -m trainer_backend sweep --strategies single,ddp,mp,pp --devices cpu,cpu`.")
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

run_ids = store.sweep_run_ids(engine, sweep_id)
active = any(store.get_run(engine, i).status in ACTIVE_STATUSES for i in run_ids)
st.fragment(live_report, run_every=REFRESH_S if active else None)(sweep_id, target_acc, active)

st.download_button(
    "Download the report (HTML)", lambda: sweep_html(engine, sweep_id, target_acc=target_acc),
    file_name=f"parallax-sweep-{sweep_id}.html", mime="text/html", on_click="ignore", icon=":material/download:",
    help="One self-contained page (charts included) that opens offline.",
)
