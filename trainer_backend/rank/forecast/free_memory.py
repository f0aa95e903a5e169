"""Free memory where a run would train, and whether an estimate fits in it: each device's estimated peak
against its free memory, with the verdict in words. Torch-free, so that the dashboard answers it in its own
process (trainer_backend/control/inspect.py); memory_fit.py tries the changes that would fit.

    free = available_memory_mb(config)                    # NVML for GPUs, MemAvailable for the host
    for fit in fits({"cuda:0": 52_000.0}, free):
        print(fit.device, fit.verdict)                   # "cuda:0 needs about 51 GB, 39 GB free"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from contract.config import RunConfig

if TYPE_CHECKING:
    from trainer_backend.rank.forecast.memory_estimate import MemoryEstimate


def available_memory_mb(config: RunConfig) -> dict[str, float]:
    """Free memory where the run would train: every GPU's (NVML: total less used; the others too,
    for the changes ``suggestions`` tries), or for CPU runs the machine's available memory under
    the one label "cpu" (all processes share it)."""
    if not config.uses_cuda:
        available = host_available_mb()
        return {} if available is None else {"cpu": available}
    from contract.devices import gpu_statuses

    return {f"cuda:{g.index}": g.memory_total_mb - g.memory_used_mb for g in gpu_statuses()}


def host_available_mb() -> float | None:
    """MemAvailable from /proc/meminfo: what new processes can take without swapping."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def gb(mb: float, digits: int | None = None) -> str:
    value = mb / 1024
    if digits is None:
        digits = 0 if value >= 10 else 1
    return f"{value:.{digits}f} GB"


def verdict(needed_mb: float, free_mb: float) -> str:
    """'fits, 31 GB to spare' / 'needs about 52 GB, 39 GB free'."""
    if needed_mb <= free_mb:
        return f"fits, {gb(free_mb - needed_mb)} to spare"
    digits = None if gb(needed_mb) != gb(free_mb) else 1  # "needs about 21 GB, 21 GB free" would say nothing
    return f"needs about {gb(needed_mb, digits)}, {gb(free_mb, digits)} free"


@dataclass(frozen=True)
class Fit:
    device: str
    needed_mb: float
    free_mb: float

    @property
    def fits(self) -> bool:
        return self.needed_mb <= self.free_mb

    @property
    def verdict(self) -> str:
        return verdict(self.needed_mb, self.free_mb)


def fits(estimate: MemoryEstimate | dict[str, float], free_mb: dict[str, float]) -> list[Fit]:
    """Each device's estimate (or {device: total MB}) against its free memory; CPU processes
    share the host's memory, so a CPU run's devices are summed against it."""
    totals = estimate if isinstance(estimate, dict) else {d.label: d.total_mb for d in estimate.devices}
    if "cpu" in free_mb and all(label.endswith("cpu") for label in totals):
        return [Fit("cpu", sum(totals.values()), free_mb["cpu"])]
    return [Fit(label, total, free_mb[label]) for label, total in totals.items() if label in free_mb]
