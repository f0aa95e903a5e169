"""A run's efficiency figures: MFU, where each rank's time goes, what each device's memory holds.

The trainer makes one ``RunMeasures`` per process and asks it, every epoch, for the epoch's
``extra`` figures (collective: every rank calls it at the same point):

    flops = count_flops_per_image(model, ...)                # rank 0, before the strategy wraps the model
    measures = RunMeasures(strategy, model, optimizer, amp_dtype, flops)
    store.set_measurements(engine, run_id, measures.once_per_run())       # rank 0
    extra = measures.epoch_extra(epoch, train_time_s, images, slowest_train_time_s)
    store.add_notes(engine, run_id, measures.take_notes())                 # rank 0

See flops.py (FLOPs, peaks), rank_times.py (per-rank times, stragglers) and memory_breakdown.py.
"""

from __future__ import annotations

import torch
from torch import nn

from trainer_backend.telemetry.flops import MEASURED_ON_CPU, Peak, achieved_tflops, cpu_peak_tflops, device_peak, mfu
from trainer_backend.telemetry.memory_breakdown import CPU_ACTIVATIONS_NOTE, HeldMemory, memory_breakdown, peak_memory_mb
from trainer_backend.telemetry.rank_times import find_stragglers, gather_rank_times, straggler_note

FLOPS_NOT_COUNTED_NOTE = "MFU is not shown: the model's FLOPs could not be counted (the run's log says why)."


class RunMeasures:
    def __init__(self, strategy, model: nn.Module, optimizer: torch.optim.Optimizer, amp_dtype: torch.dtype | None,
                 flops_per_image: float | None):
        self.strategy = strategy
        self.held = HeldMemory(model, optimizer, strategy.devices)
        self.flops_per_image = flops_per_image
        # Every process of a multi-process run computes on devices like rank 0's (one each).
        self.peak: Peak | None = (device_peak(strategy.devices, amp_dtype, processes=strategy.world_size)
                                  if strategy.is_main else None)
        self.history: list[list[dict]] = []
        self.named_stragglers: set[int] = set()
        self._notes: list[str] = []
        self._remeasured = False
        if strategy.is_main and flops_per_image is None:
            self._notes.append(FLOPS_NOT_COUNTED_NOTE)
        if self.peak is not None and self.peak.tflops is None:
            self._notes.append(f"MFU is not shown: {self.peak.source}.")
        if strategy.is_main and any(d.type == "cpu" for d in strategy.devices):
            self._notes.append(CPU_ACTIVATIONS_NOTE)

    def once_per_run(self) -> dict:
        """The figures for ``runs.measurements`` (rank 0)."""
        return {"flops_per_image": self.flops_per_image,
                "peak_tflops": None if self.peak is None else self.peak.tflops,
                "peak_source": None if self.peak is None else self.peak.source}

    def epoch_extra(self, epoch: int, train_time_s: float, images: float, slowest_train_time_s: float) -> dict:
        """``ranks``, ``stragglers`` and ``memory_breakdown`` on every rank; ``achieved_tflops``
        and ``mfu`` on rank 0 (over the global batch and the slowest rank's training time)."""
        strategy = self.strategy
        ranks = gather_rank_times(strategy, strategy.rank_clock.epoch_times(train_time_s))
        breakdown = memory_breakdown(strategy, self.held.mb, peak_memory_mb(strategy.devices))
        self.history.append(ranks)
        stragglers = find_stragglers(self.history)
        for rank in stragglers:
            if rank not in self.named_stragglers:
                self.named_stragglers.add(rank)
                self._notes.append(straggler_note(rank, ranks, epoch))
        extra = {"ranks": ranks, "stragglers": stragglers, "memory_breakdown": breakdown}
        if self.flops_per_image is not None and slowest_train_time_s > 0:
            achieved = achieved_tflops(self.flops_per_image, images, slowest_train_time_s)
            extra["achieved_tflops"] = significant(achieved)
            self._check_cpu_peak(achieved)
            utilisation = mfu(achieved, None if self.peak is None else self.peak.tflops)
            if utilisation is not None and utilisation > 1:
                utilisation = None
                self._notes.append(self._above_peak_note(epoch, achieved))
            extra["mfu"] = None if utilisation is None else significant(utilisation)
        return extra

    def _above_peak_note(self, epoch: int, achieved: float) -> str:
        if self.peak.source == MEASURED_ON_CPU:
            return (f"MFU of epoch {epoch} is not shown: training reached {achieved:.3g} TFLOPS, above the CPU peak "
                    f"measured ({self.peak.tflops:.3g}) even after measuring it again; other work held the cores "
                    "while it was measured.")
        # A datasheet peak cannot be beaten: the arithmetic the peak assumes is not what ran.
        return (f"MFU of epoch {epoch} is not shown: training reached {achieved:.3g} TFLOPS, above the datasheet "
                f"peak taken ({self.peak.tflops:.3g} TFLOPS, {self.peak.source}); the GPUs ran faster arithmetic "
                "than that peak assumes.")

    def _check_cpu_peak(self, achieved: float) -> None:
        """Training faster than the CPU's cached peak means the peak was measured while other work
        held the cores: measure it again (keeping the better figure) before computing MFU."""
        if self.peak is None or self.peak.source != MEASURED_ON_CPU or not self.peak.tflops:
            return
        if achieved <= self.peak.tflops:
            return
        processes = self.strategy.world_size
        per_process = cpu_peak_tflops(torch.get_num_threads(), at_least=achieved / processes)
        self.peak = Peak(per_process * processes, MEASURED_ON_CPU)
        self._remeasured = True

    def take_remeasured(self) -> dict:
        """The run's peak again (for ``runs.measurements``) when an epoch measured it anew, else {}."""
        if not self._remeasured:
            return {}
        self._remeasured = False
        return {"peak_tflops": self.peak.tflops, "peak_source": self.peak.source}

    def take_notes(self) -> list[str]:
        notes, self._notes = self._notes, []
        return notes


def significant(value: float, digits: int = 5) -> float:
    """``value`` to ``digits`` significant figures: a CPU's MFU can be 0.0002, a GPU's achieved 150."""
    return float(f"{value:.{digits}g}")
