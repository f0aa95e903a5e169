"""Compare: overlaid curves of the picked runs (per epoch, and per step and second: loss, images/s and
the machine's utilisation), the config fields that differ, and the strategy
scaling view (throughput, speedup over the matching single-device run, scaling efficiency, time
to a target accuracy), with a warning when the runs do not do the same work."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from db import dashboard, series, store, system_metrics
from db.run_figures import IMAGES_PER_S_HELP, IMAGES_PER_S_LABEL
from reports import efficiency, scaling
from reports.sweep_report import strategy_advice, waiting_for
from db.recorded_by import unknown_strategy_note
from contract.strategy_specs import find, names_where
from reports import charts, series_charts
from ui import efficiency_views, script_views, state, widgets
from ui.text import escape_markdown

state.enter_through_app("pages/compare.py")

PICKER_KEY = "compare_picker"
COMPARE_REQUEST = state.COMPARE_IDS_KEY  # runs sent here from the Runs page
URL_PARAM = "runs"  # ?runs=3,5,8
SUPERLINEAR = 1.05  # efficiency clearly above ideal: worth a word of explanation
METRICS_PER_ROW = 3  # wide enough for a label like "Speedup of #12 ddp×2 resnet18"
SERIES_MAX_POINTS = 1000  # per run: a chart is at most a screen wide
LOG_HELP = "Draw the loss on a log axis: a run whose loss blew up leaves the others readable."
PICKER_RUNS = 500  # the newest runs the picker lists, besides those asked for


def pick_runs(summaries: list[store.RunSummary]) -> list[int]:
    """The picked runs, kept in the address (?runs=3,5,8) so that a comparison can be bookmarked and sent."""
    ids = [run.id for run in summaries]
    labels = {run.id: widgets.summary_label(run) for run in summaries}
    if COMPARE_REQUEST in st.session_state:
        # Runs sent from the Runs page replace the picker's content once.
        st.session_state[PICKER_KEY] = [i for i in st.session_state.pop(COMPARE_REQUEST, []) if i in labels]
    elif state.url_list_changed(URL_PARAM):
        # An address opened or edited: it decides, and what in it names no run here is said, not replaced.
        st.session_state[PICKER_KEY], problems = state.url_run_ids(URL_PARAM, labels)
        for problem in problems:
            st.error(problem, icon=":material/error:")
    elif PICKER_KEY not in st.session_state:
        st.session_state[PICKER_KEY] = []
    picked = st.multiselect("Runs to compare", ids, key=PICKER_KEY, format_func=labels.__getitem__,
                            placeholder="Pick runs (type a run number, model or strategy)")
    state.put_url_list(URL_PARAM, picked)
    return picked


def show_speedups(table: pd.DataFrame) -> None:
    """The headline: how much faster each multi-device run is than one device."""
    baselines = names_where(lambda s: s.baseline)
    measured = table[(table["devices"] > 1) | ~table["strategy"].isin(baselines)].dropna(subset=["speedup"])
    if measured.empty:
        return
    rows = list(measured.itertuples())
    for start in range(0, len(rows), METRICS_PER_ROW):
        for column, row in zip(st.columns(METRICS_PER_ROW), rows[start:start + METRICS_PER_ROW]):
            column.metric(
                escape_markdown(f"Speedup of {row.label}"), f"{row.speedup:.2f}×",
                delta=f"{row.efficiency:.0%} scaling efficiency", delta_color="off", delta_arrow="off", border=True,
                help=f"{row.throughput_images_per_s:,.0f} images/s against single-device run #{row.baseline_run_id}.",
            )


def show_advice(runs: list[dict], table: pd.DataFrame) -> None:
    """The sweep report's one-sentence verdict, when the picked runs hold their own single-device
    baseline: without one, "fastest" would compare runs against nothing measured here."""
    if len(runs) < 2 or not any(is_baseline(r["strategy"]) and r["status"] == "completed" for r in runs):
        return
    with_status = table.assign(status=[run["status"] for run in runs])
    if waiting := waiting_for(with_status):
        st.info(escape_markdown(waiting), icon=":material/hourglass_top:")
    else:
        st.success(strategy_advice(with_status), icon=":material/lightbulb:")


def is_baseline(strategy: str) -> bool:
    known = find(strategy)  # None for a strategy only a newer version knows
    return known is not None and known.baseline


def scaling_display(table: pd.DataFrame, target_acc: float, mfu: pd.DataFrame,
                    peaks: dict[int, float | None] | None = None) -> pd.DataFrame:
    figures, peaks = mfu.set_index("run_id"), peaks or {}
    return pd.DataFrame({
        "run": table["label"],
        "devices": table["devices"],
        "effective batch": table["effective_batch"],
        IMAGES_PER_S_LABEL: table["throughput_images_per_s"].round(0),
        "MFU": table["run_id"].map(lambda i: efficiency.mfu_text(
            figures["mfu"].get(i), figures["achieved_tflops"].get(i), peaks.get(i))),
        "baseline (single)": table["baseline_run_id"].map(lambda i: f"#{i}" if pd.notna(i) else "none found"),
        "speedup (×)": table["speedup"].round(2),
        "efficiency": table["efficiency"].map(lambda e: f"{e:.0%}" if pd.notna(e) else "—"),
        f"time to {target_acc:.0%} val acc": table["time_to_target_s"].map(
            lambda s: widgets.format_duration(s) if pd.notna(s) else "not reached"),
    })


def show_scaling(runs: list[dict], epochs: pd.DataFrame, baselines: dict[tuple, int], colours: dict[int, str]) -> None:
    st.subheader("Strategy scaling")
    target_col, _ = st.columns([1, 3])
    target_acc = target_col.number_input(
        "Target validation accuracy", min_value=0.0, max_value=1.0, value=0.9, step=0.05, key="target_acc",
        help="Time to target: wall-clock training time until validation accuracy first reaches this.")
    table = scaling.scaling_table(runs, epochs, baselines, target_acc)
    show_advice(runs, table)
    show_speedups(table)
    mfu = efficiency.mfu_by_run(epochs[epochs["run_id"].isin(table["run_id"])])
    peaks = {run["id"]: (run.get("measurements") or {}).get("peak_tflops") for run in runs}
    st.dataframe(scaling_display(table, target_acc, mfu, peaks), hide_index=True,
                 column_config={IMAGES_PER_S_LABEL: st.column_config.NumberColumn(help=IMAGES_PER_S_HELP),
                                "MFU": st.column_config.TextColumn(help=efficiency.MFU_PEAK_NOTE)})
    if mfu["mfu"].notna().any():
        st.caption(efficiency.MFU_PEAK_NOTE)
    if mfu["mfu"].isna().any() and table["throughput_images_per_s"].notna().any():
        st.caption("MFU: '—' where a run recorded none (recorded before FLOPs were counted, or no peak FLOP/s "
                   "is known for its device).")
    if (table["efficiency"].dropna() > SUPERLINEAR).any():
        st.caption("Efficiency above 100 % means the single-device baseline was slower than one device's share "
                   "of this run: on a shared CPU, other load or thread contention can slow a one-process run. "
                   "Compare runs measured under the same conditions.")
    measured_epochs = epochs.groupby("run_id")["images_per_s"].count()
    one_epoch = [f"#{run_id}" for run_id, count in measured_epochs.items() if count == 1]
    if one_epoch:
        st.caption(f"{', '.join(one_epoch)} ran one epoch, so their throughput includes start-up costs "
                   "(with more epochs the first is left out): run two or more for a fair figure.")
    missing = table[table["baseline_run_id"].isna()]
    if not missing.empty:
        st.caption(escape_markdown("No completed single-device run with the same dataset, model, batch size, image "
                                   f"size and AMP for {', '.join(missing['label'])}: launch one to measure a speedup."))
    left, right = st.columns(2)
    left.plotly_chart(charts.speedup_figure(table, colours), key="speedup")
    right.plotly_chart(charts.efficiency_figure(table, colours), key="efficiency")
    efficiency_views.memory_breakdown(epochs, dict(zip(table["run_id"], table["label"])), key="compare_memory")
    efficiency_views.estimate_check(runs, epochs, dict(zip(table["run_id"], table["label"])),
                                    key="compare_memory_estimate")


def show_curves(epochs: pd.DataFrame, labels: dict[int, str], colours: dict[int, str],
                script_rows: pd.DataFrame | None = None) -> None:
    st.subheader("Curves")
    if script_rows is not None and not script_rows.empty:  # a script's val/acc on the accuracy chart, and so on
        epochs = pd.concat([epochs, script_rows.drop(columns="logged_as")], ignore_index=True)
    metric_col, x_col, log_col = st.columns([2, 1, 1], vertical_alignment="bottom")
    metric = metric_col.selectbox("Metric", list(charts.METRIC_TITLES), format_func=charts.METRIC_TITLES.get,
                                  key="compare_metric")
    x = x_col.radio("x axis", list(charts.X_AXES), format_func=charts.X_AXES.get, horizontal=True, key="compare_x")
    log = charts.is_loss(metric) and log_col.toggle("Log scale", key="compare_log", help=LOG_HELP)
    st.plotly_chart(charts.on_log_scale(
        charts.overlay_figure(epochs[epochs["run_id"].isin(labels)], metric, x, labels, colours), log), key="overlay")
    if script_rows is not None and (caption := script_views.shared_names_caption(script_rows)):
        st.caption(escape_markdown(caption))


def show_series(engine, run_ids: list[int], labels: dict[int, str], colours: dict[int, str]) -> None:
    """Per-step loss and images/s, and the machine's utilisation, overlaid across the runs, over
    time or steps; from at most SERIES_MAX_POINTS rows per run, whatever the runs' lengths."""
    st.subheader("Steps and system")
    steps = series_charts.steps_frame(series.read_steps(engine, run_ids, max_points=SERIES_MAX_POINTS))
    system = series_charts.system_frame(
        system_metrics.read_metric(engine, run_ids, series_charts.SYSTEM_METRICS, max_points=SERIES_MAX_POINTS))
    if steps.empty and system.empty:
        st.caption("None of the picked runs recorded per-step points or system samples: they were recorded "
                   "before Parallax kept them.")
        return
    metric_col, x_col, log_col = st.columns([2, 1, 1], vertical_alignment="bottom")
    metric = metric_col.selectbox("Series", list(series_charts.COMPARE_SERIES), key="compare_series",
                                  format_func=lambda name: series_charts.COMPARE_SERIES[name][0])
    x = x_col.radio("x axis", list(series_charts.X_TITLES), format_func=series_charts.X_TITLES.get,
                    horizontal=True, key="compare_series_x")
    log = charts.is_loss(metric) and log_col.toggle("Log scale", key="compare_series_log", help=LOG_HELP)
    frame = series_charts.compare_frame(steps, system, metric)
    st.plotly_chart(charts.on_log_scale(series_charts.compare_figure(frame, metric, x, labels, colours), log),
                    key="series_overlay")
    drawn = set(frame.dropna(subset=[x, "value"])["run_id"])
    left_out = [labels[run_id] for run_id in run_ids if run_id not in drawn]
    if left_out:
        why = "no such points or samples recorded"
        if x == "step" and series_charts.COMPARE_SERIES[metric][2] != "steps":
            why += " while the run was stepping (a sample finds its step from the run's step points)"
        st.caption(escape_markdown(f"Not drawn for {', '.join(left_out)}: {why}."))


st.title("Compare runs")
engine = state.engine_with_fresh_states()
# The picker lists the newest runs and those asked for (by the Runs page, the address or the picker itself).
asked = [*st.session_state.get(COMPARE_REQUEST, []), *st.session_state.get(PICKER_KEY, []),
         *(i for i in (store.parse_id(part) for part in state.url_list(URL_PARAM) or []) if i is not None)]
summaries = store.list_runs(engine, limit=PICKER_RUNS)
summaries += store.run_summaries(engine, set(asked) - {run.id for run in summaries})
if not summaries:
    st.info("No runs to compare yet.")
    st.page_link(state.LAUNCH_PAGE, label="Launch a run", icon=":material/rocket_launch:")
    st.stop()

picked_ids = pick_runs(summaries)
if not picked_ids:
    st.info("Pick two or more runs above, or tick them on the Runs page. Compare a DDP run with a "
            "single-device run of the same model and data to see the speedup.")
    st.stop()

runs = dashboard.runs_for_compare(engine, picked_ids)
for run in runs:  # a database shared with a newer version: its runs are shown with what this version reads
    if note := unknown_strategy_note(run["id"], run["strategy"], run["measurements"]):
        st.info(escape_markdown(note), icon=":material/update:")
# Like for like is judged among launched runs: a script's config is its own, and it is never a speedup's baseline.
problems = scaling.like_for_like_problems([run for run in runs if not script_views.is_script(run)])
if problems:
    st.warning(escape_markdown("These runs are not like for like, so their speedups compare different work: "
                               + "; ".join(problems) + "."), icon=":material/warning:")

baselines = scaling.pick_baselines(
    runs, dashboard.single_device_baselines(engine, [r["config"] for r in runs]))
wanted_ids = list(dict.fromkeys([*picked_ids, *baselines.values()]))
epochs = scaling.epochs_frame(store.read_epoch_metrics(engine, wanted_ids))
labels = {run["id"]: scaling.label_for(run) for run in runs}
# One name and one colour per run in every chart (and on the Sweeps page, for the same runs).
colours = scaling.run_colours(labels)

if scaling_runs := script_views.runs_for_scaling(runs):
    show_scaling(scaling_runs, epochs, baselines, colours)
script_ids = [run["id"] for run in runs if script_views.is_script(run)]
show_curves(epochs, labels, colours, script_views.shared_epoch_rows(engine, script_ids) if script_ids else None)

show_series(engine, picked_ids, labels, colours)
script_views.compare_section(engine, runs, labels, colours)

st.subheader("Config differences")
differences = scaling.config_differences(runs)
if differences.empty:
    st.caption("The picked runs agree on every config field they have in common." if len(runs) > 1
               else "Pick another run to see what differs.")
else:
    st.dataframe(differences)
if len(runs) > 1 and (unshared := scaling.unshared_fields(runs)):
    shown = ", ".join(unshared[:20]) + (f" and {len(unshared) - 20} more" if len(unshared) > 20 else "")
    st.caption(escape_markdown(f"Fields only some of the runs have (a script's config is its own; '—' where a run "
                               f"has none): {shown}."))

st.download_button(
    "Download the metrics (CSV)", scaling.metrics_csv(runs, epochs[epochs["run_id"].isin(labels)]),
    file_name=f"parallax-runs-{'-'.join(map(str, picked_ids))}.csv", mime="text/csv",
    on_click="ignore", icon=":material/download:",
)
