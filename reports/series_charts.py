"""Figures of a run's per-step points and per-second system samples: pure functions, no streamlit.

Rows come from ``db.series.read_steps`` and ``db.system_metrics.read_metric`` (of ``SYSTEM_METRICS``; both
already reduced to buckets in the database); the frames built here hold them as tables, and each figure is a
function ``frame -> Figure``. A frame without the data a chart needs gives a figure without traces, never an
exception.

    steps, system = steps_frame(step_rows), system_frame(metric_rows)
    marks = epoch_marks(epochs, steps)
    step_figure(steps, "train_loss", marks)          # loss per step, epoch starts dotted
    system_figure(system, "cpu_pct", marks)         # host and each rank over time
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from plotly.colors import DEFAULT_PLOTLY_COLORS

from reports.charts import base_figure, fit_y_axis, has_values
from contract.printable import plotly_text

STEP_COLUMNS = ("run_id", "epoch", "step", "t_s", "train_loss", "images_per_s", "lr", "n", "first_step",
                "train_loss_min", "train_loss_max", "images_per_s_min", "images_per_s_max")
SYSTEM_VALUES = ("cpu_pct", "memory_mb", "util_pct", "power_w", "temperature_c")
SYSTEM_COLUMNS = ("run_id", "t_s", "device", "kind", *SYSTEM_VALUES, "node", "n",
                  *(f"{column}_{end}" for column in SYSTEM_VALUES for end in ("min", "max")))
# The stored system series the charts read ((kind, metric), see db.system_metrics) and the column each fills:
# a rank's resident memory and a GPU's memory used share the memory chart with the host's.
SYSTEM_METRICS = {("host", "cpu_pct"): "cpu_pct", ("host", "memory_mb"): "memory_mb",
                  ("process", "cpu_pct"): "cpu_pct", ("process", "rss_mb"): "memory_mb",
                  ("gpu", "util_pct"): "util_pct", ("gpu", "memory_used_mb"): "memory_mb",
                  ("gpu", "power_w"): "power_w", ("gpu", "temperature_c"): "temperature_c"}
KIND_ORDER = ("host", "process", "gpu")
MARK_COLUMNS = ("epoch", "step", "t_s")
BAND_ALPHA = 0.25  # a bucket's minimum-to-maximum band, in its line's colour
MAX_LABELLED_MARKS = 30  # beyond this many epoch lines, labels would pile up: lines only

STEP_TITLES = {"train_loss": ("Training loss per step", "loss"),
               "images_per_s": ("Throughput per step", "images/s (global batch)")}
# What each system chart shows, and of which devices: (title, y axis, kinds of device). What a line
# measures goes under the title: an axis title longer than the chart is tall runs into the title.
SYSTEM_CHARTS = {
    "cpu_pct": ("CPU utilisation<br><sup>host: % of all cores; ranks: % of one core</sup>", "%", ("host", "process")),
    "memory_mb": ("Memory<br><sup>host: used; ranks: resident; GPUs: used</sup>", "MB", ("host", "process", "gpu")),
    "util_pct": ("GPU utilisation", "%", ("gpu",)),
    "power_w": ("GPU power", "W", ("gpu",)),
}
# Fewer points than this are drawn with markers (a line of one point is an empty frame).
FEW_POINTS = 30
X_TITLES = {"t_s": "Time since the run started (s)", "step": "Step"}
# The share of a core a watched run's step and system charts may keep busy: a rebuild that took
# B seconds waits B / REBUILD_SHARE seconds for the next (20 ms: every tick; 0.3 s, for a run of
# hundreds of thousands of rows on a busy 2-core machine: every 15 s).
REBUILD_SHARE = 0.02
# Compare: one line per run. (title, y axis, where it comes from, how a sample's devices combine;
# the machines of a run across machines combine alike: see compare_frame)
COMPARE_SERIES: dict[str, tuple[str, str, str, str]] = {
    "train_loss": ("Training loss per step", "loss", "steps", ""),
    "images_per_s": ("Throughput per step", "images/s", "steps", ""),
    "gpu_util_pct": ("GPU utilisation (mean over the run's GPUs)", "%", "gpu:util_pct", "mean"),
    "host_cpu_pct": ("Host CPU (of all cores; mean over the run's machines)", "%", "host:cpu_pct", "mean"),
    "process_cpu_pct": ("The run's processes: CPU (sum over ranks, of one core)", "%", "process:cpu_pct", "sum"),
    "process_rss_mb": ("The run's processes: resident memory (sum over ranks)", "MB", "process:memory_mb", "sum"),
    "gpu_memory_mb": ("GPU memory used (sum over the run's GPUs)", "MB", "gpu:memory_mb", "sum"),
    "gpu_power_w": ("GPU power (sum over the run's GPUs)", "W", "gpu:power_w", "sum"),
}


def banded_traces(figure: go.Figure, frame: pd.DataFrame, *, name: str, colour: str | None = None,
                  x: str = "step", value: str = "value", showlegend: bool = False) -> None:
    """Add one series reduced to buckets (``db.script_metrics.read_points`` rows: ``x``, ``value``, ``min``,
    ``max``, ``n``, ``nonfinite``) as W&B draws it: see ``banded_scatters``."""
    figure.add_traces(banded_scatters(frame, name=name, colour=colour, x=x, value=value, showlegend=showlegend))


def banded_scatters(frame: pd.DataFrame, *, name: str, colour: str | None = None, x: str = "step",
                    value: str = "value", showlegend: bool = False) -> list[go.Scatter]:
    """One series reduced to buckets as W&B draws it: a band from each bucket's minimum to its maximum, where a
    bucket holds several values, a line through each bucket's last value, and a red cross on each bucket that
    holds a NaN or an infinity. A one-step spike is the band's top, never averaged away. The traces, for one
    ``add_traces`` of every series of a figure (a trace added at a time costs several times more)."""
    frame = frame.sort_values(x)
    colour = colour or DEFAULT_PLOTLY_COLORS[0]
    traces = []
    if "n" in frame and (frame["n"] > 1).any():
        common = dict(x=frame[x], mode="lines", line=dict(width=0, color=colour), hoverinfo="skip", showlegend=False,
                      legendgroup=name, connectgaps=False)
        traces.append(go.Scatter(y=frame["max"], name=f"{name} max", **common))
        traces.append(go.Scatter(y=frame["min"], name=f"{name} min", fill="tonexty",
                                 fillcolor=with_alpha(colour, BAND_ALPHA), **common))
    drawn = frame[frame[value].notna()]
    details = np.column_stack([drawn[column].to_numpy(dtype=float) if column in drawn else np.full(len(drawn), np.nan)
                               for column in ("min", "max", "n")]) if len(drawn) else None
    traces.append(go.Scatter(x=drawn[x], y=drawn[value], name=name, mode=line_mode(len(drawn)), showlegend=showlegend,
                             legendgroup=name, line=dict(color=colour), customdata=details,
                             hovertemplate=(f"{plotly_text(name)}: %{{y:.4g}}<br>min %{{customdata[0]:.4g}}, max "
                                            "%{customdata[1]:.4g} of %{customdata[2]:,} values<extra></extra>")))
    if "nonfinite" in frame and (frame["nonfinite"] > 0).any():
        bad = frame[frame["nonfinite"] > 0]
        at = bad["max"].fillna(bad[value]).fillna(bad["min"]).fillna(0.0)
        traces.append(go.Scatter(x=bad[x], y=at, mode="markers", name=f"{name}: NaN or infinite", showlegend=False,
                                 marker=dict(symbol="x", color="crimson", size=8), customdata=bad["nonfinite"],
                                 hovertemplate="%{customdata:,} NaN or infinite value(s)<extra></extra>"))
    return traces


def with_alpha(colour: str, alpha: float) -> str:
    """``colour`` ("#rrggbb" or "rgb(r, g, b)") as rgba with ``alpha``: a band in its line's colour."""
    if colour.startswith("#") and len(colour) == 7:
        red, green, blue = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    elif colour.startswith("rgb(") and colour.endswith(")"):
        red, green, blue = (int(float(part)) for part in colour[4:-1].split(","))
    else:
        return colour
    return f"rgba({red}, {green}, {blue}, {alpha})"


def rebuild_due(build_s: float, since_build_s: float) -> bool:
    """Whether new rows may be charted now: the last rebuild took ``build_s`` seconds and ended
    ``since_build_s`` ago (see ``REBUILD_SHARE``)."""
    return since_build_s * REBUILD_SHARE >= build_s


def steps_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The step points as a table (``STEP_COLUMNS``), by run then step."""
    frame = pd.DataFrame(rows, columns=list(STEP_COLUMNS))
    frame["n"] = frame["n"].fillna(1)
    frame["first_step"] = frame["first_step"].fillna(frame["step"])
    for column in ("train_loss", "images_per_s"):  # a point of its own is a bucket of one
        frame[f"{column}_min"] = frame[f"{column}_min"].fillna(frame[column])
        frame[f"{column}_max"] = frame[f"{column}_max"].fillna(frame[column])
    return frame.astype({column: float for column in STEP_COLUMNS[4:7] + STEP_COLUMNS[9:]})


def system_frame(rows: list[dict[str, Any]], hosts: dict[int, list[str]] | None = None) -> pd.DataFrame:
    """The system series (``db.system_metrics.read_metric`` rows of ``SYSTEM_METRICS``) as a long table
    (``SYSTEM_COLUMNS``): a row per moment (or bucket) and device, the device being the host, a rank ("rank 0",
    its DataLoader workers included) or a GPU ("GPU 0"), with each figure's last value and, for a bucket, its
    minimum and maximum (``cpu_pct_min``, ``cpu_pct_max``, ...) and how many samples it holds (``n``).

    A run across machines (``hosts``: {run_id: the run's host names by node}, or samples of several
    nodes) names its hosts and GPUs by machine: "host gpu-a", "GPU 0 on gpu-a" ("node 1 (gpu-a)"
    and "GPU 0 on node 1 (gpu-a)" where machines share a name). Ranks are global: "rank N" still."""
    machines = _machine_names(rows, hosts or {})
    records: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        column = SYSTEM_METRICS.get((row["kind"], row["metric"]))
        if column is None or row["kind"] not in KIND_ORDER:
            continue
        node, kind, device = row.get("node") or 0, row["kind"], row["device"]
        moment = row["t_s"] if row.get("bucket") is None else ("bucket", row["bucket"])
        record = records.get((row["run_id"], node, kind, device, moment))
        if record is None:
            host, machine = machines.get((row["run_id"], node), ("host", None))
            label = {"host": host, "process": f"rank {device}"}.get(
                kind, f"GPU {device}" + (f" on {machine}" if machine else ""))
            record = records[row["run_id"], node, kind, device, moment] = {
                "run_id": row["run_id"], "t_s": row["t_s"], "device": label, "kind": kind, "node": node, "n": 0}
        record["t_s"] = max(record["t_s"], row["t_s"])  # a bucket's figures at its last sample
        record["n"] = max(record["n"], row.get("n") or 1)
        record[column] = row["value"]
        record[f"{column}_min"] = row.get("min", row["value"])
        record[f"{column}_max"] = row.get("max", row["value"])
    # By run, moment and machine, each machine's host before its ranks before its GPUs: the legend's order.
    order = sorted(records, key=lambda key: (key[0], records[key]["t_s"], key[1], KIND_ORDER.index(key[2]), key[3]))
    frame = pd.DataFrame([records[key] for key in order], columns=list(SYSTEM_COLUMNS))
    numeric = ["t_s", *SYSTEM_VALUES, *SYSTEM_COLUMNS[len(SYSTEM_COLUMNS) - 2 * len(SYSTEM_VALUES):]]
    return frame.astype({**{column: float for column in numeric}, "node": int, "n": int})


def _machine_names(rows: list[dict[str, Any]], hosts: dict[int, list[str]]) -> dict[tuple[int, int], tuple[str, str]]:
    """{(run_id, node): (its host's label, the machine's name for its GPUs)} for each run across
    machines; runs of one machine have none."""
    nodes: dict[int, set[int]] = {}
    for row in rows:  # a run's series or samples: each names its machine's node
        nodes.setdefault(row["run_id"], set()).add(row.get("node") or 0)
    names = {}
    for run_id, seen in nodes.items():
        known = list(hosts.get(run_id) or [])
        every = sorted(seen | set(range(len(known))))
        if len(every) <= 1:
            continue
        by_node = {node: known[node] if node < len(known) else None for node in every}
        shared = {name for name in by_node.values() if list(by_node.values()).count(name) > 1}
        for node, name in by_node.items():
            if name is None or name in shared:  # told apart by node
                machine = f"node {node}" if name is None else f"node {node} ({name})"
                names[run_id, node] = (machine, machine)
            else:
                names[run_id, node] = (f"host {name}", name)
    return names


def epoch_marks(epochs: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Where each epoch after the first starts (``MARK_COLUMNS``): its first step, and on the time
    axis the end of the previous epoch's training (its ``t_end_s``; the epoch's first step where an
    epoch has none), so that the gap between the line and the next points is its validation."""
    first = steps.groupby("epoch").agg(step=("first_step", "min"), t_s=("t_s", "min")) if not steps.empty else None
    ends: dict[int, float] = {}
    if not epochs.empty and "extra" in epochs:
        for epoch, extra in zip(epochs["epoch"], epochs["extra"]):
            if isinstance(extra, dict) and extra.get("t_end_s") is not None:
                ends[int(epoch)] = float(extra["t_end_s"])
    known = set(first.index if first is not None else []) | set(int(e) for e in epochs.get("epoch", []))
    marks = []
    for epoch in sorted(e for e in known if e >= 2):
        stepped = first is not None and epoch in first.index
        step = first.loc[epoch, "step"] if stepped else np.nan
        t_s = ends.get(epoch - 1, first.loc[epoch, "t_s"] if stepped else np.nan)
        if pd.notna(step) or pd.notna(t_s):
            marks.append({"epoch": epoch, "step": step, "t_s": t_s})
    return pd.DataFrame(marks, columns=list(MARK_COLUMNS))


def line_mode(points: int) -> str:
    """A line alone draws nothing for one point: a short series gets its markers too."""
    return "lines+markers" if points < FEW_POINTS else "lines"


def step_figure(steps: pd.DataFrame, column: str, marks: pd.DataFrame | None = None) -> go.Figure:
    """``column`` ("train_loss" or "images_per_s") over steps, with a dotted line where each epoch starts."""
    title, y_title = STEP_TITLES[column]
    bucketed = int(steps["n"].max()) if not steps.empty else 1
    if bucketed > 1:  # say what a point is: a bucket's last step, its band the bucket's range
        title += f"<br><sup>line: the last of every {bucketed:,} recorded steps or fewer; band: their minimum to maximum</sup>"
    figure = base_figure(title, X_TITLES["step"], y_title)
    if has_values(steps, column):
        banded_traces(figure, steps.rename(columns={f"{column}_min": "min", f"{column}_max": "max"})
                      .assign(nonfinite=0), name=column, value=column)
    _mark(figure, marks, "step")
    return fit_y_axis(figure)


def system_figure(system: pd.DataFrame, metric: str, marks: pd.DataFrame | None = None) -> go.Figure:
    """``metric`` of each device (``SYSTEM_CHARTS``) over the run's time, one line per device; where the
    database reduced the samples to buckets, each bucket's minimum-to-maximum band around its line, so that a
    one-second spike is drawn, never averaged away."""
    title, y_title, kinds = SYSTEM_CHARTS[metric]
    shown = system[system["kind"].isin(kinds)]
    bucketed = int(shown["n"].max()) if not shown.empty else 1
    if bucketed > 1:
        title += f"<br><sup>line: the last of every {bucketed:,} samples or fewer; band: their minimum to maximum</sup>"
    figure = base_figure(title, X_TITLES["t_s"], y_title)
    traces = []
    for index, (device, rows) in enumerate(shown.groupby("device", sort=False)):
        if has_values(rows, metric):
            traces += banded_scatters(rows.rename(columns={f"{metric}_min": "min", f"{metric}_max": "max"}),
                                      name=str(device), colour=DEFAULT_PLOTLY_COLORS[index % len(DEFAULT_PLOTLY_COLORS)],
                                      x="t_s", value=metric, showlegend=True)
    figure.add_traces(traces)
    _mark(figure, marks, "t_s")
    return fit_y_axis(figure)


def system_charts_for(system: pd.DataFrame) -> list[str]:
    """The ``SYSTEM_CHARTS`` this run's samples can fill: GPU charts only where there are GPU samples."""
    return [metric for metric, (_, _, kinds) in SYSTEM_CHARTS.items()
            if has_values(system[system["kind"].isin(kinds)], metric)]


def missing_series(devices: list[str], active: bool, steps: pd.DataFrame, system: pd.DataFrame,
                   *, own_steps: bool = False) -> list[str]:
    """One line for each kind of chart the Run page cannot draw for this run, saying why. ``own_steps``: a
    script's run, whose steps are the metrics it logged (charted apart), never Parallax's step points."""
    if own_steps:
        return [] if not system.empty else (
            ["System charts appear with the script's first samples."] if active
            else ["No system samples: the script's sampler recorded none (see the run's notes)."])
    if steps.empty and system.empty:
        if active:
            return ["Per-step and system charts appear with the run's first recorded steps and samples."]
        return ["No per-step points or system samples: this run was recorded before Parallax kept them, "
                "or ended before its first step."]
    lines = []
    if steps.empty and not active:  # while active, the live charts say they wait for the first step
        lines.append("No per-step points: the run recorded none (they are written a few seconds' worth at a time).")
    if system.empty:
        lines.append("No system samples: the run's sampler recorded none (see the run's notes).")
    elif not (system["kind"] == "gpu").any():
        if any(str(device).startswith("cuda") for device in devices):
            lines.append("No GPU samples: NVML could not be read where the run trained (see the run's notes).")
        else:
            lines.append("No GPU charts: the run trained on CPU processes only.")
    return lines


def compare_frame(steps: pd.DataFrame, system: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One value per run and moment for ``metric`` (``COMPARE_SERIES``): run_id, t_s, step, value.

    A sample's devices combine as the metric says (mean or sum). A run across machines samples each
    machine on its own clock: its moments are those of its first machine's samples, and each other
    machine adds its sample nearest in time, within the gap between its own samples; a moment that
    some machine has no sample near is left out rather than drawn as if that machine read nothing.
    A sample's step is interpolated from the run's step points by time, and is NaN outside them:
    on a step axis only samples taken while the run was stepping are drawn."""
    _, _, source, combine = COMPARE_SERIES[metric]
    if source == "steps":  # each bucket's last point, and its range: the chart draws it as a band
        return steps[["run_id", "t_s", "step", metric, f"{metric}_min", f"{metric}_max", "n"]].rename(
            columns={metric: "value", f"{metric}_min": "min", f"{metric}_max": "max"})
    kind, column = source.split(":")
    rows = system[(system["kind"] == kind) & system[column].notna()]
    # Each machine's sample first: its devices' total and how many there are, for a sum or a mean.
    per_sample = (rows.groupby(["run_id", "node", "t_s"], sort=True)[column].agg(["sum", "count"])
                  .rename(columns={"sum": "total"}).reset_index())
    values = pd.concat([_across_machines(of_run) for _, of_run in per_sample.groupby("run_id", sort=True)]
                       or [pd.DataFrame(columns=["run_id", "t_s", "total", "count"])], ignore_index=True)
    values["value"] = values["total"] if combine == "sum" else values["total"] / values["count"]
    values["step"] = np.nan
    for run_id, points in steps.groupby("run_id"):
        at = values["run_id"] == run_id
        t_s = values.loc[at, "t_s"].to_numpy(dtype=float)
        inside = (t_s >= points["t_s"].min()) & (t_s <= points["t_s"].max())
        stepped = np.interp(t_s, points["t_s"].to_numpy(), points["step"].to_numpy())
        values.loc[at, "step"] = np.where(inside, stepped, np.nan)
    return values[["run_id", "t_s", "step", "value"]].astype({"t_s": float, "step": float, "value": float})


def _across_machines(of_run: pd.DataFrame) -> pd.DataFrame:
    """One run's per-machine totals (run_id, node, t_s, total, count) at the moments of its first
    machine, each other machine's nearest sample added in (see ``compare_frame``)."""
    nodes = sorted(of_run["node"].unique())
    moments = of_run[of_run["node"] == nodes[0]][["run_id", "t_s", "total", "count"]].reset_index(drop=True)
    for node in nodes[1:]:
        other = of_run[of_run["node"] == node][["t_s", "total", "count"]].reset_index(drop=True)
        gaps = np.diff(other["t_s"].to_numpy())
        near = pd.merge_asof(moments[["t_s"]], other, on="t_s", direction="nearest",
                             tolerance=float(np.median(gaps)) if len(gaps) else None)
        moments["total"] += near["total"]
        moments["count"] += near["count"]
        moments = moments[near["total"].notna().to_numpy()].reset_index(drop=True)
    return moments


def compare_figure(frame: pd.DataFrame, metric: str, x: str, labels: dict[int, str],
                   colours: dict[int, str] | None = None) -> go.Figure:
    """One line per run: ``metric`` over ``x`` ("t_s" or "step"); ``labels`` names the runs and ``colours``
    colours them."""
    title, y_title, _, _ = COMPARE_SERIES[metric]
    figure = base_figure(title, X_TITLES[x], y_title)
    for run_id, rows in frame.dropna(subset=[x, "value"]).groupby("run_id", sort=False):
        name = plotly_text(labels.get(run_id, f"#{run_id}"))
        if "n" in rows and (rows["n"] > 1).any():  # buckets of steps: each one's range as a band around its line
            banded_traces(figure, rows.assign(nonfinite=0), name=name, colour=(colours or {}).get(run_id), x=x,
                          showlegend=True)
        else:
            figure.add_scatter(x=rows[x], y=rows["value"], name=name, mode="lines",
                               line=dict(color=(colours or {}).get(run_id)))
    return fit_y_axis(figure)


def _mark(figure: go.Figure, marks: pd.DataFrame | None, x: str) -> None:
    if marks is None or marks.empty:
        return
    shown = marks.dropna(subset=[x])
    # One layout update with every line: add_vline validates the whole layout once per line, which
    # took most of a second for twenty epochs.
    shapes = [dict(type="line", xref="x", yref="paper", x0=at, x1=at, y0=0, y1=1,
                   line=dict(dash="dot", color="gray", width=1)) for at in shown[x]]
    labels = [] if len(shown) > MAX_LABELLED_MARKS else [
        dict(x=at, xref="x", y=1, yref="paper", text=f"epoch {epoch}", showarrow=False, xanchor="left",
             yanchor="top", font=dict(size=10, color="gray")) for at, epoch in zip(shown[x], shown["epoch"])]
    figure.update_layout(shapes=shapes, annotations=labels)
