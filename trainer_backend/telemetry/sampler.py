"""System samples of a run, taken by a thread in the run's main process (the process that spawns
the ranks, or the only one; under torchrun, the process of local rank 0 on every machine, for the
ranks of its machine) every ``PARALLAX_SAMPLE_S`` seconds (default 1): host CPU % and memory,
each rank's CPU % and resident memory with its DataLoader workers summed in, and, through NVML,
each GPU the run uses (utilisation, memory used, power, temperature, SM clock).

    with SystemSampler(engine, run_id, started_at_s, cuda_indices=[0, 1]) as sampler:
        sampler.watch({0: pid_of_rank0, 1: pid_of_rank1})
        ...  # train

Samples are written a few seconds' worth at a time, to the run's database by default. A torchrun
machine other than rank 0's has no database: its sampler's ``sink`` carries the rows to rank 0
instead, and rank 0's sampler takes them in at each flush from its ``extra`` source
(``machine_samples``). The thread is a daemon and stops with the ``with`` block however training
ends, so it never keeps a process alive. A machine without NVML (no package, no driver) gets
samples with an empty ``gpus`` list.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Protocol

import psutil

from db import store, system_metrics
from db.connection import DatabaseLockedError, retry_when_locked
from contract.environment import seconds_from_env

from contract.devices import close_nvml, open_nvml

SAMPLE_ENV = "PARALLAX_SAMPLE_S"
DEFAULT_SAMPLE_S = 1.0
# Step points (trainer_backend.telemetry.steps) are read here too, so that the launcher checks both
# cadences without importing torch.
STEP_POINT_ENV = "PARALLAX_STEP_POINT_S"
DEFAULT_STEP_POINT_S = 0.5
FLUSH_S = 5.0
MB = 2**20


def sample_interval_s() -> float:
    """Seconds between system samples; a bad PARALLAX_SAMPLE_S is refused in one line."""
    return seconds_from_env(SAMPLE_ENV, DEFAULT_SAMPLE_S)


def step_point_s() -> float:
    """Least seconds between two step points; a bad PARALLAX_STEP_POINT_S is refused in one line."""
    return seconds_from_env(STEP_POINT_ENV, DEFAULT_STEP_POINT_S)


class Sink(Protocol):
    """Where a sampler's rows go."""

    why_dropped: str  # what to say of rows ``write`` could not record

    def write(self, rows: list[dict]) -> bool:
        """Record the rows; False where they were dropped (``why_dropped`` says why)."""

    def close(self, notes: list[str]) -> None:
        """The sampler has stopped; ``notes`` (perhaps none) say what its samples miss."""


class ExtraRows(Protocol):
    """Rows sampled elsewhere that a sampler records with its own (other machines' samples)."""

    def rows(self) -> list[dict]:
        """The rows that arrived since the last call."""

    def finish(self) -> list[dict]:
        """The last rows, once the others have stopped (or a bounded wait for them has passed)."""

    def notes(self) -> list[str]:
        """What the others said of their samples, and which ones are missing."""


class DatabaseSink:
    """The run's database: rows and notes are written to the run."""

    why_dropped = "the database stayed locked"

    def __init__(self, engine, run_id: int):
        self.engine, self.run_id = engine, run_id

    def write(self, rows: list[dict]) -> bool:
        try:
            retry_when_locked(lambda: system_metrics.add_samples(self.engine, self.run_id, rows),
                              what="record system samples")
            return True
        except DatabaseLockedError:
            return False

    def close(self, notes: list[str]) -> None:
        if notes:
            retry_when_locked(lambda: store.add_notes(self.engine, self.run_id, notes), what="note missing samples")


class SystemSampler:
    """``node`` is the machine's node rank in a torchrun job (0 elsewhere) and ``machine`` the name
    its notes give it where the run spans machines. ``sink`` defaults to the run's database
    (``engine``, ``run_id``); ``started_at_s`` 0 makes ``t_s`` wall time, for a sink that has no
    run start to count from."""

    def __init__(self, engine, run_id: int | None, started_at_s: float, cuda_indices: list[int] | None = None, *,
                 interval_s: float | None = None, flush_s: float = FLUSH_S, node: int = 0,
                 machine: str | None = None, sink: Sink | None = None, extra: ExtraRows | None = None):
        self.sink = sink if sink is not None else DatabaseSink(engine, run_id)
        self.extra, self.node, self.machine = extra, node, machine
        self.run_id, self.started_at_s = run_id, started_at_s
        self.cuda_indices = list(cuda_indices or [])
        self.interval_s = sample_interval_s() if interval_s is None else interval_s
        self.flush_s = flush_s
        self.cost_s = 0.0  # CPU seconds this thread spent sampling and writing
        self.written = self.dropped = 0
        self.error: str | None = None
        self._ranks: dict[int, int] = {}
        self._processes: dict[int, psutil.Process] = {}
        self._rows: list[dict] = []
        # stop() flushes after joining the thread, and a join can give up (a slow database or
        # store): then both could flush at once, reading other machines' batches twice.
        self._flush_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pynvml, self._gpus = None, {}

    def watch(self, ranks: dict[int, int]) -> None:
        """The ranks to sample from now on, {rank: pid}."""
        self._ranks = dict(ranks)

    def __enter__(self) -> SystemSampler:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self._pynvml, self._gpus = open_nvml(self.cuda_indices)
        psutil.cpu_percent(None)  # the first reading only sets the baseline
        self._thread = threading.Thread(target=self._run, name="parallax-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, write what is left, and say in the run's notes if samples are missing.
        Never raises: it runs while a run ends, and how the run ended must be what is recorded."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(10.0, 2 * self.interval_s))
        try:
            self._flush(last=True)
            close_nvml(self._pynvml)
            self.sink.close([*self.notes(), *(self.extra.notes() if self.extra is not None else [])])
        except Exception as exc:
            print(f"parallax: system samples of run {self.run_id} are incomplete: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)

    def notes(self) -> list[str]:
        """What this sampler's own samples miss, and why."""
        of = f" of {self.machine}" if self.machine else ""
        notes = []
        if self.error:
            notes.append(f"System sampling{of} stopped early: {self.error}")
        if self.dropped:  # rows taken in from other machines are among them: then they are of the run
            of_dropped = of if self.extra is None else ""
            notes.append(f"{self.dropped} system samples{of_dropped} were not recorded: {self.sink.why_dropped}.")
        return notes

    def _run(self) -> None:
        due = time.monotonic() + self.interval_s
        last_flush = time.monotonic()
        try:
            while not self._stop.wait(max(0.0, due - time.monotonic())):
                started = time.thread_time()
                self._rows.append(self.sample())
                now = time.monotonic()
                due = max(due + self.interval_s, now)  # a late sample does not bunch the next ones
                if now - last_flush >= self.flush_s:
                    self._flush()
                    last_flush = now
                self.cost_s += time.thread_time() - started
        except Exception as exc:  # the run trains on; the note written at stop says why samples end
            self.error = f"{type(exc).__name__}: {exc}"

    def _flush(self, last: bool = False) -> None:
        with self._flush_lock:
            rows, self._rows = self._rows, []
            if self.extra is not None:
                rows += self.extra.finish() if last else self.extra.rows()
            if not rows:
                return
            if self.sink.write(rows):
                self.written += len(rows)
            else:
                self.dropped += len(rows)

    def sample(self) -> dict:
        memory = psutil.virtual_memory()
        self._forget_ended()
        return {
            "t_s": round(time.time() - self.started_at_s, 3),
            "node": self.node,
            "host_cpu_pct": psutil.cpu_percent(None),
            "host_memory_mb": round((memory.total - memory.available) / MB, 1),
            "processes": [p for rank, pid in sorted(self._ranks.items()) if (p := self._rank_sample(rank, pid))],
            "gpus": [self._gpu_sample(index, handle) for index, handle in sorted(self._gpus.items())],
        }

    def _process(self, pid: int) -> psutil.Process:
        # Kept between samples: cpu_percent is measured since the same object's previous call.
        process = self._processes.get(pid)
        if process is None or not process.is_running():
            process = self._processes[pid] = psutil.Process(pid)
            process.cpu_percent(None)
        return process

    def _rank_sample(self, rank: int, pid: int) -> dict | None:
        """The rank's CPU % and resident memory with its children (DataLoader workers) summed in;
        None once the rank has ended (an exited rank waiting to be joined reads as nothing)."""
        try:
            rank_process = self._process(pid)
            with rank_process.oneshot():
                if rank_process.status() == psutil.STATUS_ZOMBIE:  # reads as 0 MB without raising
                    return None
                cpu_pct, rss = rank_process.cpu_percent(None), rank_process.memory_info().rss
            if rss == 0:  # exiting: its memory is already released, and it is not yet a zombie
                return None
            children = rank_process.children(recursive=True)
        except psutil.Error:
            return None
        for child in children:
            try:
                process = self._process(child.pid)
                with process.oneshot():
                    if process.status() == psutil.STATUS_ZOMBIE:
                        continue
                    child_cpu, child_rss = process.cpu_percent(None), process.memory_info().rss
            except psutil.Error:  # a supervisor that ended between the listing and the reading
                continue
            if child_rss == 0:  # exiting, as above
                continue
            cpu_pct, rss = cpu_pct + child_cpu, rss + child_rss
        return {"rank": rank, "cpu_pct": round(cpu_pct, 1), "rss_mb": round(rss / MB, 1)}

    def _forget_ended(self) -> None:
        for pid in [pid for pid, process in self._processes.items() if not process.is_running()]:
            del self._processes[pid]

    def _gpu_sample(self, index: int, handle) -> dict:
        nvml = self._pynvml
        return {
            "index": index,
            "util_pct": _read(nvml, lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            "memory_used_mb": _read(nvml, lambda: round(nvml.nvmlDeviceGetMemoryInfo(handle).used / MB, 1)),
            "power_w": _read(nvml, lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000),  # milliwatts
            "temperature_c": _read(nvml, lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
            "sm_clock_mhz": _read(nvml, lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
        }


def _read(nvml, read):
    """One NVML field, or None where this GPU does not report it (MIG instances, older boards)."""
    try:
        return read()
    except nvml.NVMLError:
        return None
