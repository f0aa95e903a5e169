"""How a process that trains loads the training code: torch, timm and Parallax's modules, about 700,000
Python objects, all of which live as long as the process.

    with engine_imports():
        from trainer_backend.supervisor.runner import execute_run

Python's cyclic garbage collector runs again and again while those objects are created, and finds
nothing to free: pausing it for the imports takes about 0.6 s of CPU (12 %) off every process that
loads the training code (each ``parallax run``, launched supervisor and torchrun rank, and a forkserver of
CPU ranks that multiprocessing starts afresh). Then the loaded objects are frozen (``gc.freeze``):
later full collections skip them (each took about 0.2 s), and the CPU ranks forked from such a
process (or from its fork, supervisor.rank_server) do not write to the pages holding them (the pattern
the ``gc`` module's documentation gives for a process that forks workers), so those pages stay
shared.

What is frozen is never collected: the objects of the whole process at that moment, which in
these processes are the imports and a parsed command line. Long-lived processes that import the
engine among objects of their own (the dashboard) do not use it.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def engine_imports() -> Iterator[None]:
    """Pause the garbage collector for the imports in the block; if they loaded modules, freeze
    what exists then. Where the collector is already off (a nested block, or the caller's own
    choice) it stays off; where the block raises, nothing is frozen."""
    if not gc.isenabled():
        yield
        return
    loaded = len(sys.modules)
    gc.disable()
    try:
        yield
        if len(sys.modules) > loaded:  # a process that has the training code already has nothing new to freeze
            gc.freeze()
    finally:
        gc.enable()
