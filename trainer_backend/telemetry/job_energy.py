"""Energy per image of a torchrun job across machines.

A machine's counters (NVML, RAPL) are readable on that machine alone. So on every machine the
process of local rank 0 meters it, as rank 0 meters a run on one machine (``energy.EnergyMeter``:
the GPUs its ranks train on, ``cuda:LOCAL_RANK`` of each, and its CPU packages), and at the end of
each epoch every process of the job takes part in one object all-gather of those readings, taken
when the epoch's training ended. Rank 0 names each device by its machine (``node1:gpu0``) and divides their sum by the
global batch's images. Where any machine lacks a reading for a device the run uses, the epoch's
``energy_j_per_image`` is null, as on one machine, and the run's notes say which machine and why.

    part = EnergyPart(machines={0: "node 0 (gpu-a)", 1: "node 1 (gpu-b)"}, node=1, meters=True, cuda_indices=(0, 1))
    energy = JobEnergy.open(part)              # every process of the job at the same point: a collective
    energy.start(); energy.tick(); joules = energy.stop()   # this machine's joules, where it meters
    energy.epoch_fields(joules, images)        # every process once per epoch: a collective

Why a collective rather than torchrun's store (which carries the system samples, ``machine_samples``):
the readings are taken on the training thread at a point every rank reaches, so one all-gather there
is exact (each machine's figure for this very epoch, no bounded wait for a late machine, no keys to
clean up) and costs one small collective per epoch. The sampler's rows come from a thread of their
own, where a collective would interleave with training's; these do not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

import torch.distributed as dist

from trainer_backend.telemetry.energy import POWERCAP_DIR, EnergyMeter

Reading = dict  # {"node": int, "joules": {label: J}, "complete": bool, "missing": [why], "note": str | None}
Gather = Callable[[Reading | None], list]


@dataclass(frozen=True)
class EnergyPart:
    """This process's part in metering a job across machines: the job's machines by node rank, named
    for notes; this process's node; and whether it meters that machine (its local rank 0 does), with
    the CUDA indices its machine's ranks train on."""

    machines: dict[int, str]
    node: int
    meters: bool
    cuda_indices: tuple[int, ...] = ()


def all_gather(reading: Reading | None) -> list:
    """Every process's reading, in rank order (None from processes that do not meter). Object
    collectives move the pickled bytes on NCCL's device themselves (the current CUDA device)."""
    readings: list = [None] * dist.get_world_size()
    dist.all_gather_object(readings, reading)
    return readings


def combine(readings: list, machines: dict[int, str], images: int) -> tuple[dict[str, float], float | None]:
    """The job's energy: every machine's joules under ``node{n}:{device}``, and joules per image of
    the global batch, or None where a machine is missing or lacks a reading for a device the run uses."""
    energy_j: dict[str, float] = {}
    complete, seen = True, set()
    for reading in readings:
        if reading is None:
            continue
        seen.add(reading["node"])
        complete = complete and reading["complete"]
        energy_j.update({f"node{reading['node']}:{label}": joules for label, joules in reading["joules"].items()})
    complete = complete and seen >= set(machines)
    return energy_j, (sum(energy_j.values()) / images if complete and images > 0 else None)


class JobEnergy:
    """The energy of a job across machines, with ``StepHooks``' meter interface; ``take_notes``
    gives what rank 0 should add to the run's notes."""

    def __init__(self, part: EnergyPart, meter: EnergyMeter | None, gather: Gather = all_gather):
        self.part, self.meter, self._gather = part, meter, gather
        self._noted: set[tuple[int, str]] = set()  # (node, reason) already in the notes
        self._notes: list[str] = []

    @classmethod
    def open(cls, part: EnergyPart, *, powercap_dir: Path = POWERCAP_DIR, gather: Gather = all_gather) -> JobEnergy:
        """Open this machine's meter where this process meters it, and learn every machine's notes
        (a collective: every process of the job calls it at the same point)."""
        meter = EnergyMeter.open(list(part.cuda_indices), powercap_dir=powercap_dir) if part.meters else None
        energy = cls(part, meter, gather)
        readings = [r for r in gather(energy._reading({})) if r is not None]
        for reading in readings:
            if reading["note"]:
                energy._notes.append(f"{part.machines[reading['node']]}: {reading['note']}")
            energy._noted.update((reading["node"], why) for why in reading["missing"])
        for node in sorted(set(part.machines) - {r["node"] for r in readings}):
            energy._notes.append(f"{part.machines[node]}: Energy per image is not recorded (no estimate is shown "
                                 "instead): no process of the job meters this machine.")
        return energy

    def start(self) -> None:
        if self.meter is not None:
            self.meter.start()

    def tick(self) -> None:
        if self.meter is not None:
            self.meter.tick()

    def stop(self) -> dict[str, float]:
        return self.meter.stop() if self.meter is not None else {}

    def epoch_fields(self, joules: dict[str, float], images: int) -> dict:
        """The epoch's ``energy_j`` and ``energy_j_per_image`` over every machine (a collective)."""
        readings = self._gather(self._reading(joules))
        for reading in filter(None, readings):
            # A reading that failed during the run (a GPU fallen off the bus): said once, by machine.
            new = [why for why in reading["missing"] if (reading["node"], why) not in self._noted]
            if new:
                self._noted.update((reading["node"], why) for why in new)
                self._notes.append(f"{self.part.machines[reading['node']]}: {'; '.join(new)}.")
        energy_j, per_image = combine(readings, self.part.machines, images)
        return {"energy_j": energy_j, "energy_j_per_image": per_image}

    def take_notes(self) -> list[str]:
        notes, self._notes = self._notes, []
        return notes

    def close(self) -> None:
        if self.meter is not None:
            self.meter.close()

    def _reading(self, joules: dict[str, float]) -> Reading | None:
        if self.meter is None:
            return None
        return {"node": self.part.node, "joules": joules, "complete": self.meter.complete,
                "missing": list(self.meter.missing), "note": self.meter.note()}
