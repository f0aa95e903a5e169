"""Where a run's time and memory go, from what Parallax records per epoch: MFU and achieved
TFLOP/s, each rank's train/data/compute/comm-wait time, stragglers, and the memory each device
holds (parameters, gradients, optimizer state, activations and the rest).

Pure pandas and Plotly, no streamlit; the Run, Compare and Sweep pages and the sweep report share it:

    epochs = scaling.epochs_frame(store.read_epoch_metrics(engine, ids))
    mfu_by_run(epochs); ranks_frame(epochs); breakdown_frame(epochs, labels)

Every figure may be missing (a run recorded before it was measured, a device without a known peak);
each ``*_missing`` function gives the one line that says why.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go

RANK_TIME_COLUMNS = {"data_time_s": "data loading", "compute_time_s": "compute", "comm_wait_s": "waiting in collectives"}
BREAKDOWN_PARTS = {"parameters_mb": "parameters", "gradients_mb": "gradients", "optimizer_mb": "optimizer state",
                   "data_mb": "dataset kept on the device", "activations_other_mb": "activations and other"}
BREAKDOWN_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#c7c7c7")
STRAGGLER_SLOWER = 0.10  # a rank this much slower than the median rank...
STRAGGLER_EPOCHS = 2     # ...this many epochs running is a straggler


def _extra(row: Any) -> dict[str, Any]:
    extra = row.get("extra") if isinstance(row, dict) else getattr(row, "extra", None)
    return extra if isinstance(extra, dict) else {}


def steady(run_epochs: pd.DataFrame) -> pd.DataFrame:
    """The epochs after the first (which carries start-up costs), or the only one."""
    ordered = run_epochs.sort_values("epoch")
    return ordered.iloc[1:] if len(ordered) > 1 else ordered


def _mean_of(run_epochs: pd.DataFrame, key: str) -> float | None:
    values = [_extra(row).get(key) for row in steady(run_epochs).itertuples()]
    values = [float(v) for v in values if isinstance(v, (int, float))]
    return sum(values) / len(values) if values else None


def mfu_by_run(epochs: pd.DataFrame) -> pd.DataFrame:
    """Per run: mean ``mfu`` and ``achieved_tflops`` over the steady epochs (NaN where not recorded)."""
    rows = [{"run_id": run_id, "mfu": _mean_of(group, "mfu"), "achieved_tflops": _mean_of(group, "achieved_tflops")}
            for run_id, group in epochs.groupby("run_id")]
    return pd.DataFrame(rows, columns=["run_id", "mfu", "achieved_tflops"]).astype(
        {"mfu": float, "achieved_tflops": float})


def mfu_missing(measurements: dict[str, Any] | None, run_epochs: pd.DataFrame) -> str | None:
    """Why a run shows no MFU, in one line; None when it has one (or has no epoch yet)."""
    if run_epochs.empty or _mean_of(run_epochs, "mfu") is not None:
        return None
    measurements = measurements or {}
    if measurements.get("flops_per_image") is None:
        return "MFU: not recorded — this run's FLOPs per image were not counted (runs recorded before MFU was measured)."
    if measurements.get("peak_tflops") is None:
        return "MFU: not measurable — no peak FLOP/s is known for this run's device."
    return "MFU: not recorded for these epochs."


# What MFU is divided by, said wherever MFU is shown: runs of one machine at the same TFLOP/s differ in MFU
# where their devices' peaks differ.
MFU_PEAK_NOTE = ("MFU is the achieved TFLOP/s over the peak of the run's own devices together, shown beside it: "
                 "the same TFLOP/s is a different MFU where the peaks differ. On a CPU the peak is a matrix multiply "
                 "measured over each process's threads, times the processes (ddp, fsdp and pp: a process per "
                 "device, sharing the cores; single, dp and mp: one process using them).")


def mfu_text(mfu: float | None, tflops: float | None, peak_tflops: float | None = None) -> str:
    """'12.3% (0.052 of 0.42 TFLOP/s)': the MFU with what it divides."""
    if mfu is None or pd.isna(mfu):
        return "—"
    has_tflops = tflops is not None and pd.notna(tflops)
    if has_tflops and peak_tflops is not None and pd.notna(peak_tflops):
        return f"{mfu:.1%} ({tflops:.3g} of {peak_tflops:.3g} TFLOP/s)"
    return f"{mfu:.1%}" + (f" ({tflops:.3g} TFLOP/s)" if has_tflops else "")


def ranks_frame(epochs: pd.DataFrame) -> pd.DataFrame:
    """Per-rank times in long form: one row per (run_id, epoch, rank), from the epochs' ``ranks``."""
    records = [
        {"run_id": row.run_id, "epoch": row.epoch, "rank": int(entry["rank"]),
         **{k: _float(entry.get(k)) for k in ("train_time_s", *RANK_TIME_COLUMNS)}}
        for row in epochs.itertuples()
        for entry in (_extra(row).get("ranks") or [])
        if isinstance(entry, dict) and "rank" in entry
    ]
    return pd.DataFrame(records, columns=["run_id", "epoch", "rank", "train_time_s", *RANK_TIME_COLUMNS])


def _float(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else float("nan")


def stragglers(ranks: pd.DataFrame, recorded: list[Any] | None = None) -> list[int]:
    """Ranks whose training time was at least 10 % above the median rank's for two epochs running
    (of one run's ``ranks_frame``), together with any Parallax named itself (``recorded``)."""
    slow_streak: dict[int, int] = {}
    found = {int(r["rank"]) if isinstance(r, dict) else int(r) for r in (recorded or [])
             if isinstance(r, (int, dict)) and (not isinstance(r, dict) or "rank" in r)}
    for _, group in ranks.sort_values("epoch").groupby("epoch", sort=True):
        median = group["train_time_s"].median()
        for row in group.itertuples():
            slow = pd.notna(median) and median > 0 and row.train_time_s >= (1 + STRAGGLER_SLOWER) * median
            slow_streak[row.rank] = slow_streak.get(row.rank, 0) + 1 if slow else 0
            if slow_streak[row.rank] >= STRAGGLER_EPOCHS:
                found.add(int(row.rank))
    return sorted(found)


def recorded_stragglers(run_epochs: pd.DataFrame) -> list[Any]:
    return [s for row in run_epochs.itertuples() for s in (_extra(row).get("stragglers") or [])]


def ranks_missing(run_epochs: pd.DataFrame) -> str | None:
    if run_epochs.empty or not ranks_frame(run_epochs).empty:
        return None
    return "Per-rank times: not recorded for this run (runs recorded before they were measured)."


def rank_times_figure(ranks: pd.DataFrame) -> go.Figure:
    """One stacked bar per rank and epoch: data loading, compute and waiting in collectives."""
    ordered = ranks.sort_values(["epoch", "rank"])
    x = [ordered["epoch"].map(lambda e: f"epoch {e}"), ordered["rank"].map(lambda r: f"rank {r}")]
    fig = go.Figure()
    for column, name in RANK_TIME_COLUMNS.items():
        fig.add_bar(x=x, y=ordered[column], name=name)
    fig.update_layout(title="Time per rank and epoch", barmode="stack", yaxis_title="seconds", height=320,
                      legend=dict(orientation="h", y=-0.25), margin=dict(l=10, r=10, t=40, b=10))
    return fig


def rank_table(ranks: pd.DataFrame) -> pd.DataFrame:
    """The per-rank times as a table for display, one row per epoch and rank."""
    shown = ranks.sort_values(["epoch", "rank"])[["epoch", "rank", "train_time_s", *RANK_TIME_COLUMNS]]
    return shown.rename(columns={"train_time_s": "training (s)", "data_time_s": "data (s)",
                                 "compute_time_s": "compute (s)", "comm_wait_s": "comm wait (s)"}).round(3)


def breakdown_frame(epochs: pd.DataFrame, labels: dict[int, str] | None = None) -> pd.DataFrame:
    """Each run's memory breakdown at its last epoch that has one: one row per (run, device)."""
    labels = labels or {}
    records = []
    for run_id, group in epochs.groupby("run_id", sort=False):
        with_breakdown = [row for row in group.sort_values("epoch").itertuples() if _extra(row).get("memory_breakdown")]
        if not with_breakdown:
            continue
        for device, parts in sorted(_extra(with_breakdown[-1])["memory_breakdown"].items()):
            if isinstance(parts, dict):
                records.append({"run_id": run_id, "label": labels.get(run_id, f"#{run_id}"), "device": str(device),
                                **{k: _float(parts.get(k)) for k in BREAKDOWN_PARTS}})
    return pd.DataFrame(records, columns=["run_id", "label", "device", *BREAKDOWN_PARTS])


def breakdown_missing(breakdown: pd.DataFrame, run_ids: list[int], labels: dict[int, str]) -> str | None:
    missing = [labels.get(i, f"#{i}") for i in run_ids if i not in set(breakdown["run_id"])]
    if not missing:
        return None
    return (f"Memory breakdown: not recorded for {', '.join(missing)} "
            "(runs recorded before it was measured, or that did not finish a training step).")


def breakdown_figure(breakdown: pd.DataFrame) -> go.Figure:
    """Memory per device, stacked: parameters, gradients, optimizer state, activations and other,
    one bar per run and device, so that what sharding saves is read off the bars."""
    x = [breakdown["label"], breakdown["device"]]
    fig = go.Figure()
    for (column, name), color in zip(BREAKDOWN_PARTS.items(), BREAKDOWN_COLORS):
        fig.add_bar(x=x, y=breakdown[column], name=name, marker_color=color)
    fig.update_layout(title="Memory per device, by what holds it", barmode="stack", yaxis_title="MB", height=340,
                      legend=dict(orientation="h", y=-0.3), margin=dict(l=10, r=10, t=40, b=10))
    return fig
