"""The scaling report of a strategy sweep: one row per strategy, one sentence of advice.

Shared by ``python -m trainer_backend sweep`` (a text table), the dashboard and the HTML export.

    table = sweep_table(engine, sweep_id, target_acc=0.9)
    print(format_table(table)); print(strategy_advice(table))
"""

from __future__ import annotations

import html
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from db import profiles, store, system_metrics
from db.run_state import ACTIVE_STATUSES
from contract.strategy_specs import find

from .efficiency import MFU_PEAK_NOTE, breakdown_figure, breakdown_frame, breakdown_missing, mfu_by_run
from .scaling_forecast import HYPOTHETICAL_HEADING, forecast_display, hypothetical, possible, sweep_forecast
from .memory_check import estimate_check_frame, estimate_error_by_run
from .profile_charts import PHASE_COLUMNS, breakdown_means, step_breakdown_figure
from .report_html import REPORT_CSS, charts_html
from .scaling import epochs_frame, memory_frame, pick_baselines, run_colours, scaling_table

REPORT_COLUMNS = ("run_id", "strategy", "devices", "status", "effective_batch", "throughput_images_per_s", "mfu",
                  "peak_tflops",
                  "speedup", "efficiency", "peak_memory_mb", "memory_estimate_error", "time_to_target_s",
                  "utilisation_pct", "energy_j_per_image")
ESTIMATE_ERROR_NOTE = ("Memory estimate error: at the device furthest from the estimate made before the run "
                       "(estimated / measured - 1): on GPUs the peak allocated, on CPU the parameters, gradients and "
                       "optimizer state.")
# The mean utilisation is taken over this many samples at most, evenly spread over the run (every
# sample up to 5.5 hours at one a second): reading a 100-hour run's every sample would stall the page.
UTILISATION_METRICS = (("gpu", "util_pct"), ("host", "cpu_pct"))  # GPU, else host CPU


def _run_dicts(engine, run_ids: list[int]) -> list[dict[str, Any]]:
    runs = []
    for run_id in run_ids:
        record = store.get_run(engine, run_id)
        runs.append({"id": record.id, "strategy": record.strategy, "model": record.model,
                     "status": record.status, "config": record.config, "notes": record.notes,
                     "measurements": record.measurements})
    return runs


def sweep_table(engine, sweep_id: int, *, target_acc: float = 0.9) -> pd.DataFrame:
    """Throughput, speedup over the sweep's single run, efficiency, the largest per-device peak
    memory, time to ``target_acc``, and (for profiled runs) the mean step breakdown."""
    run_ids = store.sweep_run_ids(engine, sweep_id)
    runs = _run_dicts(engine, run_ids)
    epochs = epochs_frame(store.read_epoch_metrics(engine, run_ids))
    table = scaling_table(runs, epochs, pick_baselines(runs, {}), target_acc)
    table.insert(3, "status", [run["status"] for run in runs])
    memory = memory_frame(epochs)
    peaks = memory.groupby("run_id")["peak_memory_mb"].max() if not memory.empty else pd.Series(dtype=float)
    table["peak_memory_mb"] = table["run_id"].map(peaks)
    # The device furthest from the estimate made before the run (see reports/memory_check.py).
    errors = estimate_error_by_run(estimate_check_frame(runs, epochs))
    table["memory_estimate_error"] = table["run_id"].map(errors)
    mfu = mfu_by_run(epochs).set_index("run_id")
    table.insert(table.columns.get_loc("throughput_images_per_s") + 1, "mfu", table["run_id"].map(mfu["mfu"]))
    peaks = {run["id"]: (run["measurements"] or {}).get("peak_tflops") for run in runs}
    table.insert(table.columns.get_loc("mfu") + 1, "peak_tflops", table["run_id"].map(peaks).astype(float))
    steps = pd.DataFrame(profiles.read_steps(engine, run_ids))
    if not steps.empty:
        means = breakdown_means(steps[steps["rank"] == 0]).set_index("run_id")
        for column in [*PHASE_COLUMNS, "communication_ms"]:
            table[column] = table["run_id"].map(means[column])
    utilisation = mean_utilisation(system_metrics.metric_totals(engine, run_ids, UTILISATION_METRICS))
    table["utilisation_pct"] = table["run_id"].map(lambda run_id: utilisation.get(run_id, (None, None))[0])
    table["utilisation_of"] = table["run_id"].map(lambda run_id: utilisation.get(run_id, (None, None))[1])
    energy = {run["id"]: energy_per_image(epochs[epochs["run_id"] == run["id"]], run["notes"]) for run in runs}
    table["energy_j_per_image"] = table["run_id"].map(lambda run_id: energy[run_id][0])
    table["energy_note"] = table["run_id"].map(lambda run_id: energy[run_id][1])
    return table


def mean_utilisation(totals: list[dict[str, Any]]) -> dict[int, tuple[float, str]]:
    """Each run's mean GPU utilisation over its GPUs and samples, or, for a run without GPU samples,
    its hosts' mean CPU utilisation: run_id -> (percent, "GPU" or "CPU"). ``totals``: each series'
    sum and count (``db.system_metrics.metric_totals`` of ``UTILISATION_METRICS``), a run of any length
    summed in the database.

    Each machine of a run is averaged over its own samples first (machines are sampled on clocks of
    their own, and one may have stopped early), then the machines are combined: GPUs weighted by
    how many each machine has, hosts alike. On one machine that is the mean of every GPU reading
    of every sample (of the host's CPU readings, without GPUs)."""
    gpu: dict[tuple[int, int], list[float]] = {}  # (run_id, node) -> [util sum, readings, GPUs read]
    cpu: dict[tuple[int, int], list[float]] = {}  # (run_id, node) -> [cpu sum, readings]
    for series in totals:
        if not series["finite"]:
            continue
        machine = (series["run_id"], series["node"])
        if (series["kind"], series["metric"]) == ("gpu", "util_pct"):
            held = gpu.setdefault(machine, [0.0, 0, 0])
            held[0] += series["total"]
            held[1] += series["finite"]
            held[2] += 1
        elif (series["kind"], series["metric"]) == ("host", "cpu_pct"):
            held = cpu.setdefault(machine, [0.0, 0])
            held[0] += series["total"]
            held[1] += series["finite"]
    # A machine's mean utilisation of one GPU, and how many GPUs it has.
    gpu_runs: dict[int, list[tuple[float, float]]] = {}
    for (run_id, _), (total, readings, gpus) in gpu.items():
        gpu_runs.setdefault(run_id, []).append((total / readings, gpus))
    cpu_runs: dict[int, list[float]] = {}
    for (run_id, _), (total, readings) in cpu.items():
        cpu_runs.setdefault(run_id, []).append(total / readings)
    means = {run_id: (sum(values) / len(values), "CPU") for run_id, values in cpu_runs.items()}
    means.update({run_id: (sum(mean * count for mean, count in machines) / sum(count for _, count in machines), "GPU")
                  for run_id, machines in gpu_runs.items()})
    return means


def energy_per_image(run_epochs: pd.DataFrame, notes: list[str]) -> tuple[float | None, str | None]:
    """The run's joules per training image (the mean over its epochs that measured it: every epoch
    trains the same images), or None and the reason: the run's note about energy where it left one."""
    measured = [extra["energy_j_per_image"] for extra in run_epochs.get("extra", [])
                if isinstance(extra, dict) and extra.get("energy_j_per_image") is not None]
    if measured:
        return sum(measured) / len(measured), None
    if run_epochs.empty:
        return None, "no epoch finished yet"
    said = next((note for note in notes if "energy" in note.lower()), None)
    if said:
        return None, said
    if not any(isinstance(extra, dict) and "energy_j_per_image" in extra for extra in run_epochs.get("extra", [])):
        return None, "not recorded: the run predates energy measurement"
    return None, "no energy counter was readable (NVML energy or power, RAPL)"


def report_frame(table: pd.DataFrame) -> pd.DataFrame:
    """The report's columns as text, under the names a reader sees (a terminal's and the HTML's)."""
    shown = table[list(REPORT_COLUMNS)].copy()
    shown["throughput_images_per_s"] = shown["throughput_images_per_s"].map(lambda v: _num(v, "{:.0f}"))
    shown["mfu"] = shown["mfu"].map(lambda v: _num(v, "{:.1%}"))
    shown["peak_tflops"] = shown["peak_tflops"].map(lambda v: _num(v, "{:.3g}"))
    shown["speedup"] = shown["speedup"].map(lambda v: _num(v, "{:.2f}x"))
    shown["efficiency"] = shown["efficiency"].map(lambda v: _num(v, "{:.0%}"))
    shown["peak_memory_mb"] = shown["peak_memory_mb"].map(lambda v: _num(v, "{:.0f}"))
    shown["memory_estimate_error"] = shown["memory_estimate_error"].map(lambda v: _num(v, "{:+.1%}"))
    shown["time_to_target_s"] = shown["time_to_target_s"].map(lambda v: _num(v, "{:.1f}", "not reached"))
    shown["utilisation_pct"] = [_num(value, "{:.0f}% " + str(of)) for value, of in
                                zip(table["utilisation_pct"], table["utilisation_of"])]
    shown["energy_j_per_image"] = shown["energy_j_per_image"].map(lambda v: _num(v, "{:.3g}"))
    shown.columns = ["run", "strategy", "devices", "status", "effective batch", "images/s", "MFU", "of peak TFLOP/s",
                     "speedup",
                     "efficiency", "peak MB/device", "memory estimate error", "time to target s", "mean util",
                     "J/image"]
    return shown


def energy_gaps(table: pd.DataFrame) -> dict[str, list[int]]:
    """{why energy per image is empty: the runs it is empty for}, each reason once: the runs of a sweep on one
    machine usually share it (no RAPL here), and one line saying it per run would say it four times."""
    gaps: dict[str, list[int]] = {}
    for row in table.itertuples():
        if pd.isna(row.energy_j_per_image) and row.energy_note:
            gaps.setdefault(row.energy_note.rstrip("."), []).append(int(row.run_id))
    return gaps


def energy_gaps_line(table: pd.DataFrame, run_name=lambda run_id: f"run {run_id}") -> str | None:
    """The line saying why energy per image is empty where it is (each reason once, after the runs it
    concerns, named by ``run_name``), or None."""
    gaps = energy_gaps(table)
    if not gaps:
        return None
    parts = [f"{', '.join(run_name(run_id) for run_id in run_ids)} — {reason}" for reason, run_ids in gaps.items()]
    return "Why energy per image is empty: " + "; ".join(parts) + "."


def energy_reasons(table: pd.DataFrame) -> list[str]:
    """The line saying why energy per image is empty where it is, or nothing."""
    return [line] if (line := energy_gaps_line(table)) else []


def format_table(table: pd.DataFrame) -> str:
    """The report as aligned text for a terminal."""
    return "\n".join([report_frame(table).to_string(index=False), *energy_reasons(table)])


def mfu_note(table: pd.DataFrame) -> str | None:
    """What MFU divides by, where the report shows one, and why it is missing where it is."""
    lines = [MFU_PEAK_NOTE] if table["mfu"].notna().any() else []
    if table["mfu"].notna().all() or table["throughput_images_per_s"].isna().all():
        return " ".join(lines) or None
    return " ".join([*lines, "MFU: not recorded for runs that show '-' (recorded before FLOPs were counted, or no "
                     "peak FLOP/s is known for their device)."])


def sweep_breakdown(engine, table: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """The sweep's memory breakdown per run and device, and the line on any run without one."""
    run_ids = table["run_id"].tolist()
    labels = dict(zip(table["run_id"], table["label"]))
    frame = breakdown_frame(epochs_frame(store.read_epoch_metrics(engine, run_ids)), labels)
    return frame, breakdown_missing(frame, run_ids, labels)


def _num(value, pattern: str, missing: str = "-") -> str:
    return missing if value is None or pd.isna(value) else pattern.format(value)


def waiting_for(table: pd.DataFrame) -> str | None:
    """The line saying which runs a verdict waits for, while any run of ``table`` is queued or running."""
    active = table[table["status"].isin(ACTIVE_STATUSES)]
    if active.empty:
        return None
    names = [f"{row.label} ({row.status})" for row in active.itertuples()]
    return (f"Waiting for {', '.join(names)} to finish: the fastest strategy and the speedups it rests on are "
            "named once every run compared has finished, so that no verdict is drawn from half the runs.")
def _has(strategy: str, flag: str) -> bool:
    """Whether ``strategy`` has ``flag`` (a StrategySpec field); False for a strategy only a newer version knows."""
    known = find(strategy)
    return known is not None and bool(getattr(known, flag))


def strategy_advice(table: pd.DataFrame) -> str:
    """One plain sentence from the sweep's numbers, e.g. 'DDP on 2 devices: 1.80x, 90% efficient;
    MP: 1.10x. Fastest: DDP — the model fits one device, so prefer it over MP and PP.' While a run is
    queued or running, the line saying what it waits for (``waiting_for``)."""
    if waiting := waiting_for(table):
        return waiting
    done = table[(table["status"] == "completed") & table["throughput_images_per_s"].notna()]
    if done.empty:
        return "No run of this sweep completed: there is nothing measured to compare."
    parts = [
        f"{row.strategy.upper()} on {row.devices} device{'s' if row.devices > 1 else ''}: "
        f"{row.speedup:.2f}x, {row.efficiency:.0%} efficient"
        for row in done.itertuples() if not _has(row.strategy, "baseline") and pd.notna(row.speedup)
    ]
    best = done.loc[done["throughput_images_per_s"].idxmax()]
    if _has(best["strategy"], "baseline"):
        verdict = ("Fastest: SINGLE — on these devices no parallel strategy beats one device "
                   "(on CPU the processes share the same cores); parallelism pays off on GPUs.")
    else:
        verdict = f"Fastest: {best['strategy'].upper()}"
        # Data parallel (every device holds the whole model) beat model or pipeline parallel, and a
        # process-per-device data-parallel run was among them.
        data_parallel_ok = any(_has(name, "splits_batch") for name in done["strategy"])
        best_replicates = _has(best["strategy"], "splits_batch") or _has(best["strategy"], "scatters_batch")
        if best_replicates and any(_has(name, "staged") for name in done["strategy"]) and data_parallel_ok:
            verdict += " — the model fits one device, so prefer it over model and pipeline parallel."
        else:
            verdict += "."
    return ("; ".join(parts) + ". " if parts else "") + verdict


def scaling_figure(table: pd.DataFrame) -> go.Figure:
    """Speedup of each run against the ideal line (speedup = number of devices): each bar named and
    coloured as the run is in every chart of a comparison (``run_label``, ``run_colours``)."""
    fig = go.Figure()
    colours = run_colours(table["run_id"])
    fig.add_bar(x=table["label"], y=table["speedup"], name="speedup over single",
                marker_color=[colours[run_id] for run_id in table["run_id"]],
                text=table["speedup"].map(lambda v: _num(v, "{:.2f}x")), textposition="outside")
    fig.add_scatter(x=table["label"], y=table["devices"], mode="markers+lines", name="ideal (= devices)",
                    line=dict(dash="dash", color="gray"))
    fig.update_layout(title="Speedup over one device", yaxis_title="x single", margin=dict(l=10, r=10, t=50, b=40))
    return fig


def sweep_html(engine, sweep_id: int, *, target_acc: float = 0.9) -> str:
    """The scaling report as one self-contained HTML page (plotly.js inline, works offline)."""
    table = sweep_table(engine, sweep_id, target_acc=target_acc)
    forecast = sweep_forecast(engine, sweep_id)
    breakdown, no_breakdown = sweep_breakdown(engine, table)
    figures = [scaling_figure(table)] + ([breakdown_figure(breakdown)] if not breakdown.empty else [])
    steps = pd.DataFrame(profiles.read_steps(engine, table["run_id"].tolist()))
    if not steps.empty:
        figures.append(step_breakdown_figure(steps))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Parallax sweep {sweep_id}</title>
<style>{REPORT_CSS}</style>
</head><body><h1>Strategy sweep {sweep_id}</h1>
<p><b>{html.escape(strategy_advice(table))}</b></p>
{report_frame(table).to_html(index=False)}
{"".join(f"<p>{html.escape(line)}</p>" for line in energy_reasons(table))}
<p>Time to target: wall time until validation accuracy first reached {target_acc:.0%}.</p>
<p>{html.escape(ESTIMATE_ERROR_NOTE)}</p>
{"".join(f"<p>{html.escape(line)}</p>" for line in filter(None, [mfu_note(table), no_breakdown]))}
<h2>Scaling forecast</h2>
{forecast_display(possible(forecast.table)).to_html(index=False) if not possible(forecast.table).empty else ""}
{(f"<h3>{HYPOTHETICAL_HEADING}</h3>" + forecast_display(hypothetical(forecast.table)).to_html(index=False))
 if not hypothetical(forecast.table).empty else ""}
{"".join(f"<p>{html.escape(line)}</p>" for line in [*forecast.notes, *forecast.assumptions])}
{charts_html(figures)}</body></html>"""
