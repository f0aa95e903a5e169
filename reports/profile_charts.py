"""Profiler charts: pure functions from the stored op tables and step breakdowns to Plotly figures.

Used by the Profiler page, the Run page and the offline HTML report alike.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

PHASE_COLUMNS = {
    "data_loading_ms": "data loading",
    "forward_ms": "forward",
    "backward_ms": "backward",
    "optimizer_step_ms": "optimizer step",
    "other_ms": "other / idle",
}
PHASE_COLORS = ("#8c8c8c", "#1f77b4", "#ff7f0e", "#2ca02c", "#d3d3d3")


def top_ops(ops: pd.DataFrame, *, rank: int = 0, n: int = 15) -> pd.DataFrame:
    """The ``n`` ops of ``rank`` with the most self time (CPU plus device), heaviest first."""
    frame = ops[ops["rank"] == rank].copy()
    frame["self_total_us"] = frame["self_cpu_us"] + frame["self_device_us"]
    return frame.sort_values("self_total_us", ascending=False).head(n)


def top_ops_figure(ops: pd.DataFrame, *, rank: int = 0, n: int = 15) -> go.Figure:
    """Self CPU time and self device time of the heaviest ops, side by side."""
    frame = top_ops(ops, rank=rank, n=n).iloc[::-1]  # heaviest at the top of a horizontal bar chart
    fig = go.Figure()
    fig.add_bar(y=frame["name"], x=frame["self_cpu_us"] / 1000, name="self CPU time", orientation="h")
    if (frame["self_device_us"] > 0).any():
        fig.add_bar(y=frame["name"], x=frame["self_device_us"] / 1000, name="self device time", orientation="h")
    fig.update_layout(
        title=f"Top {len(frame)} ops by self time (rank {rank})", barmode="group",
        xaxis_title="milliseconds over the profiled steps", height=max(320, 24 * len(frame) + 120),
        margin=dict(l=10, r=10, t=50, b=40),
    )
    return fig


def memory_by_op_figure(ops: pd.DataFrame, *, rank: int = 0, n: int = 15) -> go.Figure:
    """Memory each op allocated itself (net of what it freed), the largest first."""
    frame = ops[ops["rank"] == rank].copy()
    frame["memory_mb"] = (frame["self_cpu_memory_bytes"] + frame["self_device_memory_bytes"]) / 2**20
    frame = frame.reindex(frame["memory_mb"].abs().sort_values(ascending=False).index).head(n).iloc[::-1]
    fig = go.Figure(go.Bar(y=frame["name"], x=frame["memory_mb"], orientation="h", name="net allocated"))
    fig.update_layout(
        title=f"Memory by op (rank {rank}): net MB allocated, negative = freed more than allocated",
        xaxis_title="MB", height=max(320, 24 * len(frame) + 120), margin=dict(l=10, r=10, t=50, b=40),
    )
    return fig


def breakdown_means(steps: pd.DataFrame) -> pd.DataFrame:
    """Mean milliseconds per phase for each (run, rank) over its profiled steps."""
    columns = [*PHASE_COLUMNS, "communication_ms", "total_ms"]
    return steps.groupby(["run_id", "rank"], as_index=False)[columns].mean()


def step_breakdown_figure(steps: pd.DataFrame) -> go.Figure:
    """Where a step's time goes, one stacked bar per run and rank; communication is drawn beside
    the stack because under DDP it overlaps backward rather than adding to it."""
    means = breakdown_means(steps)
    labels = [f"run {r.run_id} · rank {r.rank}" for r in means.itertuples()]
    fig = go.Figure()
    for (column, name), color in zip(PHASE_COLUMNS.items(), PHASE_COLORS):
        fig.add_bar(x=labels, y=means[column], name=name, marker_color=color, offsetgroup="phases")
    fig.add_bar(x=labels, y=means["communication_ms"], name="communication (overlaps backward)",
                marker_color="#d62728", marker_pattern_shape="/", offsetgroup="communication")
    fig.update_layout(
        title="Mean time per training step", barmode="relative", yaxis_title="milliseconds per step",
        legend=dict(orientation="h", y=-0.2), margin=dict(l=10, r=10, t=50, b=40),
    )
    return fig
