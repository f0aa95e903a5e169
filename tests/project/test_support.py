"""``tests/support.py``'s processes (``run_python``, ``run_cli``): forked from the rank server, they answer
as a new interpreter does, take a new interpreter where the test's environment differs from the server's in
what libraries read as they load, and a timeout ends them as ``subprocess.run``'s ends its process."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from tests.support import SLEEPER_ENV, run_cli, run_python

COMMANDS = {
    "a cancel of a run that is not there": ("cancel", "7"),
    "a bad flag": ("run", "--epochs", "zero"),
    "an unknown command": ("train",),
    "a run that is not there": ("export", "7"),
    "a bad database": ("--db", "nosuch://x", "list"),
    "the help": ("export", "--help"),
}


@pytest.mark.parametrize("args", COMMANDS.values(), ids=COMMANDS.keys())
def test_the_cli_forked_prints_and_exits_as_a_new_interpreter(args, tmp_path):
    forked = run_cli(*args, home=tmp_path / "a", timeout=60)
    fresh = run_cli(*args, home=tmp_path / "b", timeout=60, fresh=True)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert fresh.stdout or fresh.stderr  # each command says something to compare


def test_a_run_through_the_forked_cli_trains_as_through_a_new_interpreter(tmp_path):
    tiny = ("run", "--dataset", "digits", "--model", "parallax_sleeps_each_step", "--image-size", "16", "--epochs", "1",
            "--strategy", "ddp", "--devices", "cpu,cpu", "--num-workers", "1")
    forked = run_cli(*tiny, home=tmp_path / "a", timeout=300, env_extra=SLEEPER_ENV)
    fresh = run_cli(*tiny, home=tmp_path / "b", timeout=300, env_extra=SLEEPER_ENV, fresh=True)
    for done in (forked, fresh):
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == "run_id=1 status=completed"
    assert forked.stderr == fresh.stderr
    assert forked.stdout.splitlines()[:3] == fresh.stdout.splitlines()[:3]  # what the run says before it trains


PROBE = """
import json, multiprocessing, sys
engine_loaded = "torch" in sys.modules
from trainer_backend.supervisor import rank_server
print(json.dumps({"engine_loaded": engine_loaded, "start_method": multiprocessing.get_start_method(allow_none=True),
                  "parent": multiprocessing.parent_process() is not None, "name": multiprocessing.current_process().name,
                  "may_fork_rank_server": rank_server.can_fork_server(), "argv": sys.argv, "path0": sys.path[0],
                  "stdin": sys.stdin.fileno(), "stdout_is_original": sys.stdout is sys.__stdout__}))
"""


def probe(env: dict[str, str], *, fresh: bool = False) -> dict:
    done = run_python(["-c", PROBE, "an argument"], env=env, timeout=120, fresh=fresh)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_forked_process_is_a_new_interpreter_to_multiprocessing_and_the_rank_server():
    forked, fresh = probe(dict(os.environ)), probe(dict(os.environ), fresh=True)
    assert forked.pop("engine_loaded") and not fresh.pop("engine_loaded")
    assert forked == fresh
    assert fresh["start_method"] is None and fresh["may_fork_rank_server"] and fresh["argv"] == ["-c", "an argument"]


@pytest.mark.parametrize(("variable", "forks"), [("PARALLAX_SAMPLE_S", True), ("HF_HUB_OFFLINE", False),
                                                 ("CUDA_VISIBLE_DEVICES", False), ("OMP_NUM_THREADS", False)])
def test_a_variable_that_libraries_read_as_they_load_gets_a_new_interpreter(variable, forks):
    assert probe({**os.environ, variable: "3"})["engine_loaded"] is forks


def test_a_forked_process_past_its_timeout_is_ended_as_subprocess_run_ends_one(tmp_path):
    run_cli("cancel", "1", home=tmp_path, timeout=60)  # the server is up: what is timed is the run alone
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_cli("run", "--dataset", "digits", "--model", "parallax_sleeps_each_step", "--image-size", "16", "--epochs",
                "500", home=tmp_path, timeout=3, env_extra=SLEEPER_ENV)
    assert time.monotonic() - started < 15
