"""The state of the machine a benchmark ran on: who else used the CPU meanwhile, and what it is.

    share = CpuShare(); share.start(); ...; share.stop()     # cores other processes kept busy
"""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import time
from pathlib import Path
from typing import Any


class CpuShare:
    """How busy the machine was with other people's work while a benchmark ran.

    /proc/stat gives the whole machine's busy time; getrusage gives this process's and its
    reaped children's. The difference is what everything else used. Processes we start but do
    not reap (a launched run's detached supervisor) are added with ``count_as_own``."""

    def __init__(self) -> None:
        self._start = self._read()
        self._extra_own_s = 0.0

    def count_as_own(self, cpu_seconds: float) -> None:
        """CPU time of processes this benchmark started but does not reap (a launched supervisor)."""
        self._extra_own_s += cpu_seconds

    @staticmethod
    def _read() -> tuple[float, float, float]:
        ticks = os.sysconf("SC_CLK_TCK")
        try:
            with open("/proc/stat") as stat:
                fields = [int(x) for x in stat.readline().split()[1:]]
            busy = (sum(fields) - fields[3] - fields[4]) / ticks  # all but idle and iowait
        except (OSError, ValueError, IndexError):
            busy = float("nan")
        own = sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
                  for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        return time.monotonic(), busy, own

    def others_cores(self) -> float:
        """Average number of cores other processes kept busy since this object was made."""
        now, busy, own = self._read()
        start, busy0, own0 = self._start
        elapsed = max(now - start, 1e-9)
        return max(0.0, ((busy - busy0) - (own - own0) - self._extra_own_s) / elapsed)


def process_tree_cpu_s(pid: int) -> float:
    """User and system CPU seconds used so far by ``pid`` and its live descendants (Linux)."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    from trainer_backend.control.lifecycle import proc_stats

    ticks = os.sysconf("SC_CLK_TCK")
    for process, fields in proc_stats():
        parents[process] = int(fields[1])
        cpu[process] = (int(fields[11]) + int(fields[12])) / ticks
    tree, changed = {pid}, True
    while changed:
        grown = tree | {child for child, parent in parents.items() if parent in tree}
        changed, tree = grown != tree, grown
    return sum(cpu.get(p, 0.0) for p in tree)


def memory_mb(pid: int) -> dict[str, float]:
    """A process's resident memory (RSS: every page it maps that is in memory, shared libraries whole) and
    its proportional share (PSS: each shared page divided among the processes that map it), in MB (Linux)."""
    status = Path(f"/proc/{pid}/status").read_text()
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    rss_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    pss_kb = next(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:"))
    return {"rss_mb": rss_kb / 1024, "pss_mb": pss_kb / 1024}


# What a process that has imported torch (or torchvision) maps: their compiled extensions and libraries. timm
# is pure Python and imports torch.
TORCH_FILES = ("/torch/", "/torchvision/")


def torch_files_mapped(pid: int) -> list[str]:
    """The files of torch or torchvision a process maps (none unless it imported them), from /proc/PID/maps."""
    paths = {line.split(maxsplit=5)[5] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
             if len(line.split(maxsplit=5)) == 6}
    return sorted(path for path in paths if any(part in path for part in TORCH_FILES))


def child_pids(pid: int) -> list[int]:
    """The live children of ``pid`` (Linux)."""
    from trainer_backend.control.lifecycle import proc_stats

    return sorted(process for process, fields in proc_stats() if int(fields[1]) == pid)


def machine_info() -> dict[str, Any]:
    import torch

    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    return {
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu": cpu_model,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
    }
