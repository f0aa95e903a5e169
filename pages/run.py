"""Run: one run's status, progress and charts, live while it trains; its log, the engine's notes,
its error; Cancel; and the best checkpoint to download. ``?run=N`` in the URL picks the run."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from db import profiles, store
from db.lifecycle import ACTIVE_STATUSES
from trainer_backend.housekeeping import OutsideRunFolder, run_file
from trainer_backend.lifecycle import cancel
from reports import scaling
from ui import charts, state, widgets
from ui.profile_views import step_breakdown_chart

state.enter_through_app("pages/run.py")

REFRESH_S = 2


def show_metrics(epochs: pd.DataFrame) -> None:
    last = epochs.iloc[-1]
    columns = st.columns(4)
    columns[0].metric("Validation accuracy", f"{last.val_acc:.1%}" if pd.notna(last.val_acc) else "—")
    best = f"{epochs.val_acc.max():.1%}" if epochs.val_acc.notna().any() else "—"
    columns[1].metric("Best validation accuracy", best)
    throughput = scaling.throughput_images_per_s(epochs)
    columns[2].metric("Throughput", f"{throughput:,.0f} images/s" if throughput else "—",
                      help="Mean over the epochs after the first (the first carries start-up costs).")
    columns[3].metric("Training time", widgets.format_duration(float(epochs.epoch_time_s.fillna(0).sum())))


def show_charts(epochs: pd.DataFrame) -> None:
    left, right = st.columns(2)
    left.plotly_chart(charts.loss_figure(epochs), key="loss")
    right.plotly_chart(charts.accuracy_figure(epochs), key="accuracy")
    left.plotly_chart(charts.throughput_figure(epochs), key="throughput")
    right.plotly_chart(charts.epoch_time_figure(epochs), key="epoch_time")
    memory = scaling.memory_frame(epochs)
    if not memory.empty:
        left.plotly_chart(charts.memory_figure(memory), key="memory")


def show_outcome(run: store.RunRecord) -> None:
    if run.status in ("failed", "lost") and run.error:
        headline, _, details = run.error.partition("\n")
        st.error(headline, icon=":material/error:")
        if details.strip():
            with st.expander("Traceback"):
                st.code(run.error, language="text")
    elif run.status == "cancelled":
        st.warning(run.error or "cancelled", icon=":material/cancel:")


def live_view(run_id: int, was_active: bool) -> None:
    """Everything that changes while the run trains; a fragment with a timer only while active."""
    run = store.get_run(state.engine_with_fresh_states(), run_id)
    if run is None:
        st.warning(f"Run #{run_id} no longer exists.")
        return
    if was_active and run.status not in ACTIVE_STATUSES:
        st.rerun()  # a full rerun declares this fragment again without its timer, and shows the outcome

    badge_col, what_col, cancel_col = st.columns([1, 6, 1], vertical_alignment="center")
    with badge_col:
        widgets.status_badge(run.status)
    what_col.caption(f"**{run.strategy}** on {','.join(run.config.get('devices', []))} · **{run.model}** on "
                     f"{run.dataset} · created {run.created_at:%Y-%m-%d %H:%M} UTC")
    if run.status in ACTIVE_STATUSES and cancel_col.button("Cancel run", icon=":material/stop_circle:"):
        with st.spinner("Stopping every process of the run…"):
            cancel(run_id)
        st.rerun()

    epochs = scaling.epochs_frame(store.read_epoch_metrics(state.engine(), [run_id]))
    widgets.progress_bars(run, len(epochs), int(run.config.get("epochs") or len(epochs) or 1))
    show_outcome(run)
    for note in run.notes:
        st.info(note, icon=":material/info:")
    if run.status == "queued":
        st.caption("Queued: it starts when its devices are free (by default one CPU run at a time).")
    if epochs.empty:
        st.caption("Charts appear when the first epoch ends.")
    else:
        show_metrics(epochs)
        show_charts(epochs)
    # Open for a failure, where the log says most; fixed per status so it does not jump while live.
    show_log(run_id, expanded=run.status in ("failed", "lost"))


def show_log(run_id: int, expanded: bool) -> None:
    try:
        tail = widgets.read_log_tail(run_file(state.engine(), run_id, "run.log"))
    except OutsideRunFolder as exc:
        st.error(str(exc), icon=":material/block:")
        return
    if tail is not None:
        with st.expander(f"Log (last {widgets.LOG_TAIL_LINES} lines)", expanded=expanded):
            st.code(tail or "(empty so far)", language="text")


def show_profile(run_id: int) -> None:
    """For a profiled run: where a step's time goes, and the way to the Profiler page."""
    engine = state.engine()
    if not profiles.profiled_runs(engine, [run_id]):
        return
    st.subheader("Profile")
    step_breakdown_chart(engine, [run_id], key="profile_breakdown")
    st.page_link(state.PROFILER_PAGE, label="Open in the Profiler: heaviest ops, memory, traces",
                 icon=":material/speed:", query_params={"run": run_id})


def show_static(run: store.RunRecord) -> None:
    """What does not change while the run trains: labels, config, the checkpoint."""
    if run.tags or run.user_note:
        st.caption(" ".join(f"`{tag}`" for tag in run.tags) + (f"  {run.user_note}" if run.user_note else ""))
    try:
        checkpoint = run_file(state.engine(), run.id, "best.pt")
    except OutsideRunFolder as exc:
        st.error(str(exc), icon=":material/block:")
        checkpoint = None
    if checkpoint is not None and checkpoint.exists() and run.status not in ACTIVE_STATUSES:
        size_mb = checkpoint.stat().st_size / 2**20
        st.download_button(
            f"Download the best checkpoint ({size_mb:.1f} MB)",
            data=checkpoint.read_bytes,  # a callable: read on click, not on every rerun
            file_name=f"parallax-run-{run.id}-best.pt", mime="application/octet-stream",
            on_click="ignore", icon=":material/download:",
        )
    show_profile(run.id)
    with st.expander("Config"):
        st.dataframe(
            pd.DataFrame({"value": [scaling.display_value(v) for v in run.config.values()]}, index=list(run.config)),
            width="content",
        )


engine = state.engine_with_fresh_states()
runs = store.list_runs(engine)
if not runs:
    st.title("Run")
    st.info("No runs yet.")
    st.page_link(state.LAUNCH_PAGE, label="Launch the first one", icon=":material/rocket_launch:")
    st.stop()

if problem := state.unknown_url_id("run", [r.id for r in runs]):
    st.title("Run")
    st.error(problem, icon=":material/error:")
    st.page_link(state.RUNS_PAGE, label="All runs", icon=":material/table_rows:")
    st.stop()

title_col, picker_col = st.columns([3, 2], vertical_alignment="bottom")
with picker_col:
    run_id = widgets.pick_run(runs, state.requested_run_id())
if run_id != state.requested_run_id():
    st.query_params["run"] = run_id
    st.session_state[state.RUN_ID_KEY] = run_id
run = store.get_run(engine, run_id)
title_col.title(f"Run #{run_id}")
active = run.status in ACTIVE_STATUSES
# Only the live part reruns every few seconds, and only while there is something to watch.
st.fragment(live_view, run_every=REFRESH_S if active else None)(run_id, active)
show_static(run)
