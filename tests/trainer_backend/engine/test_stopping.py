"""SIGTERM in a job Slurm started (a preemption, ``scontrol requeue``) asks for a stop at the next step the ranks
agree on, as Slurm's warning does (engine/stopping.py); where no stop is taken in time, the process ends as
SIGTERM ended it before. Real signals to this process, a world of one (its all-reduce is the identity).

    .venv/bin/python -m pytest tests/trainer_backend/engine/test_stopping.py -q
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trainer_backend.engine import stopping
from trainer_backend.engine.stopping import STOP_CHECK_STEPS, STOP_FILE, StopRequest, stop_on_sigterm


class WorldOfOne:
    output_device = torch.device("cpu")
    is_main = True

    def __init__(self):
        self.reductions = 0

    def all_reduce(self, tensor, op="sum"):
        self.reductions += 1
        return tensor


def steps_until_stop(stop: StopRequest, total_steps: int = 100) -> int | None:
    return next((step for step in range(1, total_steps + 1) if stop(step, total_steps)), None)


def test_sigterm_stops_at_the_next_check_and_nothing_ends_the_process(tmp_path, signals):
    escalated = []
    stop_on_sigterm(lambda signum, frame: escalated.append(signum), grace_s=0.5)
    strategy = WorldOfOne()
    stop = StopRequest(tmp_path, strategy)
    assert not any(stop(step, 100) for step in range(1, STOP_CHECK_STEPS + 1))  # no signal, no stop

    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)  # torchrun passes Slurm's signal on: the second changes nothing
    assert stopping.stop_taken() is None
    assert steps_until_stop(stop) == STOP_CHECK_STEPS  # the next look, after 10 more optimizer steps
    assert strategy.reductions == 2  # one all-reduce a look, none between
    assert stopping.stop_taken() == "SIGTERM"  # the note names it
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0  # taken: no escalation while the point is saved
    os.kill(os.getpid(), signal.SIGTERM)  # torchrun's, or scontrol requeue's after the point: arms nothing
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0
    time.sleep(0.7)
    assert escalated == []
    assert not (tmp_path / STOP_FILE).exists()


def test_a_sigterm_no_step_takes_ends_the_process_as_before_after_the_grace(tmp_path, signals):
    escalated = []
    stop_on_sigterm(lambda signum, frame: escalated.append(signum), grace_s=0.2)
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 5
    while not escalated and time.monotonic() < deadline:  # a rank stuck in a collective: no step comes
        time.sleep(0.01)
    assert escalated == [signal.SIGTERM]


def test_without_a_signal_only_the_stop_file_stops(tmp_path, signals):
    stop = StopRequest(tmp_path, WorldOfOne())
    assert steps_until_stop(stop, 30) is None
    (tmp_path / STOP_FILE).touch()
    assert steps_until_stop(stop, 30) == STOP_CHECK_STEPS
    assert not (tmp_path / STOP_FILE).exists()  # taken by the main process
    assert stopping.stop_taken() == "stop file"


@pytest.mark.processes
def test_a_rank_other_than_0_past_the_grace_is_ended_by_sigalrms_default_action():
    """Ranks other than 0 escalate by SIGALRM's default action, the kernel's, not a Python handler (which a rank
    blocked in a collective's C++ wait would not run until the wait ends): the process ends by SIGALRM."""
    code = ("import os, signal, ctypes; from trainer_backend.engine.stopping import stop_on_sigterm; "
            "stop_on_sigterm(None, grace_s=0.3); os.kill(os.getpid(), signal.SIGTERM); "
            "ctypes.CDLL(None).pause()")  # waiting in C
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[3], timeout=60,
                          capture_output=True)
    assert done.returncode == -signal.SIGALRM, done
