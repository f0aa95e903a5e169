"""A sweep's scaling forecast: images/s, speedup and memory per device at 2x and 4x the devices
measured, from a simple model fitted to what the sweep measured.

The model, per strategy, with the global batch ``B`` fixed (as Parallax's batch size is):

- compute per device = k x t1 / n: ``t1`` the single-device step time, ``k`` how far the measured
  run's compute per device was from that ideal share (1 on independent devices);
- communication that is not hidden behind backward = latency x (n-1) + volume(n) x bytes/bandwidth,
  with volume(n) = 2(n-1)/n of the gradients for DDP's ring all-reduce and 3(n-1)/n for FSDP (an
  all-gather of the parameters in forward and in backward, a reduce-scatter of the gradients);
  fitted to the comm wait the ranks measured, so the overlap with backward is the one measured;
- a pipeline of p stages and m microbatches idles for the bubble (p-1)/(m+p-1) of its schedule:
  step = t1 (m+p-1)/(m p) plus a measured cost per stage boundary; MP is a pipeline with m = 1;
- memory per device: parameters, gradients and optimizer state stay whole under DDP and are split
  n ways under FSDP, PP and MP; activations and the rest follow the per-device batch, B/n, but for
  the dataset a CUDA run keeps on each GPU and cuBLAS's workspaces, which stay whole.

The fit uses each strategy's smallest measured multi-device run, so every larger measured run
tests the forecast (``error`` = predicted / measured - 1). A count the sweep did not measure is
checked by a later sweep's run where one measured it doing the same work (``reports.comparable``);
``measured_in`` names the run each measurement comes from.

    forecast = sweep_forecast(engine, sweep_id)
    print(format_forecast(forecast))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from db import dashboard, profiles, store
from db.run_state import ACTIVE_STATUSES
from contract import devices
from contract.strategy_specs import find, spec

from .comparable import STEP_TIME_FIELDS, comparable_runs
from .efficiency import BREAKDOWN_PARTS, ranks_frame, steady
from .scaling import device_count, epochs_frame, run_label, throughput_images_per_s

FORECAST_MULTIPLES = (2, 4)
FORECAST_COLUMNS = ("strategy", "devices", "kind", "images_per_s_predicted", "images_per_s_measured", "error",
                    "speedup_predicted", "speedup_measured", "memory_mb_predicted", "memory_mb_measured",
                    "memory_error", "run_id", "measured_in", "beyond_machine")
STATE_PARTS = ("parameters_mb", "gradients_mb", "optimizer_mb")


def ring_volume(strategy: str, n: int) -> float:
    """Gradient passes each device sends per step (ring all-reduce = reduce-scatter + all-gather)."""
    return spec(strategy).grad_sync_passes * (n - 1) / n if n > 1 else 0.0


def bubble_fraction(stages: int, microbatches: int) -> float:
    """The share of a GPipe / 1F1B schedule each stage idles: (p - 1) / (m + p - 1)."""
    return (stages - 1) / (microbatches + stages - 1)


def pipeline_step_s(t1_s: float, stages: int, microbatches: int) -> float:
    """Step time of a balanced pipeline without transfer costs: m + p - 1 slots of t1 / (m p) each,
    i.e. the ideal share t1 / p stretched by 1 / (1 - bubble)."""
    return t1_s * (microbatches + stages - 1) / (microbatches * stages)


@dataclass(frozen=True)
class CommModel:
    """Exposed communication per step = latency_s x (n - 1) + pass_s x volume(n)."""

    latency_s: float
    pass_s: float  # seconds to move the gradients once: gradient bytes / bandwidth

    def time_s(self, strategy: str, n: int) -> float:
        return 0.0 if n <= 1 else self.latency_s * (n - 1) + self.pass_s * ring_volume(strategy, n)


def fit_comm(strategy: str, points: list[tuple[int, float]]) -> CommModel:
    """Fit ``CommModel`` to (devices, exposed comm s per step). One device count cannot tell latency
    from bandwidth: it is all put on bandwidth (the larger term for a model's gradients)."""
    points = [(n, max(0.0, s)) for n, s in points if n > 1]
    if not points:
        return CommModel(0.0, 0.0)
    if len({n for n, _ in points}) == 1:
        n = points[0][0]
        return CommModel(0.0, float(np.mean([s for _, s in points])) / ring_volume(strategy, n))
    design = np.array([[n - 1, ring_volume(strategy, n)] for n, _ in points])
    target = np.array([s for _, s in points])
    (latency, per_pass), *_ = np.linalg.lstsq(design, target, rcond=None)
    if latency < 0 or per_pass < 0:  # keep the model physical: fit the one term that explains it
        per_pass = max(0.0, float(np.dot(design[:, 1], target) / np.dot(design[:, 1], design[:, 1])))
        latency = 0.0
    return CommModel(float(latency), float(per_pass))


@dataclass
class Measured:
    """What one run of the sweep measured, per training step."""

    run_id: int
    strategy: str
    devices: int
    batch_size: int
    microbatches: int
    images_per_s: float | None
    exposed_comm_s: float | None = None  # per step, when measured (ranks or profiler)
    comm_source: str = ""
    memory: dict[str, float] | None = None  # breakdown of the fullest device
    peak_memory_mb: float | None = None
    # What "activations and other" holds whatever the batch: the dataset a CUDA run keeps on each process's
    # GPU and cuBLAS's workspaces there, by the run's stored memory estimate.
    fixed_mb: float = 0.0
    sweep_id: int | None = None
    device: str = "cpu"  # the run's first device: what kind of device a count of them means

    @property
    def step_s(self) -> float | None:
        return self.batch_size / self.images_per_s if self.images_per_s else None

    @property
    def memory_mb(self) -> float | None:
        return sum(self.memory.values()) if self.memory else self.peak_memory_mb


@dataclass
class Forecast:
    table: pd.DataFrame
    assumptions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # why a strategy has no forecast


@dataclass(frozen=True)
class Machine:
    """What a machine can give a run: its CPU cores and its GPUs' names (``cuda:N`` is ``gpus[N]``)."""

    cpu_cores: int
    gpus: tuple[str, ...] = ()

    @classmethod
    def this(cls) -> Machine:
        return cls(devices.cpu_cores(), tuple(gpu.name for gpu in devices.gpu_statuses()))

    def beyond(self, device: str, n: int) -> str | None:
        """Why ``n`` devices like ``device`` (a run's first, "cpu" or "cuda:N") are more than this machine
        gives, or None where it gives them."""
        if not str(device).startswith("cuda"):
            if n <= self.cpu_cores:
                return None
            return (f"this machine has {self.cpu_cores} CPU cores: {n} processes would share them, and the "
                    "forecast takes devices as independent")
        index = devices.cuda_indices([device])[0]
        kind = self.gpus[index] if index < len(self.gpus) else None
        if kind is None:
            return f"this machine lists no {device}: {n} GPUs of the sweep's kind cannot be checked here"
        count = self.gpus.count(kind)
        if n <= count:
            return None
        return f"this machine lists {count} × {kind}: {n} would need {n - count} more of that kind"


def measure_runs(runs: list[dict[str, Any]], epochs: pd.DataFrame, steps: pd.DataFrame) -> list[Measured]:
    """One ``Measured`` per run of the sweep, from its steady epochs (and its profile, if any)."""
    ranks = ranks_frame(epochs)
    measured = []
    for run in runs:
        run_epochs = epochs[epochs["run_id"] == run["id"]]
        config = run["config"]
        m = Measured(run_id=run["id"], strategy=run["strategy"], devices=device_count(config),
                     batch_size=int(config.get("batch_size") or 0), microbatches=int(config.get("microbatches") or 1),
                     images_per_s=throughput_images_per_s(run_epochs) if run["status"] == "completed" else None,
                     sweep_id=run.get("sweep_id"), device=str((config.get("devices") or ["cpu"])[0]))
        m.memory, m.peak_memory_mb = _memory(run_epochs)
        m.fixed_mb = _fixed_mb(run.get("measurements"))
        m.exposed_comm_s, m.comm_source = _exposed_comm(m, ranks, steps, steady(run_epochs)["epoch"].tolist())
        measured.append(m)
    return measured


def _memory(run_epochs: pd.DataFrame) -> tuple[dict[str, float] | None, float | None]:
    """The breakdown of the device holding the most (what must fit), and the largest peak."""
    peaks = [mb for row in run_epochs.itertuples() for mb in (row.peak_memory_mb or {}).values()]
    breakdowns = [row.extra.get("memory_breakdown") for row in run_epochs.sort_values("epoch").itertuples()
                  if isinstance(row.extra, dict) and row.extra.get("memory_breakdown")]
    fullest = None
    if breakdowns:
        devices = [{k: float(parts.get(k) or 0.0) for k in BREAKDOWN_PARTS}
                   for parts in breakdowns[-1].values() if isinstance(parts, dict)]
        fullest = max(devices, key=lambda parts: sum(parts.values()), default=None)
    return fullest, (max(peaks) if peaks else None)


def _fixed_mb(measurements: dict | None) -> float:
    """The dataset the run kept on a GPU and cuBLAS's workspaces there, by its stored memory estimate (0 on
    CPU), on the device that holds the most of them."""
    devices = ((measurements or {}).get("memory_estimate") or {}).get("devices") or {}
    return max((float(parts.get("data_mb") or 0.0) + float(parts.get("workspace_mb") or 0.0)
                for parts in devices.values() if isinstance(parts, dict)), default=0.0)


def _exposed_comm(m: Measured, ranks: pd.DataFrame, steps: pd.DataFrame, epochs: list[int]) -> tuple[float | None, str]:
    """Comm not hidden behind compute, per step: the ranks' measured wait in collectives (as a share
    of their training time, times the step), else the profiler's communication time."""
    if m.devices < 2 or m.step_s is None:
        return None, ""
    mine = ranks[(ranks["run_id"] == m.run_id) & ranks["epoch"].isin(epochs)].dropna(subset=["comm_wait_s"])
    if not mine.empty and mine["train_time_s"].sum() > 0:
        return float(mine["comm_wait_s"].sum() / mine["train_time_s"].sum() * m.step_s), "comm wait per rank"
    if not steps.empty:
        profiled = steps[(steps["run_id"] == m.run_id) & (steps["rank"] == 0)]
        if not profiled.empty:
            return float(profiled["communication_ms"].mean() / 1000), "profiled communication"
    return None, ""


def forecast_runs(runs: list[dict[str, Any]], epochs: pd.DataFrame, steps: pd.DataFrame | None = None,
                  later: Sequence[Measured] = (), machine: Machine | None = None) -> Forecast:
    """The forecast of a sweep's runs (``runs`` as ``reports.sweep_report`` builds them). ``later``: runs of
    later sweeps doing the same work, newest first; each count the sweep did not measure is shown
    against the newest of them that measured it (the newest: a run repeated after a disturbed one
    is the one its user trusts)."""
    unknown = sorted({run["strategy"] for run in runs if find(run["strategy"]) is None})
    runs = [run for run in runs if find(run["strategy"]) is not None]  # a newer version's strategy has no model here
    active = [run for run in runs if run.get("status") in ACTIVE_STATUSES]
    if active:
        names = ", ".join(f"{run_label(run['id'], run['strategy'], device_count(run['config']), run['model'])} "
                          f"({run['status']})" for run in active)
        return Forecast(table=pd.DataFrame(columns=list(FORECAST_COLUMNS)),
                        notes=[f"Waiting for {names} to finish: the forecast is fitted on the sweep's finished runs."])
    measured = measure_runs(runs, epochs, steps if steps is not None else pd.DataFrame())
    rows: list[dict[str, Any]] = []
    assumptions = [
        "Model: step = compute per device (one device's step ÷ n, scaled as measured) + communication not "
        "hidden behind backward (latency × (n−1) + gradient bytes ÷ bandwidth × 2(n−1)/n for DDP, "
        "3(n−1)/n for FSDP), fitted on each strategy's smallest multi-device run; pipelines idle "
        "(p−1)/(m+p−1) of each step; memory: DDP keeps whole parameters, gradients and optimizer state "
        "on every device, FSDP/PP/MP split them n ways, activations follow the batch per device.",
        "Devices are taken as independent: on CPU the processes share the machine's cores, so counts past "
        "them are shown apart, as hypothetical.",
    ]
    notes: list[str] = [f"{name.upper()}: not forecast — a newer version of Parallax recorded it, and this one "
                        "does not know the strategy." for name in unknown]
    singles = [m for m in measured if spec(m.strategy).baseline and m.step_s]
    for strategy in dict.fromkeys(m.strategy for m in measured):
        if spec(strategy).baseline:
            continue
        if spec(strategy).scatters_batch:
            notes.append("DP: not forecast — DataParallel is one process driving its GPUs (a pass-through on CPU); "
                         "DDP is the strategy to scale.")
            continue
        own = sorted((m for m in measured if m.strategy == strategy), key=lambda m: m.devices)
        base = singles[0] if singles else next((m for m in own if m.devices == 1 and m.step_s), None)
        calibration = next((m for m in own if m.devices > 1 and m.step_s), None)
        if base is None or calibration is None:
            what = "a completed single-device run" if base is None else "a completed run on 2 or more devices"
            notes.append(f"{strategy.upper()}: no forecast — it needs {what} in the sweep.")
            continue
        predict, source = _predictor(strategy, base, calibration)
        if spec(strategy).grad_sync_passes:
            assumptions.append(f"{strategy.upper()} fitted on run #{calibration.run_id} ({calibration.devices} "
                               f"devices): {source}.")
        largest = max(m.devices for m in own)
        counts = sorted({*(m.devices for m in own if m.devices > calibration.devices),
                         *(k * largest for k in FORECAST_MULTIPLES)})
        for n in counts:
            step_s, memory_mb = predict(n)
            images_per_s = calibration.batch_size / step_s
            actual = next((m for m in own if m.devices == n and m.images_per_s), None)
            measured_in = f"run #{actual.run_id}" if actual else None
            if actual is None:
                actual = next((m for m in later if m.strategy == strategy and m.devices == n and m.images_per_s), None)
                measured_in = f"sweep #{actual.sweep_id}, run #{actual.run_id}" if actual else None
            rows.append({
                "strategy": strategy, "devices": n, "kind": "predicted vs measured" if actual else "forecast",
                "images_per_s_predicted": images_per_s,
                "images_per_s_measured": actual.images_per_s if actual else None,
                "error": images_per_s / actual.images_per_s - 1 if actual else None,
                "speedup_predicted": base.step_s / step_s,
                "speedup_measured": actual.images_per_s * base.step_s / base.batch_size if actual else None,
                "memory_mb_predicted": memory_mb,
                "memory_mb_measured": actual.memory_mb if actual else None,
                "memory_error": (memory_mb / actual.memory_mb - 1
                                 if actual and memory_mb is not None and actual.memory_mb else None),
                "run_id": actual.run_id if actual else None,
                "measured_in": measured_in,
                # A count this machine cannot give is forecast apart, as hypothetical, with the reason.
                "beyond_machine": None if actual or machine is None else machine.beyond(calibration.device, n),
            })
    table = pd.DataFrame(rows, columns=list(FORECAST_COLUMNS)).astype(
        {c: float for c in FORECAST_COLUMNS
         if c not in ("strategy", "devices", "kind", "run_id", "measured_in", "beyond_machine")})
    if any(str(where).startswith("sweep #") for where in table["measured_in"]):
        assumptions.append("Measured in “sweep #N, run #M”: a later sweep's completed run of that strategy on that "
                           "many devices (the newest), doing the same work: the same device type, "
                           f"{', '.join(STEP_TIME_FIELDS).replace('_', ' ')} (for PP also microbatches and "
                           "schedule).")
    return Forecast(table=table, assumptions=assumptions, notes=notes)


def _predictor(strategy: str, base: Measured, calibration: Measured):
    """(n -> (step s, memory MB per device or None), one line on what the fit found)."""
    t1, nc, step_c = base.step_s * calibration.batch_size / base.batch_size, calibration.devices, calibration.step_s
    memory = calibration.memory
    shards_state, microbatched = spec(strategy).shards_state, spec(strategy).microbatched

    def memory_at(n: int) -> float | None:
        if not memory:
            return None
        state = sum(memory[k] for k in STATE_PARTS) * (nc / n if shards_state else 1.0)
        # The dataset kept on the GPU and cuBLAS's workspaces are whole on each device, whatever the count:
        # only the rest scales.
        # A run that measured its kept dataset as its own part (data_mb) no longer has it in the rest.
        data = memory.get("data_mb", 0.0)
        fixed = min(max(0.0, calibration.fixed_mb - data), memory["activations_other_mb"])
        return state + data + (memory["activations_other_mb"] - fixed) * nc / n + fixed

    if spec(strategy).staged:
        m = calibration.microbatches if microbatched else 1
        per_boundary = max(0.0, step_c - pipeline_step_s(t1, nc, m)) / (nc - 1)
        source = f"{per_boundary * 1000:.1f} ms per stage boundary"
        return (lambda n: (pipeline_step_s(t1, n, max(m, n) if microbatched else 1) + per_boundary * (n - 1),
                           memory_at(n))), source
    exposed = calibration.exposed_comm_s
    if exposed is None:  # no comm measured: all of the step above the ideal share is counted as comm
        exposed, how = max(0.0, step_c - t1 / nc), "step time above one device's ÷ n (no comm measured)"
    else:
        how = calibration.comm_source
    exposed = min(exposed, step_c)
    compute_scale = (step_c - exposed) / (t1 / nc)
    comm = fit_comm(strategy, [(nc, exposed)])
    source = (f"exposed comm {exposed * 1000:.1f} ms per step from {how}, compute per device "
              f"{compute_scale:.2f}× the ideal share")
    grad_mb = (memory or {}).get("gradients_mb") or 0.0
    if grad_mb and comm.pass_s > 0:
        full_grad_mb = grad_mb * (nc if shards_state else 1)
        source += f", ≈ {full_grad_mb / 1024 / comm.pass_s:.2f} GB/s effective over {full_grad_mb:.0f} MB of gradients"
    return (lambda n: (compute_scale * t1 / n + comm.time_s(strategy, n), memory_at(n))), source


def sweep_forecast(engine, sweep_id: int, machine: Machine | None = None) -> Forecast:
    """The forecast of a stored sweep, checked against its own runs and later sweeps' comparable ones;
    counts ``machine`` (this one by default) cannot give are marked ``beyond_machine``."""
    run_ids = store.sweep_run_ids(engine, sweep_id)
    runs = dashboard.runs_for_compare(engine, run_ids)
    epochs = epochs_frame(store.read_epoch_metrics(engine, run_ids))
    later = []
    if runs:
        candidates = store.later_sweep_runs(engine, sweep_id, models={run["model"] for run in runs},
                                            datasets={run["dataset"] for run in runs})
        later_runs = comparable_runs(runs, candidates)
        # Their profiles are left unread: these runs only check the forecast, they fit none of it.
        later_epochs = epochs_frame(store.read_epoch_metrics(engine, [run["id"] for run in later_runs]))
        later = measure_runs(later_runs, later_epochs, pd.DataFrame())
    return forecast_runs(runs, epochs, pd.DataFrame(profiles.read_steps(engine, run_ids)), later,
                         machine or Machine.this())


def _num(value, pattern: str, missing: str = "-") -> str:
    return missing if value is None or pd.isna(value) else pattern.format(value)


HYPOTHETICAL_HEADING = "Hypothetical: device counts this machine cannot give"
BEYOND_COLUMN = "why hypothetical"


def possible(table: pd.DataFrame) -> pd.DataFrame:
    """The forecast's rows this machine can give (or that were measured)."""
    return table[table["beyond_machine"].isna()]


def hypothetical(table: pd.DataFrame) -> pd.DataFrame:
    """The forecast's rows for counts this machine cannot give, each with its reason."""
    return table[table["beyond_machine"].notna()]


def forecast_display(table: pd.DataFrame) -> pd.DataFrame:
    """The forecast as text columns (shared by the terminal, the HTML report and the Sweep page); a cell
    nothing measured is blank. Rows beyond the machine get their reason in a last column."""
    shown = pd.DataFrame({
        "strategy": table["strategy"],
        "devices": table["devices"],
        "images/s predicted": table["images_per_s_predicted"].map(lambda v: _num(v, "{:.0f}")),
        "images/s measured": table["images_per_s_measured"].map(lambda v: _num(v, "{:.0f}", "")),
        "error": table["error"].map(lambda v: _num(v, "{:+.0%}", "")),
        "speedup predicted": table["speedup_predicted"].map(lambda v: _num(v, "{:.2f}x")),
        "speedup measured": table["speedup_measured"].map(lambda v: _num(v, "{:.2f}x", "")),
        "MB/device predicted": table["memory_mb_predicted"].map(lambda v: _num(v, "{:.0f}")),
        "MB/device measured": table["memory_mb_measured"].map(lambda v: _num(v, "{:.0f}", "")),
        "measured in": table["measured_in"].map(lambda v: v if isinstance(v, str) else ""),
    })
    if table["beyond_machine"].notna().any():
        shown[BEYOND_COLUMN] = table["beyond_machine"]
    return shown


def format_forecast(forecast: Forecast) -> str:
    """The forecast for a terminal: the table, the hypothetical counts apart, then the model's assumptions
    and any gaps."""
    lines = ["Scaling forecast"]
    table = forecast.table
    if not possible(table).empty:
        lines.append(forecast_display(possible(table)).to_string(index=False))
    if not hypothetical(table).empty:
        lines += [f"{HYPOTHETICAL_HEADING}:", forecast_display(hypothetical(table)).to_string(index=False)]
    if not table.empty and table["memory_mb_predicted"].isna().all():
        lines.append("Memory per device: not forecast — the sweep's runs recorded no memory breakdown.")
    lines += forecast.notes
    lines += forecast.assumptions if not table.empty else []
    return "\n".join(lines)
