"""Every rank's Python stacks on demand, for a run that stalls (supervisor/stall.py asks for them).

    register_stack_dump(folder, rank)   # in each rank, at setup

On ``STACK_SIGNAL`` ``faulthandler`` writes every thread's stack to ``rank<N>.stacks`` in the run's folder.
Its handler is C code: it answers even while the rank's main thread waits inside C++ (a gloo or NCCL
collective), where a Python signal handler would wait for the call to return.
"""

from __future__ import annotations

import faulthandler
import signal
from pathlib import Path

STACK_SIGNAL = signal.SIGUSR2
STACKS_FILE = "rank{rank}.stacks"
_stack_files: list = []  # the open files faulthandler writes to: they must outlive the registration


def register_stack_dump(folder: Path, rank: int) -> None:
    """Make this process write every thread's Python stack to its rank's stacks file on ``STACK_SIGNAL``."""
    handle = open(folder / STACKS_FILE.format(rank=rank), "a", encoding="utf-8")  # kept open for faulthandler
    _stack_files.append(handle)
    faulthandler.register(STACK_SIGNAL, file=handle, all_threads=True, chain=False)
