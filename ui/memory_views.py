"""Will it fit? The Launch page's memory estimate: each chosen device's estimated peak against
its free memory (NVML for GPUs, the host's available memory for CPU processes), a verdict, and
when it does not fit the changes that would, each one estimated. In "Compare strategies" mode a
table of every strategy's estimate.

Estimates are cached per config (``st.cache_data``), and the page draws them after the form, so
a change to any field redraws the form first and the estimate follows.
"""

from __future__ import annotations

import json

import streamlit as st

from contract import devices as device_info
from contract.config import RunConfig
from ui.text import escape_markdown

# Free memory moves while other work runs; suggestions are cached per 256 MB of it.
FREE_MB_STEP = 256


@st.cache_data(show_spinner="Estimating the memory per device…", max_entries=128)
def cached_estimate(config_json: str, num_classes: int, in_chans: int) -> dict:
    """The estimate of a config as a dict (``MemoryEstimate.to_dict``), or {"error": why}."""
    from trainer_backend.engine.forecast.memory_estimate import estimate_memory

    config = RunConfig.from_dict(json.loads(config_json))
    try:
        return estimate_memory(config, num_classes=num_classes, in_chans=in_chans).to_dict()
    except ValueError as exc:  # a model, batch or split the estimate names
        return {"error": str(exc)}
    except Exception as exc:  # an architecture fake tensors cannot step: the form stays usable
        return {"error": f"{config.model} could not be stepped under fake tensors ({type(exc).__name__}: {exc})"[:400]}


@st.cache_data(show_spinner="Estimating what would fit…", max_entries=64)
def cached_suggestions(config_json: str, num_classes: int, in_chans: int, free_steps: tuple, gpus: tuple) -> list[str]:
    from trainer_backend.engine.forecast.memory_fit import suggestions

    config = RunConfig.from_dict(json.loads(config_json))
    free_mb = {label: steps * FREE_MB_STEP for label, steps in free_steps}
    try:
        return suggestions(config, num_classes, in_chans, free_mb, list(gpus))
    except Exception:  # the estimate itself was made; a change that cannot be estimated is not offered
        return []


def device_fits(estimate: dict, free_mb: dict[str, float]) -> list:
    from trainer_backend.engine.forecast.memory_fit import fits

    return fits({label: d["total_mb"] for label, d in estimate["devices"].items()}, free_mb)


def memory_panel(config: RunConfig, num_classes: int, in_chans: int) -> None:
    """The estimate of ``config`` per device against its free memory, with a verdict each."""
    from trainer_backend.engine.forecast.memory_fit import available_memory_mb

    estimate = cached_estimate(json.dumps(config.to_dict(), sort_keys=True), num_classes, in_chans)
    st.markdown("**Will it fit?** Estimated peak memory per device")
    if "error" in estimate:
        st.caption(f"No memory estimate: {escape_markdown(estimate['error'])}")
        return
    free_mb = available_memory_mb(config)
    rows = device_fits(estimate, free_mb)
    for fit in rows:
        text = f"{fit.device}: {fit.verdict}"
        if fit.fits:
            st.markdown(f":green[:material/check_circle: {escape_markdown(text)}]")
        else:
            st.markdown(f":red[:material/error: {escape_markdown(text)}]")
    if not rows:
        st.caption("Free memory could not be read here: the estimate is shown without a verdict.")
    st.dataframe(estimate_table(estimate), hide_index=True)
    st.caption("State: parameters, gradients and optimizer state; comm: DDP's buckets, FSDP's gathered units, "
               "a pipeline's receive buffers; data: the dataset, kept on the GPU where it takes at most a tenth of it.")
    if any(not fit.fits for fit in rows):
        gpus = tuple(f"cuda:{g.index}" for g in device_info.gpu_statuses()) if config.uses_cuda else ()
        steps = tuple(sorted((label, int(mb // FREE_MB_STEP)) for label, mb in free_mb.items()))
        found = cached_suggestions(json.dumps(config.to_dict(), sort_keys=True), num_classes, in_chans, steps, gpus)
        if found:
            st.markdown("Would fit (each estimated): " + "; ".join(escape_markdown(f) for f in found) + ".")
        else:
            st.caption("No smaller batch, bf16, fsdp or more devices would fit, by the estimate.")
    for note in estimate.get("notes", []):
        st.caption(escape_markdown(note))


def estimate_table(estimate: dict) -> list[dict]:
    """The estimate's parts per device, in GB: the model's state (parameters, gradients,
    optimizer), activations, communication buffers, the dataset kept there, and the total."""
    def gb(mb: float) -> float:
        return round(mb / 1024, 2)

    return [{"device": label,
             "state GB": gb(parts["parameters_mb"] + parts["gradients_mb"] + parts["optimizer_mb"]),
             "activations GB": gb(parts["activations_mb"]), "comm GB": gb(parts["comm_mb"]),
             "data GB": gb(parts.get("data_mb", 0.0)), "total GB": gb(parts["total_mb"])}
            for label, parts in estimate["devices"].items()]


def compare_table(configs: list[RunConfig], num_classes: int, in_chans: int) -> None:
    """Every strategy's estimate side by side: its fullest device, and whether every device fits."""
    from trainer_backend.engine.forecast.memory_fit import available_memory_mb

    rows = []
    for config in configs:
        estimate = cached_estimate(json.dumps(config.to_dict(), sort_keys=True), num_classes, in_chans)
        row = {"strategy": config.strategy, "devices": ",".join(config.devices)}
        if "error" in estimate:
            rows.append({**row, "verdict": f"no estimate: {estimate['error']}"})
            continue
        fullest = max(estimate["devices"].values(), key=lambda d: d["total_mb"])
        worst = max(device_fits(estimate, available_memory_mb(config)), key=lambda f: f.needed_mb - f.free_mb,
                    default=None)
        rows.append({**row, "fullest device GB": round(fullest["total_mb"] / 1024, 2),
                     "state GB": round(
                         (fullest["parameters_mb"] + fullest["gradients_mb"] + fullest["optimizer_mb"]) / 1024, 2),
                     "activations GB": round(fullest["activations_mb"] / 1024, 2),
                     "verdict": "" if worst is None else f"{worst.device}: {worst.verdict}"})
    st.markdown("**Will it fit?** Estimated peak memory of each strategy's fullest device")
    st.dataframe(rows, hide_index=True)
