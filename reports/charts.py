"""Plotly figures for the dashboard: pure functions ``DataFrame -> Figure``, no streamlit.

Frames come from ``reports.scaling`` (``epochs_frame``, ``memory_frame``, ``scaling_table``). A frame
without the data a chart needs gives a figure without traces, never an exception: a run that has
not finished its first epoch is a normal sight.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import DEFAULT_PLOTLY_COLORS

from contract.printable import plotly_text

CHART_HEIGHT_PX = 300
METRIC_TITLES = {
    "val_acc": "Validation accuracy",
    "train_acc": "Training accuracy",
    "val_loss": "Validation loss",
    "train_loss": "Training loss",
    "images_per_s": "Throughput (images/s)",
    "epoch_time_s": "Epoch time (s)",
}
X_AXES = {"epoch": "Epoch", "wall_time_s": "Wall-clock time (s)"}
# Room above the highest point (and below the lowest, where it sits on the floor), as a share of the range.
Y_PAD_SHARE = 0.06


def base_figure(title: str, x_title: str, y_title: str, *, percent: bool = False) -> go.Figure:
    """An empty chart in the dashboard's layout (a two-line title gets the room it needs)."""
    figure = go.Figure()
    figure.update_layout(
        title=title, height=CHART_HEIGHT_PX, margin=dict(l=10, r=10, t=60 if "<br>" in title else 40, b=10),
        # Below the plot: a legend of several runs would otherwise run over the title.
        legend=dict(orientation="h", yanchor="top", y=-0.25, xanchor="left", x=0.0),
        xaxis_title=x_title, yaxis_title=y_title, hovermode="x unified",
    )
    if percent:
        figure.update_yaxes(tickformat=".0%")
    return figure


def y_range(values) -> list[float] | None:
    """The y range of a chart whose values are ``values``: always from zero (every quantity charted is a
    loss, a share, a rate, a duration or an amount, and zero is its floor), so that a constant line is drawn
    flat and a change of 0.1 % looks like one, not like a climb across the whole chart (autorange spans
    only the values: 1,286.8-1,287.6 MB for a steady process). None where there is no finite value."""
    finite = pd.to_numeric(pd.Series(list(values), dtype=object), errors="coerce").dropna()
    finite = finite[finite.abs() != float("inf")]
    if finite.empty:
        return None
    low, high = min(0.0, float(finite.min())), max(0.0, float(finite.max()))
    if low == high:
        return [0.0, 1.0]  # all zeros: a unit range with the line at its foot
    span = high - low
    return [low - (span * Y_PAD_SHARE if low < 0 else 0.0), high + span * Y_PAD_SHARE]


def fit_y_axis(figure: go.Figure) -> go.Figure:
    """Give ``figure`` the y range its traces' values need (``y_range``); a figure without values yet
    (a live chart before its first point) gets an autorange that includes zero, for the same reason."""
    values = [y for trace in figure.data if getattr(trace, "y", None) is not None for y in trace.y]
    if (bounds := y_range(values)) is not None:
        figure.update_yaxes(range=bounds)
    else:
        figure.update_yaxes(rangemode="tozero")
    return figure


def on_log_scale(figure: go.Figure, log: bool = True) -> go.Figure:
    """``figure`` with a log y axis where ``log`` (a diverged run's loss of 1e12 squashes every other line flat
    on a linear one); its zero-based linear range gives way to the log axis's own. Unchanged otherwise."""
    if log:
        figure.update_yaxes(type="log", autorange=True, rangemode="normal")
        figure.layout.yaxis.range = None
    return figure


def is_loss(metric: str) -> bool:
    """Whether a series is a loss, which the log-scale switch applies to ("train_loss", "val/loss", "loss")."""
    return "loss" in metric.lower()


def has_values(frame: pd.DataFrame, column: str) -> bool:
    return column in frame and frame[column].notna().any()


def epoch_lines(epochs: pd.DataFrame, columns: dict[str, str], title: str, y_title: str,
                *, percent: bool = False) -> go.Figure:
    """One line per metric column of one run, over epochs; ``columns`` maps column -> legend name."""
    figure = base_figure(title, "Epoch", y_title, percent=percent)
    for column, name in columns.items():
        if has_values(epochs, column):
            figure.add_scatter(x=epochs["epoch"], y=epochs[column], name=name, mode="lines+markers")
    figure.update_xaxes(dtick=1 if len(epochs) <= 20 else None)
    return fit_y_axis(figure)


def loss_figure(epochs: pd.DataFrame) -> go.Figure:
    return epoch_lines(epochs, {"train_loss": "training", "val_loss": "validation"}, "Loss", "loss")


def accuracy_figure(epochs: pd.DataFrame) -> go.Figure:
    return epoch_lines(epochs, {"train_acc": "training", "val_acc": "validation"}, "Accuracy", "accuracy",
                       percent=True)


def throughput_figure(epochs: pd.DataFrame) -> go.Figure:
    return epoch_lines(epochs, {"images_per_s": "training"}, "Throughput", "images/s")


def epoch_time_figure(epochs: pd.DataFrame) -> go.Figure:
    return epoch_lines(epochs, {"epoch_time_s": "epoch (train + validation)", "train_time_s": "training only"},
                       "Epoch time", "seconds")


MEMORY_ON_GPU = ("allocated by tensors (solid) and reserved by PyTorch's caching allocator (dashed; "
                 "nvidia-smi shows about this plus the CUDA context)")
MEMORY_ON_CPU = "the process's peak resident set"


def memory_figure(memory: pd.DataFrame) -> go.Figure:
    """Peak memory per device over epochs, one line per device (``memory_frame`` of one run); on
    GPUs a dashed line per device for what the allocator reserved. The title says which is which."""
    reserved = "peak_memory_reserved_mb" in memory and memory["peak_memory_reserved_mb"].notna().any()
    shows = MEMORY_ON_GPU if reserved else MEMORY_ON_CPU
    figure = base_figure(f"Peak memory per device<br><sup>{shows}</sup>", "Epoch", "MB")
    figure.update_layout(margin=dict(t=60))
    for i, (device, rows) in enumerate(memory.groupby("device", sort=True)):
        color = DEFAULT_PLOTLY_COLORS[i % len(DEFAULT_PLOTLY_COLORS)]  # a device's two lines share its colour
        figure.add_scatter(x=rows["epoch"], y=rows["peak_memory_mb"], name=str(device), mode="lines+markers",
                           line=dict(color=color))
        if reserved and rows["peak_memory_reserved_mb"].notna().any():
            figure.add_scatter(x=rows["epoch"], y=rows["peak_memory_reserved_mb"], name=f"{device} reserved",
                               mode="lines+markers", line=dict(dash="dash", color=color))
    figure.update_xaxes(dtick=1 if memory["epoch"].nunique() <= 20 else None)
    return fit_y_axis(figure)


def overlay_figure(epochs: pd.DataFrame, metric: str, x: str, labels: dict[int, str],
                   colours: dict[int, str] | None = None) -> go.Figure:
    """One line per run: ``metric`` over ``x`` ("epoch" or "wall_time_s"); ``labels`` names the runs and
    ``colours`` colours them (``reports.scaling.run_colours``)."""
    percent = metric.endswith("_acc")
    figure = base_figure(METRIC_TITLES.get(metric, metric), X_AXES.get(x, x), METRIC_TITLES.get(metric, metric),
                     percent=percent)
    for run_id, rows in epochs.groupby("run_id", sort=False):
        if has_values(rows, metric):
            rows = rows.dropna(subset=[metric])  # a script's rows hold one series each
            figure.add_scatter(x=rows[x], y=rows[metric], name=plotly_text(labels.get(run_id, f"#{run_id}")),
                               mode="lines+markers", line=dict(color=(colours or {}).get(run_id)))
    if x == "epoch" and epochs["epoch"].nunique() <= 20:
        figure.update_xaxes(dtick=1)
    return fit_y_axis(figure)


def speedup_figure(scaling: pd.DataFrame, colours: dict[int, str] | None = None) -> go.Figure:
    """Speedup over the single-device baseline against the number of devices, with the ideal
    (speedup = devices) as a dashed line; each run in its ``colours``."""
    figure = base_figure("Speedup over one device", "devices", "speedup (×)")
    figure.update_layout(hovermode="closest")
    measured = scaling.dropna(subset=["speedup"])
    top_devices = max(2, int(max([1, *measured["devices"]])))
    figure.add_scatter(x=[0, top_devices], y=[0, top_devices], name="ideal (linear)", mode="lines",
                       line=dict(dash="dash", color="gray"))
    for row in measured.itertuples():
        figure.add_scatter(x=[row.devices], y=[row.speedup], name=row.label, mode="markers+text",
                           text=[f"{row.speedup:.2f}×"], textposition="middle right",
                           marker=dict(size=12, color=(colours or {}).get(row.run_id)))
    top_speedup = max([top_devices, *measured["speedup"]])
    figure.update_xaxes(dtick=1, range=[0, top_devices + 0.6])  # room for the labels right of the points
    figure.update_yaxes(range=[0, top_speedup * 1.15])
    return figure


def efficiency_figure(scaling: pd.DataFrame, colours: dict[int, str] | None = None) -> go.Figure:
    """Scaling efficiency (speedup / devices) per run as bars, each in its ``colours``; 100 % is perfect
    linear scaling."""
    figure = base_figure("Scaling efficiency", "", "speedup / devices", percent=True)
    figure.update_layout(hovermode="closest", showlegend=False)
    measured = scaling.dropna(subset=["efficiency"])
    figure.add_bar(x=measured["label"], y=measured["efficiency"], name="measured",
                   text=[f"{e:.0%}" for e in measured["efficiency"]], textposition="auto",
                   marker_color=[(colours or {}).get(run_id) for run_id in measured["run_id"]] if colours else None)
    figure.add_hline(y=1.0, line_dash="dash", line_color="gray", annotation_text="ideal 100 %",
                     annotation_position="top left")
    figure.update_yaxes(range=[0, max([1.0, *measured["efficiency"]]) * 1.15])
    return figure
