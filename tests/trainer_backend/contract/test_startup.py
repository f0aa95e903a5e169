"""Loading the engine without the garbage collector running through it, and frozen once loaded."""

from __future__ import annotations

import gc
import importlib.util

from trainer_backend.contract.startup import engine_imports
from trainer_backend.worker.runner import RANK_PRELOAD


def test_the_collector_is_paused_for_the_imports_and_what_they_made_is_frozen():
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    try:
        with engine_imports():
            assert not gc.isenabled()
            made = [[] for _ in range(1000)]  # as an import makes module objects, each tracked by the collector
        assert gc.isenabled()
        assert gc.get_freeze_count() >= frozen + len(made)
    finally:
        gc.unfreeze()


def test_a_collector_the_caller_turned_off_stays_off_and_nothing_is_frozen():
    gc.disable()
    try:
        frozen = gc.get_freeze_count()
        with engine_imports():
            made = [[] for _ in range(1000)]
        assert not gc.isenabled() and gc.get_freeze_count() == frozen and made
    finally:
        gc.enable()


def test_an_error_in_the_imports_still_turns_the_collector_back_on():
    try:
        with engine_imports():
            raise ImportError("no module named parallax_missing")
    except ImportError:
        pass
    finally:
        gc.unfreeze()
    assert gc.isenabled()


def test_the_forkserver_preload_names_a_module_that_exists():
    """multiprocessing skips a preload name it cannot import without a word: the ranks would then
    each import the engine again, slower and unfrozen, and nothing would fail."""
    assert importlib.util.find_spec(RANK_PRELOAD) is not None
