"""Does an estimate fit? Each device's estimated peak against its free memory (free_memory.py, torch-free),
the changes that would fit (each one estimated), and the estimate as a text table.

    free = available_memory_mb(config)                    # free_memory.py: NVML for GPUs, MemAvailable for the host
    for fit in fits(estimate, free):
        print(fit.device, fit.verdict)                   # "cuda:0 fits, 31 GB to spare"
    suggestions(config, num_classes, in_chans, free, gpus=["cuda:0", "cuda:1"])
"""

from __future__ import annotations

from contract.config import RunConfig
from contract.strategy_specs import memory_saver, spec
from trainer_backend.rank.forecast.free_memory import fits, verdict
from trainer_backend.rank.forecast.memory_estimate import MB, MemoryEstimate, StoredData, estimate_memory, stored_data


def all_fit(config: RunConfig, num_classes: int, in_chans: int, free_mb: dict[str, float],
            stored: StoredData | None = None) -> bool:
    estimate = estimate_memory(config, num_classes=num_classes, in_chans=in_chans, stored=stored)
    found = fits(estimate, free_mb)
    return bool(found) and all(f.fits for f in found)


def suggestions(config: RunConfig, num_classes: int, in_chans: int, free_mb: dict[str, float],
                gpus: list[str] | None = None) -> list[str]:
    """Changes that would fit, each checked by estimating it: a smaller batch (the largest that
    fits, of the ones the strategy allows), bf16, fsdp on the same devices, more devices. None
    of them changes the dataset, so it is looked at once for all of them."""
    found: list[str] = []
    stored = stored_data(config)

    def check(label: str, **changes) -> bool:
        try:
            changed = config.replace(**changes)
            wanted = available_for(changed)
            if wanted is None or not all_fit(changed, num_classes, in_chans, wanted, stored):
                return False
        except ValueError:  # a change the config refuses, or one step that cannot run (ConfigError is one)
            return False
        found.append(label)
        return True

    def available_for(changed: RunConfig) -> dict[str, float] | None:
        if not changed.uses_cuda:
            return free_mb
        return free_mb if all(d in free_mb for d in changed.devices) else None

    strategy, saver = spec(config.strategy), memory_saver().name
    step = len(config.devices) if strategy.splits_batch else (config.microbatches if strategy.microbatched else 1)
    if (batch := largest_batch(config, num_classes, in_chans, free_mb, step, stored)) is not None:
        found.append(f"a global batch of {batch}")
    if config.uses_cuda and config.amp in ("off",):
        check("mixed precision bf16 (--amp bf16)", amp="bf16")
    if not strategy.shards_state and len(config.devices) > 1:
        check(f"{saver} on the same devices", strategy=saver)
    more = [g for g in (gpus or []) if g not in config.devices]
    if more and not strategy.one_device:
        devices = (*config.devices, *more)
        check(f"{config.strategy} on {len(devices)} GPUs ({','.join(devices)})", devices=devices)
    elif more and strategy.one_device:
        devices = (*config.devices, *more)
        check(f"{saver} on {len(devices)} GPUs ({','.join(devices)})", strategy=saver, devices=devices)
    return found


def largest_batch(config: RunConfig, num_classes: int, in_chans: int, free_mb: dict[str, float],
                  step: int, stored: StoredData | None = None) -> int | None:
    """The largest global batch below ``config``'s that fits (a multiple of ``step``): halved
    until one fits, then the step between that and the last that did not filled in from the
    activations' growth per image (nearly linear), each candidate checked by an estimate."""
    def needed(batch: int) -> float | None:
        try:
            estimate = estimate_memory(config.replace(batch_size=batch), num_classes=num_classes, in_chans=in_chans,
                                       stored=stored)
        except ValueError:
            return None
        found = fits(estimate, free_mb)
        return None if not found else max(f.needed_mb - f.free_mb for f in found)

    high, over_high = config.batch_size, needed(config.batch_size)
    low = (high // 2) // step * step
    while low >= step:
        over = needed(low)
        if over is not None and over <= 0:
            break
        high, over_high, low = low, over, (low // 2) // step * step
    else:
        return None
    if over_high is None or high - low <= step:
        return low
    per_image = (over_high - over) / (high - low)
    guess = min(high - step, low + int(-over / per_image) // step * step) if per_image > 0 else low
    while guess > low:  # activations grow a little faster than linearly at times: step back until it fits
        margin = needed(guess)
        if margin is not None and margin <= 0:
            return guess
        guess = max(low, guess - max(step, (guess - low) // 4 // step * step))
    return low


# --- the table ------------------------------------------------------------------------------

def table_rows(estimate: MemoryEstimate, free_mb: dict[str, float] | None = None) -> list[dict]:
    """One row per device: the parts in MB, the total, and with free memory the verdict."""
    free_mb = free_mb or {}
    rows = []
    for device in estimate.devices:
        row = {"device": device.label, **device.to_dict()}
        if device.label in free_mb:
            row["free_mb"] = round(free_mb[device.label], 1)
            row["verdict"] = verdict(device.total_mb, free_mb[device.label])
        rows.append(row)
    return rows


def format_table(estimate: MemoryEstimate, free_mb: dict[str, float] | None = None, *, notes: bool = True) -> str:
    """The estimate as a text table (the CLI's output)."""
    headers = ("device", "parameters", "gradients", "optimizer", "activations", "comm", "data", "total")
    rows = [(device.label, *(f"{v / MB:.1f} MB" for v in (device.parameters, device.gradients, device.optimizer,
                                                           device.activations, device.comm, device.data, device.total)))
            for device in estimate.devices]
    lines = aligned_columns(headers, rows)
    for fit in fits(estimate, free_mb or {}):
        lines.append(f"{fit.device}: {fit.verdict}")
    precision = estimate.amp_dtype or "float32"
    lines.append(f"strategy {estimate.strategy}, activations in {precision}")
    if notes:
        lines.extend(estimate.notes)
    return "\n".join(lines)


def aligned_columns(headers: tuple[str, ...], rows: list[tuple[str, ...]], gap: int = 2) -> list[str]:
    """Text table lines: each column as wide as its widest cell (a batch of 65,536 at 1,024 px has
    activations of 14,352,343.0 MB), ``gap`` spaces between columns; the first left-aligned, the
    figures right-aligned, so no two ever run together."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows)]
    space = " " * gap
    return [space.join(cell.ljust(width) if index == 0 else cell.rjust(width)
                       for index, (cell, width) in enumerate(zip(line, widths))).rstrip()
            for line in (headers, *rows)]
