"""Which runs measured the same step: the config fields that change how long a training step takes
(and what a device holds), so that a run of one sweep can check a forecast made from another.

A field a run recorded before it existed counts as RunConfig's default, which is what that run used.

    kept = comparable_runs(sweep_runs, later_runs)
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any

from db.dashboard import LIKE_FOR_LIKE_FIELDS
from contract.config import RunConfig
from contract.strategy_specs import find

# Beyond the like-for-like fields (dataset, model, global batch, image size, AMP), what changes a
# step's time or memory: bands, the input channels of the first convolution; optimizer, its update
# and its state; num_workers, whether loading hides behind compute; accumulate_steps, the optimizer
# steps and gradient syncs per batch; grad_clip, a norm over every gradient (a collective under FSDP);
# augment, work on the device per batch; channels_last and compile, the kernels that run; nodes,
# collectives between machines instead of within one. Left out, as they do not change a step: the
# learning rate and its schedule, seed, epochs, validation, profiling (its window lies in the first
# epoch, which throughput leaves out), tags.
STEP_TIME_FIELDS = (*LIKE_FOR_LIKE_FIELDS, "bands", "optimizer", "num_workers", "accumulate_steps", "grad_clip",
                    "augment", "channels_last", "compile", "nodes")
# Only a pipeline streams microbatches; every other strategy ignores these.
PIPELINE_FIELDS = ("microbatches", "pipeline_schedule")
_DEFAULTS = {f.name: f.default for f in fields(RunConfig) if f.default is not MISSING}


def step_time_key(config: dict[str, Any], strategy: str) -> tuple:
    """The values two runs must share for one's step to stand for the other's: the device type
    (a CPU run never checks a GPU forecast) and ``STEP_TIME_FIELDS``, plus ``PIPELINE_FIELDS`` for pp."""
    known = find(strategy)  # None for a strategy only a newer version knows
    names = STEP_TIME_FIELDS + (PIPELINE_FIELDS if known is not None and known.microbatched else ())
    device_type = str((config.get("devices") or ["cpu"])[0]).partition(":")[0]
    values = (config.get(name, _DEFAULTS.get(name)) for name in names)
    return (device_type, *(tuple(v) if isinstance(v, list) else v for v in values))


def comparable_runs(runs: list[dict[str, Any]], candidates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``candidates`` (dicts with ``strategy`` and ``config``) doing the same work per step as
    one of ``runs``, in their order."""
    wanted = {step_time_key(run["config"], run["strategy"]) for run in runs}
    return [run for run in candidates if step_time_key(run["config"], run["strategy"]) in wanted]
