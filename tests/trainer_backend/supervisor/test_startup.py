"""Loading the training code without the garbage collector running through it, and frozen once loaded."""

from __future__ import annotations

import gc
import importlib
import sys

import pytest

from trainer_backend.supervisor.startup import engine_imports
from trainer_backend.supervisor.runner import RANK_PRELOAD


@pytest.fixture
def new_module(tmp_path, monkeypatch):
    """The name of a module nothing has imported yet, as the training code is to a fresh process."""
    (tmp_path / "parallax_fresh_module.py").write_text("TABLE = [[] for _ in range(1000)]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "parallax_fresh_module"
    sys.modules.pop("parallax_fresh_module", None)
    gc.unfreeze()  # what the test froze goes back to the collector


def test_the_collector_is_paused_for_the_imports_and_what_they_loaded_is_frozen(new_module):
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    with engine_imports():
        assert not gc.isenabled()
        module = importlib.import_module(new_module)
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen + len(module.TABLE)


def test_imports_of_modules_already_loaded_freeze_nothing():
    frozen = gc.get_freeze_count()
    with engine_imports():
        import trainer_backend.supervisor.runner  # noqa: F401  (this process has it)
    assert gc.isenabled() and gc.get_freeze_count() == frozen


def test_a_collector_the_caller_turned_off_stays_off_and_nothing_is_frozen(new_module):
    gc.disable()
    try:
        frozen = gc.get_freeze_count()
        with engine_imports():
            importlib.import_module(new_module)
        assert not gc.isenabled() and gc.get_freeze_count() == frozen
    finally:
        gc.enable()


def test_an_import_that_fails_freezes_nothing_and_turns_the_collector_back_on():
    frozen = gc.get_freeze_count()
    with pytest.raises(ImportError), engine_imports():
        importlib.import_module("parallax_no_such_module")
    assert gc.isenabled() and gc.get_freeze_count() == frozen


def test_the_forkserver_preload_imports():
    """multiprocessing skips a preload module that raises ImportError without a word (the ranks would
    each import the training code again, slower and unfrozen, and nothing would fail): it must import."""
    importlib.import_module(RANK_PRELOAD)
