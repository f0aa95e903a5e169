"""Run: one run's status, progress and charts, live while it trains (per epoch, and per step and
second: loss, images/s, CPU, memory, GPU utilisation and power); its log, Parallax's notes, its
error; Cancel; and the best checkpoint to download. ``?run=N`` in the URL picks the run.

The page leads with the run's numbers; every note about the run is gathered below them, once
(``ui/run_notes.py``). Its sections are called in order at the end of this file."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from db import profiles, script_metrics, series, store, system_metrics
from db.folders import NotARegularFile
from db.run_state import ACTIVE_STATUSES, RESUMABLE_ENDS
from db.recorded_by import unknown_strategy_note
from db.run_figures import IMAGES_PER_S_HELP, TRAINING_TIME_HELP, run_figures
from trainer_backend.control.housekeeping import OutsideRunFolder, checkpoint_files, run_file
from trainer_backend.control.lifecycle import CancelNotDelivered, cancel, resume
from reports import scaling
from reports import charts, confusion_charts, series_charts
from ui import downloads, efficiency_views, launch_memory, live, live_feed, options, run_notes, script_views, state, widgets
from ui.profile_views import step_breakdown_chart
from ui.slurm_views import show_job as show_slurm_job
from ui.text import escape_markdown

state.enter_through_app("pages/run.py")

CANCEL_NOTE_KEY = "run_cancel_note"
LOG_LOSS_KEY = state.LOG_LOSS_KEY
# What the step and system charts were drawn from (series_version), the figures, the lines saying
# what is missing, and what the build cost and when it ended (for series_charts.rebuild_due).
SERIES_KEY = "run_series_drawn"
# A live chart is half a screen wide: more points would cost the server and the browser, and show nothing more.
LIVE_MAX_POINTS = 600
PICKER_RUNS = 500  # the newest runs the run picker lists (and the one the address names)


def show_metrics(epochs: pd.DataFrame, measurements: dict) -> list[str]:
    """The run's numbers in one row that wraps where the page is narrow (each metric as wide as its text, so
    none is cut), units in the labels; returns the lines saying why a number is missing."""
    last = epochs.iloc[-1]
    figures = run_figures(epochs.to_dict("records"))
    row = st.container(horizontal=True, gap="large", key="run_metrics")
    row.metric("Validation accuracy", f"{last.val_acc:.1%}" if pd.notna(last.val_acc) else "—", width="content")
    best = f"{figures.best_val_acc:.1%}" if figures.best_val_acc is not None else "—"
    row.metric("Best validation accuracy", best, width="content")
    throughput = figures.images_per_s
    row.metric(throughput_label(figures.images_per_s_epochs, figures.epochs_done),
               f"{throughput:,.0f}" if throughput is not None else "—", help=IMAGES_PER_S_HELP, width="content")
    missing = efficiency_views.mfu_metric(row, epochs, measurements)
    row.metric("Training time", widgets.format_duration(figures.training_time_s), width="content",
               help=TRAINING_TIME_HELP + (f" With them, the epochs took "
                                          f"{widgets.format_duration(figures.epochs_time_s)}."
                                          if figures.epochs_time_s is not None else ""))
    return [missing] if missing else []


def throughput_label(steady_epochs: tuple[int, ...], epochs_done: int) -> str:
    """The headline images/s, labelled with the epochs it is the mean of where it leaves one out."""
    if epochs_done <= 1 or not steady_epochs:
        return "Throughput (images/s)"
    span = (f"epoch {steady_epochs[0]}" if len(steady_epochs) == 1
            else f"epochs {steady_epochs[0]}–{steady_epochs[-1]}")
    return f"Throughput (images/s, {span}; epoch 1 left out: start-up)"


def nonfinite_line(epochs: pd.DataFrame) -> str | None:
    """What non-finite losses the run trained through (--on-nonfinite skip or warn), from its epochs' extra."""
    extras = [extra for extra in epochs.get("extra", pd.Series(dtype=object)) if isinstance(extra, dict)]
    nonfinite = sum(int(extra.get("nonfinite_steps", 0)) for extra in extras)
    skipped = sum(int(extra.get("skipped_steps", 0)) for extra in extras)
    if not nonfinite and not skipped:
        return None
    line = f"The training loss was NaN or infinite in {nonfinite:,} step{'s' * (nonfinite != 1)}"
    if skipped:
        return line + f"; {skipped:,} optimizer update{'s were' if skipped != 1 else ' was'} skipped (--on-nonfinite skip)."
    return line + " (--on-nonfinite warn: the run trained on)."


def loss_on_log_scale() -> bool:
    """The page's one switch for its loss charts (per epoch, per step, live, a script's): a diverged run's
    1e12 squashes everything else on a linear axis."""
    return st.toggle("Loss on a log scale", key=LOG_LOSS_KEY,
                     help="Draw the loss charts on a log axis: a loss that blew up leaves the others readable.")


def show_charts(epochs: pd.DataFrame) -> None:
    left, right = st.columns(2)
    left.plotly_chart(charts.on_log_scale(charts.loss_figure(epochs), st.session_state.get(LOG_LOSS_KEY, False)),
                      key="loss")
    right.plotly_chart(charts.accuracy_figure(epochs), key="accuracy")
    left.plotly_chart(charts.throughput_figure(epochs), key="throughput")
    right.plotly_chart(charts.epoch_time_figure(epochs), key="epoch_time")
    memory = scaling.memory_frame(epochs)
    if not memory.empty:
        left.plotly_chart(charts.memory_figure(memory), key="memory")


def show_outcome(run: store.RunRecord) -> None:
    if run.status in ("failed", "lost") and run.error:
        headline, _, details = run.error.partition("\n")
        st.error(escape_markdown(headline), icon=":material/error:")
        if details.strip():
            with st.expander("Traceback"):
                st.code(run.error, language="text")
    elif run.status == "cancelled":
        st.warning(escape_markdown(run.error or "cancelled"), icon=":material/cancel:")


def drawn_from(run: store.RunRecord, epochs_done: int, engine=None) -> tuple:
    """What the page around the live progress is drawn from: status, notes and recorded epochs, and for a script
    run the names it has logged (its live charts are one document per set of names: ui/script_feed.py)."""
    names = script_metrics.metric_count(engine, run.id) if engine is not None and script_views.is_script(run) else 0
    return run.status, len(run.notes), epochs_done, names


def age_s(run: store.RunRecord) -> float:
    return (datetime.now(timezone.utc) - run.created_at).total_seconds()


def live_progress(run_id: int, drawn: tuple, drawn_at: float, refresh_s: float | None = None) -> None:
    """The progress bars: a fragment with a timer while the run is active. A tick costs a few
    indexed queries, whatever the run's length, and sends two progress bars.

    Everything else on the page changes only with the status, the notes or a new epoch: it is drawn
    outside this fragment, so a tick neither rebuilds nor resends it (the charts above all); when
    one of those changes, the tick reruns the whole page, once (for new epochs, as often as
    ``live.redraw_due`` allows: the bars say how far the run is meanwhile)."""
    engine = state.engine_with_fresh_states()
    run = store.get_run(engine, run_id)
    epochs_done = store.last_epochs(engine, [run_id])[run_id]
    if run is None:
        st.rerun()
    now = drawn_from(run, epochs_done, engine)
    if live.redraw_due(now[:2] != drawn[:2] or now[3] != drawn[3], now[2] != drawn[2], drawn_at):
        st.rerun()  # the full run also declares this fragment without its timer once the run has ended
    if refresh_s is not None and live.progress_refresh_s(run.status, age_s(run)) != refresh_s:
        st.rerun()  # a run queued past the quick look: the full run declares the slower timer
    if script_views.is_script(run):  # a script counts its own steps, and its epochs if it says
        script_views.progress_line(engine, run)
    else:
        widgets.progress_bars(run, epochs_done, int(run.config.get("epochs") or epochs_done or 1))


def show_head(run: store.RunRecord) -> list[str]:
    """The run's status, what it trains, and its Cancel or Resume button; returns its notes for the Notes section."""
    # One row whose parts are as wide as their text: a narrow fixed column cut "Cancel run" to "Cancel …".
    head = st.container(horizontal=True, vertical_alignment="center", gap="medium", key="run_head")
    with head:
        widgets.status_badge(run.status)
    devices = escape_markdown(",".join(map(str, run.config.get("devices", []))))
    head.caption(f"**{run.strategy}** on {devices} · **{escape_markdown(run.model)}** on "
                 f"{escape_markdown(run.dataset)} · {scaling.batch_summary(run.config)} · "
                 f"created {run.created_at:%Y-%m-%d %H:%M} UTC", width="stretch")
    if run.status in ACTIVE_STATUSES and head.button("Cancel run", icon=":material/stop_circle:", width="content"):
        confirm_cancel(run.id)
    if (run.status in RESUMABLE_ENDS and "resume.pt" in checkpoint_files(state.engine(), run.id)
            and head.button("Resume", icon=":material/play_circle:", width="content",
                            help="Continue from the last finished epoch, as this same run")):
        try:
            resume(run.id, data_roots=options.data_roots())
        except (ValueError, LookupError) as exc:
            st.session_state[CANCEL_NOTE_KEY] = str(exc)
        st.rerun()
    if note := st.session_state.pop(CANCEL_NOTE_KEY, None):  # the answer to a button just pressed: in sight
        st.warning(escape_markdown(note), icon=":material/warning:")
    return [unknown_strategy_note(run.id, run.strategy, run.measurements)]


@st.dialog("Cancel this run?")
def confirm_cancel(run_id: int) -> None:
    """Cancel stops every process of a run that may have trained for hours: asked once more, never on one click."""
    st.markdown(f"Run #{run_id} stops now, with every process it started. The epochs, steps and checkpoints it "
                "has recorded are kept.")
    keep, stop = st.columns(2)
    if keep.button("Keep it running", width="stretch"):
        st.rerun()
    if stop.button(f"Cancel run #{run_id}", type="primary", icon=":material/stop_circle:", width="stretch"):
        with st.spinner("Stopping every process of the run…"):
            try:
                cancel(run_id)
            except CancelNotDelivered as exc:  # marked cancelled; its process is another user's
                st.session_state[CANCEL_NOTE_KEY] = str(exc)
        st.rerun()


def launch_again(run: store.RunRecord) -> None:
    """The run's config loaded into the Launch form, to edit before launching (ClearML's clone)."""
    if st.button("Launch again with these settings", icon=":material/content_copy:", key="launch_again",
                 help="Opens the Launch page with this run's settings filled in; nothing starts until you launch."):
        if problem := launch_memory.load_run(run.id, run.config):
            st.error(escape_markdown(problem), icon=":material/error:")
        else:
            st.switch_page(state.LAUNCH_PAGE)


def show_messages(run: store.RunRecord) -> None:
    """How the run ended where it did not complete (its error leads a failed run's page), or why it waits."""
    show_outcome(run)
    if run.status == "queued":  # said once, with the badge: the progress bars and the live charts add nothing to it
        st.caption("Queued: it starts when its devices are free (by default one CPU run at a time).")


def show_numbers(run: store.RunRecord, epochs: pd.DataFrame) -> list[str]:
    """The run's numbers, drawn on a full run of the page (once per epoch); returns the lines saying why
    one is missing."""
    if epochs.empty:
        if not script_views.is_script(run):  # a script's own metrics are charted as they come
            st.caption("Charts appear when the first epoch ends.")
        return []
    return show_metrics(epochs, run.measurements)


def show_epochs(run: store.RunRecord, epochs: pd.DataFrame) -> None:
    """The per-epoch charts and tables: drawn on a full run of the page, i.e. once per epoch."""
    if not epochs.empty:
        show_charts(epochs)
        efficiency_views.rank_times(epochs, key="rank_times")
        label = scaling.run_label(run.id, run.strategy, scaling.device_count(run.config), run.model)
        efficiency_views.memory_breakdown(epochs, {run.id: label}, key="memory_breakdown")
        efficiency_views.estimate_check([{"id": run.id, "measurements": run.measurements}], epochs, {run.id: label},
                                        key="memory_estimate_check")


def series_version(engine, run: store.RunRecord, epochs_done: int) -> tuple:
    """What the step and system charts are drawn from: the last step and how many system values are stored
    (one query, whatever the run's length), the epochs (their boundary marks) and whether the run
    is active."""
    return (run.id, run.status in ACTIVE_STATUSES, epochs_done, *series.last_points(engine, run.id))


def build_series(engine, run: store.RunRecord, epochs: pd.DataFrame) -> tuple[list[tuple[str, object]], list[str]]:
    """The step and system figures (key, figure) from downsampled rows, and a line per missing chart. While
    the run is active its step charts are the live ones (``live_steps``): only the system charts are built."""
    active = run.status in ACTIVE_STATUSES
    steps = series_charts.steps_frame(
        [] if active else series.read_steps(engine, [run.id], max_points=LIVE_MAX_POINTS))
    system = series_charts.system_frame(
        system_metrics.read_metric(engine, [run.id], series_charts.SYSTEM_METRICS, max_points=LIVE_MAX_POINTS),
        {run.id: run.hosts})
    marks = series_charts.epoch_marks(epochs, steps)
    figures = [(f"step_{column}", series_charts.step_figure(steps, column, marks))
               for column in series_charts.STEP_TITLES if not steps.empty]
    figures += [(f"system_{metric}", series_charts.system_figure(system, metric, marks))
                for metric in series_charts.system_charts_for(system)]
    devices = [str(device) for device in run.config.get("devices", [])]
    return figures, series_charts.missing_series(devices, active, steps, system,
                                                 own_steps=script_views.is_script(run))


def live_series(run: store.RunRecord, epochs: pd.DataFrame) -> None:
    """Loss and images/s per step, and CPU, memory, GPU utilisation and power over time: a fragment
    with a timer while the run is active, apart from the per-epoch charts, which its ticks never touch.

    A tick asks for the last step and sample; the figures are rebuilt, from at most LIVE_MAX_POINTS
    rows per chart, only when those moved, and no more often than series_charts.REBUILD_SHARE allows
    (a fragment's elements must be sent again on each of its runs, so an idle tick sends the
    figures it built before); epoch boundaries wait for the same turn. ``run`` is the page's: a
    change of status reruns the whole page (live_progress), so a tick need not read the run again."""
    engine = state.engine()
    version = series_version(engine, run, int(epochs.epoch.max()) if not epochs.empty else 0)
    drawn = st.session_state.get(SERIES_KEY)
    # New rows wait while the last rebuild's cost has not been spread thin enough (long runs on a
    # busy machine); a new run or status is drawn at once.
    if drawn is None or drawn["version"][:2] != version[:2] or (
            drawn["version"] != version
            and series_charts.rebuild_due(drawn["build_s"], time.monotonic() - drawn["built_at"])):
        started = time.monotonic()
        figures, missing = build_series(engine, run, epochs)
        drawn = {"version": version, "figures": figures, "missing": missing,
                 "build_s": time.monotonic() - started, "built_at": time.monotonic()}
        st.session_state[SERIES_KEY] = drawn
    columns = st.columns(2)
    log_loss = st.session_state.get(LOG_LOSS_KEY, False)
    for i, (key, figure) in enumerate(drawn["figures"]):
        if key == "step_train_loss" and log_loss:
            figure = charts.on_log_scale(go.Figure(figure))  # a copy: the drawn figures are kept for the next tick
        columns[i % 2].plotly_chart(figure, key=key)
    for line in drawn["missing"]:
        st.caption(line)


def live_steps(run: store.RunRecord) -> None:
    """While the run is active: its loss and images/s per step, drawn in the browser from the first recorded
    step and grown every second from the server's live route (ui/live_feed.py), with no rerun of the page.
    The document is the same on every rerun, so the browser keeps it and its charts."""
    if run.status in ACTIVE_STATUSES and not script_views.is_script(run):  # a script logs its own series
        st.iframe(live_feed.feed_html(run.id, log_loss=st.session_state.get(LOG_LOSS_KEY, False)),
                  height=live_feed.FEED_HEIGHT_PX)


def show_per_class(run: store.RunRecord) -> None:
    """The best epoch's per-class accuracy and confusion matrix, where the run recorded them."""
    record = run.measurements.get("confusion")
    if not record:
        return
    st.subheader("Per class (best epoch)")
    table_col, matrix_col = st.columns([1, 2])
    table_col.dataframe(confusion_charts.per_class_frame(record), hide_index=True,
                        column_config={"accuracy": st.column_config.NumberColumn(format="percent")})
    figure, caption = confusion_charts.confusion_figure(record)
    if figure is not None:
        matrix_col.plotly_chart(figure, key="confusion")
    matrix_col.caption(caption)


def show_log(run_id: int, expanded: bool) -> None:
    try:
        tail = widgets.read_log_tail(run_file(state.engine(), run_id, "run.log"))
    except OutsideRunFolder as exc:
        st.error(str(exc), icon=":material/block:")
        return
    except NotARegularFile as exc:
        st.warning(escape_markdown(str(exc)), icon=":material/block:")
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
        parts = [f"Tags: {' · '.join(escape_markdown(tag) for tag in run.tags)}"] if run.tags else []
        st.caption(" — ".join(parts + ([escape_markdown(run.user_note)] if run.user_note else [])))
    try:
        checkpoint = run_file(state.engine(), run.id, "best.pt")
    except OutsideRunFolder as exc:
        st.error(str(exc), icon=":material/block:")
        checkpoint = None
    # is_file: only a regular file is offered (a named pipe there would block the download forever).
    if checkpoint is not None and checkpoint.is_file() and run.status not in ACTIVE_STATUSES:
        size = widgets.format_bytes(checkpoint.stat().st_size)
        # A link the server streams from disk (ui/downloads.py): a multi-GB file is never held in memory whole.
        st.link_button(f"Download the best checkpoint ({size})", downloads.link(run.id, "best.pt"),
                       icon=":material/download:")
    if files := checkpoint_files(state.engine(), run.id):
        keep = run.config.get("keep_checkpoints", 1)
        st.caption(f"Checkpoints on disk: {widgets.format_bytes(sum(files.values()))} ("
                   + ", ".join(f"{name} {widgets.format_bytes(size)}" for name, size in files.items())
                   + f"; --keep-checkpoints {keep} keeps that many resume points besides the best).")
    show_profile(run.id)
    with st.expander("Config"):
        st.dataframe(
            pd.DataFrame({"value": [scaling.display_value(v) for v in run.config.values()]}, index=list(run.config)),
            width="content",
        )


engine = state.engine_with_fresh_states()
# The picker lists the newest runs and the one asked for: a history of 100,000 runs is never read whole.
requested = state.requested_run_id()
runs = store.list_runs(engine, limit=PICKER_RUNS)
if requested is not None and requested not in {r.id for r in runs}:
    runs += store.run_summaries(engine, [requested])
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
run = script_views.readable(store.get_run(engine, run_id))
title_col.title(f"Run #{run_id}")
# The run before its epochs: an epoch landing in between costs one more full run, never a stale chart.
epochs = scaling.epochs_frame(store.read_epoch_metrics(engine, [run_id]))

# The page, top to bottom: what the run is; its progress and how it ended; its numbers; its notes,
# once each; its charts and tables; its log and files. A view for one kind of run (a Slurm job, a
# run logged from a user's script) is a call of its own module among the charts and tables, and puts
# what it has to say into `notes`: the Notes section is drawn after them, in the place kept for it.
notes: list[str | None] = []
notes += show_head(run)
show_slurm_job(run)
if not script_views.is_script(run):  # a script's config is not a launch form's
    launch_again(run)
# Only the progress reruns every few seconds, and only while there is something to watch.
active = run.status in ACTIVE_STATUSES
progress_s = live.progress_refresh_s(run.status, age_s(run))
st.fragment(live_progress, run_every=progress_s)(
    run_id, drawn_from(run, int(epochs.epoch.max()) if not epochs.empty else 0, engine), time.monotonic(), progress_s)
show_messages(run)
notes += show_numbers(run, epochs)
notes_section = st.container(key="run_notes")  # right below the numbers; filled once every section has spoken
if not epochs.empty or script_views.is_script(run) or run.status in ACTIVE_STATUSES:
    loss_on_log_scale()
if script_views.is_script(run):
    script_views.run_section(engine, run)
else:
    show_epochs(run, epochs)
show_per_class(run)
last_epoch_s = float(epochs.epoch_time_s.iloc[-1]) if not epochs.empty and pd.notna(epochs.epoch_time_s.iloc[-1]) else None
live_steps(run)
st.fragment(live_series, run_every=live.series_refresh_s(active, last_epoch_s))(run, epochs)
# Open for a failure, where the log says most. Redrawn with each epoch, status or note.
show_log(run_id, expanded=run.status in ("failed", "lost"))
show_static(run)
with notes_section:
    run_notes.show_notes(run_notes.distinct_notes(run.notes, notes),
                         warnings=[nonfinite_line(epochs)] if not epochs.empty else [],
                         expanded=run.status in ("failed", "lost"))
