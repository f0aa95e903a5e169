"""Each run's memory estimate (made before it trained, ``measurements["memory_estimate"]``) set
against what it measured, device by device: on a GPU the allocator's peak against the estimated
peak; on a CPU, which keeps no peak of live tensors, the parts the breakdown measures exactly
(parameters, gradients and optimizer state) against their estimate.

    frame = estimate_check_frame(runs, epochs)      # runs: dicts with id, measurements
    errors = estimate_error_by_run(frame)           # {run_id: error of the device furthest off}
"""

from __future__ import annotations

from typing import Any

import pandas as pd

STATE_PARTS = ("parameters_mb", "gradients_mb", "optimizer_mb")
PEAK, STATE = "peak allocated", "parameters + gradients + optimizer"
CHECK_COLUMNS = ["run_id", "label", "device", "compared", "estimated_mb", "measured_mb", "error"]


def estimate_check_frame(runs: list[dict[str, Any]], epochs: pd.DataFrame,
                         labels: dict[int, str] | None = None) -> pd.DataFrame:
    """One row per run and device with an estimate and a measurement to set it against."""
    labels = labels or {}
    records = []
    for run in runs:
        estimate = (run.get("measurements") or {}).get("memory_estimate") or {}
        devices = estimate.get("devices") or {}
        if not devices:
            continue
        run_epochs = epochs[epochs["run_id"] == run["id"]].sort_values("epoch") if not epochs.empty else epochs
        peaks, breakdown = _measured(run_epochs)
        for device, parts in devices.items():
            row = {"run_id": run["id"], "label": labels.get(run["id"], f"#{run['id']}"), "device": device}
            if not device.endswith("cpu") and device in peaks:
                row.update(compared=PEAK, estimated_mb=parts["total_mb"], measured_mb=peaks[device])
            elif device in breakdown and all(breakdown[device].get(p) is not None for p in STATE_PARTS):
                row.update(compared=STATE, estimated_mb=sum(parts[p] for p in STATE_PARTS),
                           measured_mb=sum(breakdown[device][p] for p in STATE_PARTS))
            else:
                continue
            row["error"] = row["estimated_mb"] / row["measured_mb"] - 1 if row["measured_mb"] else None
            records.append(row)
    return pd.DataFrame(records, columns=CHECK_COLUMNS)


def _measured(run_epochs: pd.DataFrame) -> tuple[dict[str, float], dict[str, dict]]:
    """The largest peak per device over the epochs, and the last recorded breakdown."""
    peaks: dict[str, float] = {}
    breakdown: dict[str, dict] = {}
    for row in run_epochs.itertuples():
        for device, mb in (getattr(row, "peak_memory_mb", None) or {}).items():
            if mb is not None:
                peaks[device] = max(peaks.get(device, 0.0), float(mb))
        extra = getattr(row, "extra", None)
        if isinstance(extra, dict) and extra.get("memory_breakdown"):
            breakdown = extra["memory_breakdown"]
    return peaks, breakdown


def estimate_error_by_run(frame: pd.DataFrame) -> dict[int, float]:
    """Each run's error at the device furthest from its estimate (signed: + is an over-estimate)."""
    errors: dict[int, float] = {}
    for run_id, group in frame.dropna(subset=["error"]).groupby("run_id"):
        errors[int(run_id)] = float(group.loc[group["error"].abs().idxmax(), "error"])
    return errors


def estimate_check_display(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame as a table for people: MB and the error as a signed percentage."""
    return pd.DataFrame({
        "run": frame["label"], "device": frame["device"], "compared": frame["compared"],
        "estimated (MB)": frame["estimated_mb"].round(1), "measured (MB)": frame["measured_mb"].round(1),
        "error": frame["error"].map(lambda e: "—" if pd.isna(e) else f"{e:+.1%}"),
    })


def estimate_missing(runs: list[dict[str, Any]], frame: pd.DataFrame, labels: dict[int, str]) -> str | None:
    """One line naming the runs without an estimate to check, and why."""
    missing = [labels.get(run["id"], f"#{run['id']}") for run in runs if run["id"] not in set(frame["run_id"])]
    if not missing:
        return None
    reasons = {(run.get("measurements") or {}).get("memory_estimate", {}).get("error") for run in runs
               if run["id"] not in set(frame["run_id"])} - {None}
    why = f" ({'; '.join(sorted(reasons))})" if reasons else ""
    return (f"Memory estimate against measurement: none for {', '.join(missing)} (recorded before estimates were "
            f"stored, not past its first step yet, or not estimated{why}).")
