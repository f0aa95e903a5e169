"""Profile a window of training steps with torch.profiler and summarise where the time went.

Each process (every DDP rank) records its own window in the first epoch — ``wait`` steps
skipped, ``warmup`` steps recorded and thrown away, ``active`` steps kept — and then stops the
profiler, so the rest of training runs at full speed. What it keeps, per rank:

- the Chrome trace (gzip), with ``distributedInfo`` so Perfetto and Holistic Trace Analysis can
  line up the ranks;
- the op table (``key_averages``): calls, self/total CPU and device time, memory;
- a per-step breakdown from the loop's ``record_function`` ranges: data loading, forward,
  backward, optimizer step, communication (collectives; it overlaps backward under DDP), other.

Ranks write these to ``runs/run-N/profile/``; rank 0 moves them into the database.

The profiler never fails the run: a first epoch that ends before the window keeps a step (a
``--profile-wait`` past the epoch's end, which preflight refuses where it can count the steps), or
a profiler that fails to export, leaves a summary that says why (``skipped``) and no trace, and the
run trains on; only a full disk ends it, as it ends every writer of the run's files.

An ERROR line in a run's log means an error, so two lines torch prints on every profiled CPU run
are kept out of it (see ``_quiet_profiler_lines``): Kineto's "gpuGetDeviceCount failed with code 35"
(it asks for GPU properties on a machine without a CUDA driver) and c10's "Memory block of unknown
size was allocated before the profiling started" (a block from before the window freed inside it).
"""

from __future__ import annotations

import contextlib
import ctypes
import gzip
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from contract.storage import DiskFullError, disk_full_error, no_space_reason, writing

PHASES = ("data_loading", "forward", "backward", "optimizer_step")
RANGE_PREFIX = "parallax/"
# Collectives as the host records them: c10d's ops and the backends' ranges (gloo:all_reduce,
# nccl:send). ATen ops are computation even when named like one (aten::gather, aten::scatter_add_),
# and so are their backward nodes (GatherBackward0): only collective names count.
HOST_COMM_MARKERS = ("c10d::", "c10d_functional::", "gloo:", "nccl:", "allreduce", "all_reduce", "allgather",
                     "all_gather", "reduce_scatter")
# Collectives as they run on a GPU: every NCCL kernel (ncclDevKernel_AllReduce_*, _SendRecv for
# pp, _Reduce and _Broadcast for DataParallel; ncclKernel_* before NCCL 2.19) and the
# peer-to-peer copies DataParallel scatters inputs and gathers outputs with.
DEVICE_COMM_PREFIXES = ("nccl",)
DEVICE_COMM_MARKERS = ("memcpy ptop",)
LARGE_TRACE_BYTES = 50 * 2**20
# What Kineto prints when it reads GPU properties for the trace where no CUDA driver answers (code
# 35, cudaErrorInsufficientDriver): on such a machine there are no GPU properties to read.
NO_CUDA_DRIVER_LINE = "gpuGetDeviceCount failed"
C10_LOG_ERROR = 2  # c10's severities: INFO 0, WARNING 1, ERROR 2, FATAL 3
QUIET_NOTE = ("profiler: torch's 'Memory block of unknown size' warning{cuda} left out of this log: "
              "not errors (see trainer_backend/telemetry/profiling.py)")


class StepProfiler:
    """Wraps torch.profiler for one window of steps; ``range(name)`` marks a phase of a step."""

    def __init__(self, *, wait: int, warmup: int, active: int, devices: list[torch.device], rank: int,
                 world_size: int, out_dir: Path, with_stack: bool = False):
        self.window = wait + warmup + active
        self.first_active_step = wait + warmup + 1
        self.active = active
        self.rank, self.world_size, self.out_dir = rank, world_size, out_dir
        self.cuda_devices = [d for d in devices if d.type == "cuda"]
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda_devices else [])
        self._prof = profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            record_shapes=True,
            profile_memory=True,
            with_stack=with_stack,
        )
        self._steps = 0
        self.done = False
        self._c10_level: int | None = None
        self._no_driver = not torch.cuda.is_available()

    def start(self) -> None:
        self._c10_level = _raise_c10_log_level()
        if self.rank == 0:
            cuda = " and Kineto's 'gpuGetDeviceCount failed' line (no CUDA driver here)" if self._no_driver else ""
            print(QUIET_NOTE.format(cuda=cuda), flush=True)
        self._prof.start()

    def range(self, name: str):
        if self.done:
            return contextlib.nullcontext()
        return _Phase(RANGE_PREFIX + name, self.cuda_devices)

    def step(self) -> None:
        if self.done:
            return
        self._steps += 1
        with _quiet_profiler_lines(drop_no_driver=self._no_driver):
            self._prof.step()  # the window's last step stops the trace: Kineto then reads GPU properties
        if self._steps >= self.window:
            self.finish()

    @property
    def kept_steps(self) -> int:
        """How many of the window's active steps ran: fewer than asked when the epoch ended first."""
        return max(0, min(self.active, self._steps - (self.first_active_step - 1)))

    def finish(self) -> None:
        """Stop profiling and write this rank's trace and summary (also for a short epoch). An epoch
        that ended before the window kept a step, or a profiler that fails, leaves a summary saying
        why and no trace: the run goes on (a full disk still ends it)."""
        if self.done:
            return
        self.done = True
        skipped = None
        try:
            with _quiet_profiler_lines(drop_no_driver=self._no_driver):
                self._prof.stop()
        except Exception as exc:  # torch's own state machine: what it raises is not the run's business
            skipped = f"the profiler failed to stop ({type(exc).__name__}: {exc})"
        finally:
            _restore_c10_log_level(self._c10_level)
        if skipped is None and self._steps < self.first_active_step:
            # torch.profiler has no trace before its first active step (export_chrome_trace asserts).
            skipped = (f"the first epoch ended after {self._steps} steps, before the profiled window's first "
                       f"step ({self.first_active_step}: --profile-wait + --profile-warmup + 1)")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if skipped is None:
            try:
                self._write_trace()
                return
            except DiskFullError:
                raise
            except Exception as exc:
                skipped = f"the profiler's trace could not be exported ({type(exc).__name__}: {exc})"
        summary = {"rank": self.rank, "world_size": self.world_size, "trace_bytes": 0, "ops": [], "steps": [],
                   "kept_steps": 0, "skipped": skipped}
        with writing(self.out_dir / f"rank{self.rank}.summary.json", "profiler summary") as handle:
            handle.write(json.dumps(summary).encode())

    def _write_trace(self) -> None:
        trace = self.out_dir / f"rank{self.rank}.json"
        try:
            self._prof.export_chrome_trace(str(trace))
            content = json.loads(trace.read_text())
        except Exception as exc:  # the exporter reports a full disk only as a missing or cut-off file
            reason = no_space_reason(exc, self.out_dir)
            if reason is not None:
                raise disk_full_error("profiler trace", trace, reason) from exc
            raise
        finally:
            trace.unlink(missing_ok=True)
            trace.with_name(trace.name + ".tmp").unlink(missing_ok=True)  # the exporter's own part file
        # torch writes distributedInfo only for an initialised process group; multi-rank tools
        # (Holistic Trace Analysis) expect it on every trace.
        content.setdefault("distributedInfo", {"backend": "none", "rank": self.rank, "world_size": self.world_size})
        raw = json.dumps(content).encode()
        with writing(self.out_dir / f"rank{self.rank}.json.gz", "profiler trace") as handle:
            handle.write(gzip.compress(raw, compresslevel=6))
        trace_bytes = len(raw)
        summary = {"rank": self.rank, "world_size": self.world_size, "trace_bytes": trace_bytes,
                   "ops": op_table(self._prof), "steps": step_breakdown(self._prof.events(), self.first_active_step),
                   "kept_steps": self.kept_steps}
        try:
            with writing(self.out_dir / f"rank{self.rank}.summary.json", "profiler summary") as handle:
                handle.write(json.dumps(summary).encode())
        except BaseException:
            (self.out_dir / f"rank{self.rank}.json.gz").unlink(missing_ok=True)  # no trace without its summary
            raise


def _c10_log_level_flag() -> ctypes.c_int | None:
    """c10's log threshold (``FLAGS_caffe2_log_level``, what TORCH_CPP_LOG_LEVEL sets at start), or
    None where this torch build does not export it."""
    try:
        library = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libc10.so"))
        return ctypes.c_int.in_dll(library, "FLAGS_caffe2_log_level")
    except (OSError, ValueError):
        return None


def _raise_c10_log_level() -> int | None:
    """For the profiled window only, c10 logs errors and not warnings; returns the level it had.

    With ``profile_memory`` on, c10's CPU allocator logs "Memory block of unknown size was allocated
    before the profiling started" (every 1,000th time) when a block from before the window is freed
    inside it: a parameter's gradient, a batch. It is not an error (the op table counts what the
    window allocates), c10 has no switch for one message, and its log threshold is read on every
    message: the window's few steps run at ERROR, and the level is put back when it ends."""
    flag = _c10_log_level_flag()
    if flag is None or flag.value >= C10_LOG_ERROR:
        return None
    level, flag.value = flag.value, C10_LOG_ERROR
    return level


def _restore_c10_log_level(level: int | None) -> None:
    flag = _c10_log_level_flag()
    if level is not None and flag is not None:
        flag.value = level


@contextlib.contextmanager
def _quiet_profiler_lines(*, drop_no_driver: bool):
    """This process's stderr (the file descriptor: Kineto writes from C++) goes to a temporary file
    while the profiler stops, and comes back without Kineto's "gpuGetDeviceCount failed" line where
    no CUDA driver is present (``drop_no_driver``); every other line is kept, in order. Only the
    profiler's own step and stop are covered: no process starts then, so none keeps the temporary
    file as its stderr."""
    if not drop_no_driver:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(keepends=True)
                    if NO_CUDA_DRIVER_LINE.encode() not in line]
            if kept:
                os.write(2, b"".join(kept))


def phase_ranges(profiler: StepProfiler | None):
    """How a loop names its phases (``with phase("forward"):``): the profiler's ranges, or ranges
    that do nothing when the run is not profiled."""
    return profiler.range if profiler is not None else _no_range


def _no_range(name: str) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


class _Phase(record_function):
    """A record_function range that, on CUDA, waits for the phase's kernels so its length is the
    phase's real duration (only inside the profiled window)."""

    def __init__(self, name: str, cuda_devices: list[torch.device]):
        super().__init__(name)
        self._cuda_devices = cuda_devices

    def __exit__(self, *exc):
        for device in self._cuda_devices:
            torch.cuda.synchronize(device)
        return super().__exit__(*exc)


def op_table(prof: profile) -> list[dict]:
    rows = []
    for avg in prof.key_averages():
        if avg.key.startswith(RANGE_PREFIX) or avg.key.startswith("ProfilerStep"):
            continue  # our own ranges are in the step breakdown, not ops
        rows.append({
            "name": avg.key,
            "calls": int(avg.count),
            "self_cpu_us": float(avg.self_cpu_time_total),
            "cpu_total_us": float(avg.cpu_time_total),
            "self_device_us": float(getattr(avg, "self_device_time_total", 0.0)),
            "device_total_us": float(getattr(avg, "device_time_total", 0.0)),
            "self_cpu_memory_bytes": int(avg.self_cpu_memory_usage),
            "self_device_memory_bytes": int(getattr(avg, "self_device_memory_usage", 0)),
        })
    rows.sort(key=lambda r: r["self_cpu_us"] + r["self_device_us"], reverse=True)
    return rows


def _on_host(event) -> bool:
    return event.device_type == DeviceType.CPU


def _is_host_comm(name: str) -> bool:
    lowered = name.lower()
    return any(marker in lowered for marker in HOST_COMM_MARKERS)


def _is_device_comm(name: str) -> bool:
    lowered = name.lower()
    return lowered.startswith(DEVICE_COMM_PREFIXES) or any(marker in lowered for marker in DEVICE_COMM_MARKERS)


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def step_breakdown(events, first_step: int = 1) -> list[dict]:
    """Per profiled step: milliseconds in each phase; communication is the union of collective
    intervals in the step (under DDP they run during backward, so they overlap it).
    ``first_step`` is the training step (1-based) the kept window starts at.

    Steps and phases are the host's ``record_function`` ranges: with CUDA the profiler also
    lists a device-side copy of each range under the same name, which would count every step
    and phase twice. Communication is what the GPUs ran where they ran any (the host only
    enqueues NCCL work), else the host's collectives (gloo)."""
    host = [e for e in events if _on_host(e)]
    device = [e for e in events if not _on_host(e)]
    # The kept steps appear as "ProfilerStep*" (or "ProfilerStep#N"), in order.
    steps = sorted((e for e in host if e.name.startswith("ProfilerStep")), key=lambda e: e.time_range.start)
    rows = []
    for number, step in enumerate(steps, start=first_step):
        start, end = step.time_range.start, step.time_range.end
        inside = [e for e in host if start <= e.time_range.start and e.time_range.end <= end and e is not step]
        phase_us = {p: sum(e.time_range.elapsed_us() for e in inside if e.name == RANGE_PREFIX + p) for p in PHASES}
        if device:  # kernels, clipped to the step: one still running at its end counts up to the end
            comm = [(max(start, e.time_range.start), min(end, e.time_range.end)) for e in device
                    if _is_device_comm(e.name) and e.time_range.start < end and e.time_range.end > start]
        else:
            comm = [(e.time_range.start, e.time_range.end) for e in inside if _is_host_comm(e.name)]
        comm_us = _union_us(comm)
        total_us = end - start
        rows.append({
            "step": number,
            **{f"{p}_ms": phase_us[p] / 1000 for p in PHASES},
            "communication_ms": comm_us / 1000,
            "other_ms": max(0.0, total_us - sum(phase_us.values())) / 1000,
            "total_ms": total_us / 1000,
        })
    return rows


def read_rank_outputs(out_dir: Path) -> list[tuple[dict, bytes | None]]:
    """(summary, gzipped trace) of every rank that wrote one, in rank order; removes the files. The
    trace is None where the rank kept no profiled step (its summary's ``skipped`` says why)."""
    outputs = []
    for summary_path in sorted(out_dir.glob("rank*.summary.json"), key=lambda p: int(p.name[4:].split(".")[0])):
        rank = summary_path.name.split(".")[0]
        trace_path = out_dir / f"{rank}.json.gz"
        summary = json.loads(summary_path.read_text())
        outputs.append((summary, None if summary.get("skipped") else trace_path.read_bytes()))
        os.remove(summary_path)
        trace_path.unlink(missing_ok=True)
    return outputs
