"""How a process that trains loads the engine: torch, timm and Parallax's modules, about 700,000
Python objects, all of which live as long as the process.

    with engine_imports():
        from trainer_backend.worker.runner import execute_run

Python's cyclic garbage collector runs again and again while those objects are created, and finds
nothing to free: pausing it for the imports takes about 0.6 s of CPU (12 %) off every process that
loads the engine (each ``parallax run``, launched worker, forkserver of CPU ranks and torchrun
rank). Then the loaded objects are frozen (``gc.freeze``): later full collections skip them (each
took about 0.2 s), and a forkserver's ranks, forked from it, do not write to the pages holding them
(the pattern the ``gc`` module's documentation gives for a process that forks workers), so those
pages stay shared.

Long-lived processes that import the engine among objects of their own (the dashboard) do not use
it: what is frozen is never collected.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def engine_imports() -> Iterator[None]:
    """Pause the garbage collector for the imports in the block, then freeze what exists. Where
    the collector is already off (a nested block, or the caller's own choice), it stays off."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
