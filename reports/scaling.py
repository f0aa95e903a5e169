"""The numbers behind the Compare and Run pages: per-epoch frames, throughput, speedup over the
matching single-device run, scaling efficiency, time to a target accuracy, like-for-like checks.

Pure pandas, no streamlit, so every figure the pages show can be checked in a unit test:

    epochs = epochs_frame(store.read_epoch_metrics(engine, ids))
    table = scaling_table(runs, epochs, baselines, target_acc=0.9)
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from db.dashboard import LIKE_FOR_LIKE_FIELDS, like_key
from db.run_state import ACTIVE_STATUSES
from db.run_figures import steady_images_per_s
from db.store import EPOCH_FIELDS
from contract.strategy_specs import find
from .spreadsheet import frame_for_csv

SCALING_COLUMNS = (
    "run_id", "label", "strategy", "devices", "effective_batch", "throughput_images_per_s", "baseline_run_id",
    "speedup", "efficiency", "time_to_target_s",
)
# Labels, not work: they never make two runs different experiments.
IGNORED_CONFIG_FIELDS = ("tags",)
# Streamlit's own categorical colours, ordered so that neighbours differ most: a run's colour in every chart.
RUN_COLOURS = ("#0068c9", "#ff2b2b", "#29b09d", "#ff8700", "#6d3fc0", "#83c9ff", "#ffabab", "#7defa1",
               "#ffd16a", "#9a6324")


def run_label(run_id: int, strategy: str, n_devices: int, model: str) -> str:
    """'#12 ddp×2 resnet18': short enough for a legend, enough to tell runs apart."""
    width = f"×{n_devices}" if n_devices > 1 else ""
    return f"#{run_id} {strategy}{width} {model}"


def run_colours(run_ids) -> dict[int, str]:
    """Each run's colour in every chart of a comparison (Compare, Sweeps): by its place among the runs
    ordered by id, so the same runs get the same colours on every page, in whatever order they were picked."""
    return {run_id: RUN_COLOURS[i % len(RUN_COLOURS)] for i, run_id in enumerate(sorted(set(map(int, run_ids))))}


def device_count(config: dict[str, Any]) -> int:
    return max(1, len(config.get("devices") or ()))


def effective_batch(config: dict[str, Any]) -> int | None:
    """Images behind one optimizer step: the global batch times the accumulation steps (1 for runs
    recorded before accumulation existed)."""
    batch = config.get("batch_size")
    return None if batch is None else int(batch) * int(config.get("accumulate_steps") or 1)


def batch_summary(config: dict[str, Any]) -> str:
    """'batch 128', or with accumulation 'batch 128 × 4 steps = effective batch 512'."""
    batch, steps = config.get("batch_size"), int(config.get("accumulate_steps") or 1)
    if batch is None:
        return "batch unknown"
    return f"batch {batch}" if steps == 1 else f"batch {batch} × {steps} steps = effective batch {effective_batch(config)}"


def label_for(run: dict[str, Any]) -> str:
    return run_label(run["id"], run["strategy"], device_count(run["config"]), run["model"])


def epochs_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """``read_epoch_metrics`` rows as a frame ordered by run and epoch, plus ``wall_time_s``:
    the run's cumulative ``epoch_time_s`` at the end of each epoch."""
    frame = pd.DataFrame(rows, columns=["run_id", *EPOCH_FIELDS])
    frame = frame.sort_values(["run_id", "epoch"], kind="stable").reset_index(drop=True)
    frame["wall_time_s"] = frame.groupby("run_id")["epoch_time_s"].transform(
        lambda times: times.fillna(0).cumsum()
    )
    return frame


def memory_frame(epochs: pd.DataFrame) -> pd.DataFrame:
    """Peak memory in long form: one row per (run_id, epoch, device). ``peak_memory_mb`` is what
    tensors took (on CPU, the process's peak resident set); ``peak_memory_reserved_mb`` what
    PyTorch's allocator held on a GPU (NaN on CPU and for runs recorded before it was kept)."""
    records = [
        {"run_id": row.run_id, "epoch": row.epoch, "device": device, "peak_memory_mb": mb,
         "peak_memory_reserved_mb": _reserved(row).get(device, float("nan"))}
        for row in epochs.itertuples()
        for device, mb in (row.peak_memory_mb or {}).items()
    ]
    return pd.DataFrame(records, columns=["run_id", "epoch", "device", "peak_memory_mb", "peak_memory_reserved_mb"])


def _reserved(row) -> dict[str, float]:
    extra = getattr(row, "extra", None)
    return (extra.get("peak_memory_reserved_mb") or {}) if isinstance(extra, dict) else {}


def throughput_images_per_s(run_epochs: pd.DataFrame) -> float | None:
    """Mean images/s over the epochs after the first (start-up costs land in the first), or the
    only epoch's when there is one. None before any epoch has finished. ``db.run_figures`` computes
    it, as it does for every page, the export and ``list``."""
    return steady_images_per_s(zip(run_epochs["epoch"], run_epochs["images_per_s"]))[0]


def time_to_accuracy_s(run_epochs: pd.DataFrame, target_acc: float) -> float | None:
    """Wall time (summed epoch_time_s) until val_acc first reaches ``target_acc``; None if never."""
    ordered = run_epochs.sort_values("epoch")
    elapsed_s = ordered["epoch_time_s"].fillna(0).cumsum()
    reached = ordered["val_acc"] >= target_acc
    if not reached.any():
        return None
    return float(elapsed_s[reached].iloc[0])


def pick_baselines(runs: list[dict[str, Any]], stored: dict[tuple, int]) -> dict[tuple, int]:
    """The single-device run each like-key is measured against: a completed ``single`` run among
    the picked ones (the newest) if there is one, else the newest one in the database (``stored``)."""
    chosen = dict(stored)
    for run in sorted(runs, key=lambda r: r["id"]):
        known = find(run["strategy"])  # None for a strategy of a newer version: never a baseline
        if known is not None and known.baseline and run["status"] == "completed":
            chosen[like_key(run["config"])] = run["id"]
    return chosen


def scaling_table(runs: list[dict[str, Any]], epochs: pd.DataFrame, baselines: dict[tuple, int],
                  target_acc: float) -> pd.DataFrame:
    """One row per run: throughput, its baseline, speedup = throughput / baseline throughput,
    efficiency = speedup / devices (1.0 is perfect linear scaling), time to ``target_acc``. A queued or
    running run gets a speedup once it has measured an epoch after its first.

    ``epochs`` must hold the baselines' epochs too. Missing numbers are None.
    """
    by_run = {run_id: group for run_id, group in epochs.groupby("run_id")}
    empty = epochs.iloc[0:0]

    def throughput(run_id: int | None) -> float | None:
        return None if run_id is None else throughput_images_per_s(by_run.get(run_id, empty))

    def steady(run: dict[str, Any]) -> bool:
        """Whether the run's throughput is one to compare: it has finished, or measured an epoch after
        its first (a running run's first epoch alone carries its start-up costs)."""
        if run.get("status") not in ACTIVE_STATUSES:
            return True
        return by_run.get(run["id"], empty)["images_per_s"].notna().sum() >= 2

    rows = []
    for run in runs:
        n_devices = device_count(run["config"])
        own = throughput(run["id"])
        baseline_id = baselines.get(like_key(run["config"]))
        base = throughput(baseline_id)
        speedup = own / base if own is not None and base and steady(run) else None
        rows.append({
            "run_id": run["id"],
            "label": label_for(run),
            "strategy": run["strategy"],
            "devices": n_devices,
            "effective_batch": effective_batch(run["config"]),
            "throughput_images_per_s": own,
            "baseline_run_id": baseline_id,
            "speedup": speedup,
            "efficiency": None if speedup is None else speedup / n_devices,
            "time_to_target_s": time_to_accuracy_s(by_run.get(run["id"], empty), target_acc),
        })
    # Floats even where every run lacks a figure (no epoch yet): None alone would make the columns
    # objects, which cannot be rounded or compared.
    return pd.DataFrame(rows, columns=list(SCALING_COLUMNS)).astype({
        "baseline_run_id": "Int64", "effective_batch": "Int64", "throughput_images_per_s": float,
        "speedup": float, "efficiency": float, "time_to_target_s": float})


def like_for_like_problems(runs: list[dict[str, Any]]) -> list[str]:
    """One sentence per like-for-like field on which the runs disagree, naming each run's value."""
    problems = []
    for name in LIKE_FOR_LIKE_FIELDS:
        values = {run["id"]: run["config"].get(name) for run in runs}
        if len(set(map(_hashable, values.values()))) > 1:
            listed = ", ".join(f"#{run_id} {value}" for run_id, value in values.items())
            problems.append(f"{name.replace('_', ' ')} differs ({listed})")
    return problems


def config_differences(runs: list[dict[str, Any]]) -> pd.DataFrame:
    """The config fields whose values differ between the runs: one row per field, one column per run. Launched
    runs share one catalogue of fields, so a field one of them lacks (recorded by another version) differs by
    its absence; a script's config is its own, so it differs only where it has the field and disagrees with a
    run that has it too, and shows "—" elsewhere (``unshared_fields`` names what only some runs have)."""
    launched = [run for run in runs if run.get("kind") != "script"]
    names = sorted({name for run in runs for name in run["config"]} - set(IGNORED_CONFIG_FIELDS))
    table = {}
    for name in names:
        compared = [run for run in runs if name in run["config"]]
        if all(run.get("kind") != "script" for run in compared):
            compared = launched  # absent from a launched run is a value of its own
        if len({display_value(run["config"].get(name)) for run in compared}) > 1:
            table[name] = [display_value(run["config"].get(name)) if name in run["config"] or run.get("kind") != "script"
                           else "—" for run in runs]
    return pd.DataFrame.from_dict(table, orient="index", columns=[f"#{run['id']}" for run in runs])


def unshared_fields(runs: list[dict[str, Any]]) -> list[str]:
    """The config fields some of the runs have and others do not."""
    if not runs:
        return []
    every = [set(run["config"]) for run in runs]
    return sorted(set.union(*every) - set.intersection(*every) - set(IGNORED_CONFIG_FIELDS))


def metrics_csv(runs: list[dict[str, Any]], epochs: pd.DataFrame) -> str:
    """Every epoch of the runs as CSV, with the run's strategy, model, dataset and devices."""
    described = pd.DataFrame([
        {"run_id": run["id"], "strategy": run["strategy"], "model": run["model"],
         "dataset": run["dataset"], "devices": ",".join(run["config"].get("devices") or ())}
        for run in runs
    ], columns=["run_id", "strategy", "model", "dataset", "devices"])
    table = described.merge(epochs, on="run_id", how="inner")
    # Nested cells as JSON (double quotes, null), which any program reads back; str() would write Python's.
    for column in ("peak_memory_mb", "extra"):
        if column in table:
            table[column] = table[column].map(lambda value: json.dumps(value or {}, sort_keys=True))
    return frame_for_csv(table).to_csv(index=False)


def _hashable(value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else value


def display_value(value: Any) -> str:
    """A config value as table text: lists comma-joined, None empty."""
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return "" if value is None else str(value)
