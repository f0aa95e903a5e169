"""``tests/support.py``'s CLI process (``run_cli``): forked from the engine's server, it answers as a new
``python -m trainer_backend`` does, and a timeout ends it as ``subprocess.run``'s ends its process."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.support import run_cli

COMMANDS = {
    "a cancel of a run that is not there": ("cancel", "7"),
    "a bad flag": ("run", "--epochs", "zero"),
    "an unknown command": ("train",),
    "a run that is not there": ("export", "7"),
    "a bad database": ("--db", "nosuch://x", "list"),
    "the help": ("export", "--help"),
}


@pytest.mark.parametrize("args", COMMANDS.values(), ids=COMMANDS.keys())
def test_a_forked_cli_prints_and_exits_as_a_new_interpreter(args, tmp_path):
    forked = run_cli(*args, home=tmp_path / "forked", timeout=60)
    fresh = run_cli(*args, home=tmp_path / "fresh", timeout=60, fresh=True)
    assert (forked.returncode, forked.stdout, forked.stderr.replace("forked", "fresh")) == (
        fresh.returncode, fresh.stdout, fresh.stderr)
    assert fresh.stdout or fresh.stderr  # each command says something to compare


def test_a_forked_cli_past_its_timeout_is_ended_as_subprocess_run_ends_one(tmp_path):
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_cli("run", "--dataset", "digits", "--model", "test_resnet", "--image-size", "16", "--epochs", "500",
                home=tmp_path, timeout=3)
    assert time.monotonic() - started < 30
