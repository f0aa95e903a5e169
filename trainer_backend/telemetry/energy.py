"""Energy a run's devices use, from counters the hardware keeps: NVML's total-energy counter per
GPU (or, on GPUs without one, NVML's power readings integrated over time) and RAPL's package
counter for the CPU (``/sys/class/powercap``), where this machine lets us read it.

    meter = EnergyMeter.open(cuda_indices=[0, 1])
    meter.start(); ...; meter.tick(); ...; joules = meter.stop()   # {"gpu0": 512.3, "cpu_package": 88.0}
    meter.per_image(joules, images)  # J per image, or None where a device the run uses has no reading
    meter.missing                    # why a reading is absent, for the run's notes

``tick`` every second or so keeps the RAPL counter honest: it wraps at ``max_energy_range_uj``
(tens of minutes at full load), so a single before/after read around a long epoch could miss a
wrap. Nothing here estimates: a device without a readable counter or power reading has no figure.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable

from contract.devices import close_nvml, open_nvml

POWERCAP_DIR = Path("/sys/class/powercap")
# Package domains only (intel-rapl:0, intel-rapl:1): their subdomains (intel-rapl:0:0, cores) are
# already inside the package figure, and counting them too would count twice.
PACKAGE_DOMAIN = re.compile(r"intel-rapl:\d+$")


class RaplPackages:
    """The CPU packages' RAPL energy counters, in microjoules; ``reason`` says why there are none."""

    def __init__(self, root: Path = POWERCAP_DIR):
        self.domains: list[tuple[Path, int]] = []  # (energy_uj file, its wrap range)
        self.reason: str | None = None
        if not root.is_dir():
            self.reason = f"RAPL is not available ({root} does not exist)"
            return
        folders = sorted(p for p in root.iterdir() if PACKAGE_DOMAIN.match(p.name))
        if not folders:
            self.reason = f"RAPL is not available (no package domain under {root})"
            return
        try:
            for folder in folders:
                energy = folder / "energy_uj"
                energy.read_text()
                self.domains.append((energy, int((folder / "max_energy_range_uj").read_text())))
        except (OSError, ValueError) as exc:
            # Since 2020 kernels make energy_uj readable by root only (a power side channel).
            self.domains = []
            self.reason = f"RAPL is not readable ({type(exc).__name__}: {exc})"

    def read_uj(self) -> list[int]:
        return [int(path.read_text()) for path, _ in self.domains]

    def delta_uj(self, before: list[int], after: list[int]) -> int:
        total = 0
        for (_, wrap), b, a in zip(self.domains, before, after):
            total += a - b if a >= b else a + wrap - b
        return total


@dataclass
class _Source:
    """One device's reading: ``read`` gives a cumulative counter in joules, or (``is_power``) watts."""

    label: str
    read: Callable[[], float]
    is_power: bool = False
    joules: float = 0.0
    last: float = 0.0
    last_t: float = 0.0


@dataclass
class EnergyMeter:
    sources: list[_Source] = field(default_factory=list)
    gpu_labels: list[str] = field(default_factory=list)  # every GPU the run uses, readable or not
    missing: list[str] = field(default_factory=list)
    rapl: RaplPackages | None = None
    _pynvml: object = None
    _said: int = 0  # how many of ``missing`` the run's notes hold (note() says those known at open)

    @classmethod
    def open(cls, cuda_indices: list[int], powercap_dir: Path = POWERCAP_DIR) -> EnergyMeter:
        meter = cls(gpu_labels=[f"gpu{i}" for i in cuda_indices])
        pynvml, handles = open_nvml(cuda_indices)
        meter._pynvml = pynvml
        for index in cuda_indices:
            handle = handles.get(index)
            if handle is None:
                meter.missing.append(f"gpu{index}: NVML is not available")
                continue
            source = _gpu_source(pynvml, f"gpu{index}", handle)
            if source is None:
                meter.missing.append(f"gpu{index}: NVML reports neither its energy counter nor its power")
            else:
                meter.sources.append(source)
        rapl = RaplPackages(powercap_dir)
        if rapl.domains:
            meter.rapl = rapl
            meter.sources.append(_Source("cpu_package", _rapl_joules(rapl)))
        else:
            meter.missing.append(f"cpu_package: {rapl.reason}")
        return meter

    @property
    def complete(self) -> bool:
        """Every device the run computes on has a reading: its GPUs, or on a CPU run the package."""
        have = {s.label for s in self.sources}
        needed = self.gpu_labels or ["cpu_package"]
        return all(label in have for label in needed)

    def note(self) -> str | None:
        """Why energy per image is absent or partial (None when every counter reads)."""
        integrated = [s.label for s in self.sources if s.is_power]
        parts = []
        if integrated:
            parts.append(f"Energy of {', '.join(integrated)} is NVML's power readings integrated over time "
                         "(the GPU has no energy counter).")
        self._said = len(self.missing)
        if self.missing:
            why = "; ".join(self.missing)
            parts.append(f"Energy per image counts the GPUs only: {why}." if self.complete else
                         f"Energy per image is not recorded (no estimate is shown instead): {why}.")
        return " ".join(parts) or None

    def start(self) -> None:
        now = time.monotonic()
        for source in list(self.sources):
            value = self._read(source)
            if value is not None:
                source.joules, source.last, source.last_t = 0.0, value, now

    def tick(self) -> None:
        now = time.monotonic()
        for source in list(self.sources):
            value = self._read(source)
            if value is None:
                continue
            if source.is_power:  # trapezoids between power readings
                source.joules += (source.last + value) / 2 * (now - source.last_t)
            else:
                source.joules += value - source.last
            source.last, source.last_t = value, now

    def stop(self) -> dict[str, float]:
        self.tick()
        return {source.label: round(source.joules, 3) for source in self.sources}

    def _read(self, source: _Source) -> float | None:
        """The source's reading; a device that stops answering mid-run (a GPU fallen off the bus, a
        permission change) loses its figure, with the reason, rather than failing the run."""
        try:
            return source.read()
        except Exception as exc:  # NVMLError, OSError, ValueError: all mean no reading
            self.sources.remove(source)
            self.missing.append(f"{source.label}: its reading failed during the run ({type(exc).__name__}: {exc})")
            return None

    def take_notes(self) -> list[str]:
        """What the run's notes should gain since ``note()`` or the last call: a reading that failed
        during the run, from which epoch on energy per image is null."""
        new, self._said = self.missing[self._said:], len(self.missing)
        return [f"Energy per image is not recorded from this epoch on: {'; '.join(new)}."] if new else []

    def per_image(self, joules: dict[str, float], images: int) -> float | None:
        if not self.complete or images <= 0:
            return None
        return sum(joules.values()) / images

    def epoch_fields(self, joules: dict[str, float], images: int) -> dict:
        """The epoch's ``energy_j`` and ``energy_j_per_image``."""
        return {"energy_j": joules, "energy_j_per_image": self.per_image(joules, images)}

    def close(self) -> None:
        close_nvml(self._pynvml)
        self._pynvml = None


def _rapl_joules(rapl: RaplPackages) -> Callable[[], float]:
    """RAPL's wrapping counters as one counter in joules that does not wrap (between reads that
    are less than one wrap apart)."""
    state = {"last": rapl.read_uj(), "total_uj": 0}

    def read() -> float:
        now = rapl.read_uj()
        state["total_uj"] += rapl.delta_uj(state["last"], now)
        state["last"] = now
        return state["total_uj"] / 1e6

    return read


def _gpu_source(pynvml, label: str, handle) -> _Source | None:
    try:
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # millijoules since the driver loaded (Volta on)
        return _Source(label, lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000)
    except pynvml.NVMLError:
        pass
    try:
        pynvml.nvmlDeviceGetPowerUsage(handle)  # milliwatts
        return _Source(label, lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000, is_power=True)
    except pynvml.NVMLError:
        return None
