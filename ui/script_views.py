"""The views of script runs (users' own scripts logging through ``import parallax``): the logged metrics
charted by step, grouped by the prefix before its first "/" ("train/loss" under "train"), live while the
script runs (the first ``MAX_CHARTS`` names; a wider run's others through a search box over its names); its summary; and, on Compare, the logged metrics beside launched runs' own series, matched by
name ("train/loss", "train_loss" and "train loss" are one name).

The figure builders are pure (rows -> DataFrame -> Figure); the functions that draw take the engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from db import run_state, script_metrics, series
from reports import series_charts
from reports.charts import base_figure, is_loss, on_log_scale
from ui.text import escape_markdown
from contract.printable import plotly_text

SCRIPT_KIND = script_metrics.SCRIPT_KIND
POINT_COLUMNS = ("run_id", "name", "step", "t_s", "value", "min", "max", "n", "nonfinite")
NO_PREFIX = "other"
MAX_POINTS = 1000  # buckets per metric and run: about two per pixel column of a chart half a screen wide
# Charts drawn at once on a script run's page: a script may log thousands of names (a metric per layer or
# unit), and each chart costs the browser; the others are found with the search box over the names.
MAX_CHARTS = 12
MAX_CONTENT_SIZED_ROWS = 200  # a summary table longer than this takes the page's width, not its cells'
# A launched run's own series, under the names a script would log them by (``match_key``).
ENGINE_STEP_SERIES = ("train_loss", "images_per_s", "lr")
ENGINE_EPOCH_SERIES = ("train_acc", "val_loss", "val_acc")


def is_script(run: Any) -> bool:
    kind = run.get("kind") if isinstance(run, Mapping) else getattr(run, "kind", None)
    return kind == SCRIPT_KIND


def readable(run):
    """``run`` (a ``store.RunRecord``) as the pages read it: a script's devices as a list of names, whatever the
    script gave (2, "cuda:0", [0, 1]); other runs as they are."""
    devices = run.config.get("devices")
    if not is_script(run) or devices is None or (isinstance(devices, list) and all(isinstance(d, str) for d in devices)):
        return run
    names = [str(device) for device in devices] if isinstance(devices, list) else [str(devices)]
    return dataclasses.replace(run, config={**run.config, "devices": names})


def scaling_applies(config: Mapping[str, Any]) -> bool:
    """Strategy scaling (speedup, efficiency) compares strategies over devices: a script run takes part
    only where its config names both (``strategy`` and ``devices``)."""
    return bool(config.get("strategy")) and bool(config.get("devices"))


def match_key(name: str) -> str:
    return name.strip().lower().replace("/", "_").replace(" ", "_").replace("-", "_")


def points_frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Points or buckets as a table; a point of its own is a bucket of one (its minimum and maximum its value)."""
    frame = pd.DataFrame(list(rows), columns=list(POINT_COLUMNS))
    frame["min"] = frame["min"].fillna(frame["value"])
    frame["max"] = frame["max"].fillna(frame["value"])
    frame["n"] = frame["n"].fillna(1)
    frame["nonfinite"] = frame["nonfinite"].fillna(0)
    return frame


def by_prefix(names: Iterable[str]) -> dict[str, list[str]]:
    """Metric names grouped by the prefix before their first "/", groups in order, names sorted."""
    groups: dict[str, list[str]] = {}
    for name in sorted(names):
        prefix = name.split("/", 1)[0] if "/" in name else NO_PREFIX
        groups.setdefault(prefix, []).append(name)
    return dict(sorted(groups.items(), key=lambda item: (item[0] == NO_PREFIX, item[0])))


def pick_names(names: list[str], search: str, limit: int = MAX_CHARTS) -> tuple[list[str], int]:
    """The first ``limit`` of ``names`` holding every word of ``search`` (any case), and how many hold them."""
    words = search.lower().split()
    matching = [name for name in names if all(word in name.lower() for word in words)]
    return matching[:limit], len(matching)


def drawn_caption(shown: int, matching: int, total: int, search: str) -> str | None:
    """What the page says of the charts it drew, where it drew fewer than the names there are."""
    if not search.strip():
        return None if shown == total else (f"The first {shown} of {total:,} logged metrics are drawn, in name order; "
                                            "search the names to draw others.")
    if not matching:
        return f"No logged metric name holds {search.strip()!r}."
    if shown < matching:
        return (f"{shown} of the {matching:,} metric names holding {search.strip()!r} are drawn: search "
                "for more of a name to draw the others.")
    return f"The {matching:,} metric name{'s' * (matching != 1)} holding {search.strip()!r}."


def metric_figure(frame: pd.DataFrame, name: str, labels: Mapping[int, str] | None = None,
                  colours: Mapping[int, str] | None = None) -> go.Figure:
    """``name`` over steps, one band and line per run in ``frame`` (named by ``labels`` where there are several):
    each bucket's minimum to maximum as a band, its last value as the line (``series_charts.banded_traces``)."""
    rows = frame[frame["name"] == name]
    bucketed = int(rows["n"].max()) if len(rows) else 1
    title = plotly_text(name) + (f"<br><sup>line: the last value of every {bucketed:,} steps or fewer; band: their "
                                 "minimum to maximum</sup>" if bucketed > 1 else "")
    figure = base_figure(title, "step", "")
    several = bool(labels) and len(labels) > 1
    for run_id, points in rows.groupby("run_id", sort=False):
        series_charts.banded_traces(figure, points, name=plotly_text((labels or {}).get(run_id, f"#{run_id}")),
                                    colour=(colours or {}).get(run_id), showlegend=several)
    figure.update_layout(showlegend=several)
    return figure


def engine_points(step_rows: Iterable[Mapping[str, Any]], epoch_rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """A launched run's series as script points: its step points by step, and its epochs' accuracy and
    validation loss at the last step of each epoch (where step points say which that is)."""
    step_rows, rows = list(step_rows), []
    last_step: dict[tuple[int, int], int] = {}
    for row in step_rows:
        key = (row["run_id"], row["epoch"])
        last_step[key] = max(last_step.get(key, 0), row["step"])
        rows += [{"run_id": row["run_id"], "name": name, "step": row["step"], "t_s": row["t_s"], "value": row[name],
                  "n": row.get("n", 1)} for name in ENGINE_STEP_SERIES if row.get(name) is not None]
    for row in epoch_rows:
        step = last_step.get((row["run_id"], row["epoch"]))
        if step is not None:
            rows += [{"run_id": row["run_id"], "name": name, "step": step, "t_s": None, "value": row[name], "n": 1}
                     for name in ENGINE_EPOCH_SERIES if row.get(name) is not None]
    return points_frame(rows)


# --- what the pages draw ---------------------------------------------------------------------


def run_section(engine, run) -> None:
    """A script run's Run page body: its logged metrics (live while it runs) and summary."""
    active = run.status in run_state.ACTIVE_STATUSES
    script = run.measurements.get("script") or {}
    where = f" · {escape_markdown(script['file'])}" if script.get("file") else ""
    st.caption(f"A script run (`import parallax`) of project **{escape_markdown(str(script.get('project', '')))}**"
               f"{where}. Its config is the script's own.")
    if not scaling_applies(run.config):
        st.caption("Strategy scaling (speedup, efficiency) does not apply: the script's config names no "
                   "`strategy` and `devices`.")
    if line := log_wait_line(run.measurements):
        st.caption(line)
    # No timer: while the run is active its charts grow from the page's own document (ui/script_feed.py), and a
    # new metric name, like a new status, reruns the page from its progress tick (pages/run.py).
    st.fragment(_live_metrics)(run.id, active)
    summary = run.measurements.get("summary") or {}
    if summary:
        with st.expander("Summary (the last value of each metric, and what the script set)"):
            # Sized to its content only where that is a glance: the browser measures every cell to do it, and
            # a script logging thousands of metrics has a row for each (half a minute for 10,000 on two cores).
            st.dataframe(pd.DataFrame({"value": [str(value) for value in summary.values()]}, index=list(summary)),
                         width="content" if len(summary) <= MAX_CONTENT_SIZED_ROWS else "stretch")


def log_wait_line(measurements: Mapping[str, Any]) -> str | None:
    """What ``parallax.log`` waited for the database (back-pressure), in one line; None where it never waited."""
    wait = measurements.get(script_metrics.LOG_WAIT_KEY) or {}
    if not wait.get("waits"):
        return None
    return (f"parallax.log waited {wait['waited_s']:,.1f} s in all ({wait['waits']:,} calls) for the database to take "
            "what the script logged: that time went to logging, not training. Logging less often, or fewer values "
            "per call, takes it back.")


@st.cache_data(max_entries=64, show_spinner=False)
def bucketed_points(database: str, run_ids: tuple[int, ...], version: tuple, window: tuple[int, int] | None,
                    names: tuple[str, ...] | None = None, max_points: int = MAX_POINTS) -> pd.DataFrame:
    """``read_points`` of the runs (of ``names`` only, where given), cached for as long as ``version`` (what each
    run has stored) stands: a finished run's charts are read once; ``database`` keeps two databases' runs apart."""
    from ui import state

    first, last = window if window is not None else (None, None)
    return points_frame(script_metrics.read_points(state.engine(), list(run_ids), max_points=max_points,
                                                   names=None if names is None else list(names),
                                                   first_step=first, last_step=last))


def step_window(run_id: int, last_step: int) -> tuple[int, int] | None:
    """The steps the charts show, from a range picker: None for every step (the charts follow a live run).
    A window holding no more values than a chart's buckets is read at full resolution."""
    key = f"script_window_{run_id}"
    chosen = st.session_state.get(key)
    if last_step < 2:
        return None
    shown = chosen if chosen is not None and chosen[1] <= last_step else (0, last_step)
    # No widget key: a new last step makes a new slider, which starts from the window kept here.
    picked = st.slider("Steps shown (narrow it to see every value)", min_value=0, max_value=last_step, value=shown)
    if tuple(picked) != tuple(shown):
        chosen = None if tuple(picked) == (0, last_step) else tuple(picked)
        st.session_state[key] = chosen
    return chosen


def _live_metrics(run_id: int, active: bool = False) -> None:
    from ui import script_feed, state

    engine = state.engine()
    names = script_metrics.run_metric_names(engine, run_id)  # the names only: a row each, no value read
    if not names:
        st.caption("Charts appear when the script logs its first values (parallax.log).")
        return
    stored, last_step = script_metrics.points_logged(engine, run_id), script_metrics.last_logged_step(engine, run_id)
    search = ""
    if len(names) > MAX_CHARTS:
        search = st.text_input(f"Search the {len(names):,} logged metric names", key=f"script_metric_search_{run_id}",
                               placeholder="a part of a name, e.g. loss or layer3/ (every word must be in it)", max_chars=200)
    shown, matching = pick_names(names, search)
    caption = drawn_caption(len(shown), matching, len(names), search)
    if caption:
        st.caption(escape_markdown(caption))
    log_loss = st.session_state.get(state.LOG_LOSS_KEY, False)
    window = step_window(run_id, int(last_step or 0))
    if active and window is None and shown:
        # Following the run: the charts are drawn and grown in the browser, from the values after the last step
        # each holds, with no rerun of the page; the same document on every rerun, so the browser keeps it.
        groups = by_prefix(shown)
        st.iframe(script_feed.feed_html(run_id, groups, log_loss=log_loss), height=script_feed.height_px(groups))
        frame = None
    else:
        frame = bucketed_points(str(engine.url), (run_id,), (stored,), window, tuple(shown)) if shown else points_frame([])
        _draw_charts(frame, log_loss)

    def every_metric_csv() -> str:  # read when the button is pressed, not at every draw of a wide run
        first, last = window if window is not None else (None, None)
        every = points_frame(script_metrics.read_points(state.engine(), [run_id], max_points=MAX_POINTS,
                                                        first_step=first, last_step=last))
        return every[list(POINT_COLUMNS)].to_csv(index=False)

    st.download_button("Download the logged metrics (CSV)",
                       every_metric_csv if frame is None or len(names) > len(shown)
                       else frame[list(POINT_COLUMNS)].to_csv(index=False),
                       file_name=f"parallax-run-{run_id}-metrics.csv", mime="text/csv", on_click="ignore",
                       icon=":material/download:", key="script_metrics_csv",
                       help="Each bucket's last value, minimum, maximum and count as charted; `parallax export` "
                            "writes every value.")


def _draw_charts(frame: pd.DataFrame, log_loss: bool) -> None:
    for prefix, group in by_prefix(frame["name"].unique()).items():
        st.markdown(f"**{escape_markdown(prefix)}**")
        columns = st.columns(2)
        for index, name in enumerate(group):
            figure = on_log_scale(metric_figure(frame, name), log_loss and is_loss(name))
            columns[index % 2].plotly_chart(figure, key=f"script_metric_{name}")


def progress_line(engine, run) -> None:
    """How far a script run is, in its own terms: the last step it logged (a script has no epochs Parallax
    knows of, so no "epoch 0 of 1")."""
    step = script_metrics.last_logged_step(engine, run.id)
    if step is None:
        st.caption("Waiting for the script's first logged values (parallax.log)."
                   if run.status in run_state.ACTIVE_STATUSES else "The script logged no values.")
    elif run.status in run_state.ACTIVE_STATUSES:
        st.caption(f"Logging: step {step:,} so far.")
    else:
        st.caption(f"Logged up to step {step:,}.")


def shared_epoch_rows(engine, run_ids: list[int]) -> pd.DataFrame:
    """The script runs' logged metrics that mean a shared series ("val/acc", "val_acc", "accuracy/val": the
    validation accuracy; ``db.run_figures.SHARED_NAMES``) as rows of the per-epoch charts: the n-th value of a
    series is its epoch n, unless the script logged an ``epoch`` metric at that step, and its time since the
    start is its wall time."""
    from db.run_figures import name_key, shared_name

    rows = []
    wanted = {name for names in script_metrics.metric_names(engine, run_ids).values() for name in names
              if shared_name(name) is not None or name_key(name) == "epoch"}  # not every name of a wide run
    if not wanted:
        return pd.DataFrame(rows)
    points = points_frame(script_metrics.read_points(engine, run_ids, names=wanted, max_points=MAX_POINTS))
    for run_id, logged in points.groupby("run_id", sort=False):
        epochs_at = {int(step): value for step, value in
                     logged[logged["name"].map(name_key) == "epoch"][["step", "value"]].itertuples(index=False)}
        for name, series_points in logged.groupby("name", sort=False):
            shared = shared_name(name)
            if shared is None:
                continue
            for index, point in enumerate(series_points.sort_values("step").itertuples(), start=1):
                epoch = epochs_at.get(int(point.step))
                rows.append({"run_id": run_id, "epoch": int(epoch) if epoch is not None else index,
                             "wall_time_s": point.t_s, shared: point.value, "logged_as": name})
    return pd.DataFrame(rows)


def shared_names_caption(rows: pd.DataFrame) -> str | None:
    """The caption saying which script metrics the shared charts draw, and as what."""
    if rows.empty:
        return None
    from db.run_figures import shared_name

    pairs = sorted({(name, shared_name(name)) for name in rows["logged_as"].unique()})
    return ("Script runs on these charts: " + ", ".join(f"{name} as {shared}" for name, shared in pairs)
            + " (common names mapped onto the shared series; the n-th value logged is epoch n, unless the script "
            "logged an `epoch` at that step).")


def runs_for_scaling(runs: list[dict]) -> list[dict]:
    """The runs the Compare page's strategy scaling takes: launched runs, and script runs whose config names
    a strategy and devices; a caption says which were left out."""
    left_out = [run for run in runs if is_script(run) and not scaling_applies(run["config"])]
    if left_out:
        st.caption("Strategy scaling does not apply to " + ", ".join(f"#{run['id']}" for run in left_out)
                   + ": script runs whose config names no `strategy` and `devices`.")
    return [run for run in runs if run not in left_out]


def compare_section(engine, runs: list[dict], labels: Mapping[int, str], colours: Mapping[int, str]) -> None:
    """The picked script runs' logged metrics, each beside the other runs' series of the same name."""
    script_ids = [run["id"] for run in runs if is_script(run)]
    if not script_ids:
        return
    from db import store

    st.subheader("Logged metrics (script runs)")
    scripts = bucketed_points(str(engine.url), tuple(script_ids),
                              tuple(script_metrics.points_logged(engine, run_id) for run_id in script_ids), None)
    others = [run["id"] for run in runs if not is_script(run)]
    launched = engine_points(series.read_steps(engine, others, max_points=MAX_POINTS),
                             store.read_epoch_metrics(engine, others)) if others else points_frame([])
    frame = pd.concat([scripts, launched], ignore_index=True) if not launched.empty else scripts
    if frame.empty:
        st.caption("The picked script runs logged nothing yet.")
        return
    frame["key"] = frame["name"].map(match_key)
    shown = dict.fromkeys(scripts["name"].map(match_key))  # each metric a script logged, once
    names = {key: next(name for name in scripts["name"] if match_key(name) == key) for key in shown}
    columns = st.columns(2)
    for index, (key, name) in enumerate(names.items()):
        matched = frame[frame["key"] == key].assign(name=name)
        columns[index % 2].plotly_chart(metric_figure(matched, name, labels, colours), key=f"compare_script_{key}")
    st.caption("Launched runs join a chart where they record a series of the same name (train_loss, "
               "images_per_s, lr per step; train_acc, val_loss, val_acc at each epoch's last step).")
    st.download_button("Download the logged metrics of the script runs (CSV)",
                       scripts.drop(columns="n").to_csv(index=False), mime="text/csv", on_click="ignore",
                       file_name=f"parallax-script-runs-{'-'.join(map(str, script_ids))}.csv",
                       icon=":material/download:", key="compare_script_csv")
