"""SIGTERM in a job Slurm started (a preemption, ``scontrol requeue``) asks for a stop at the next step the ranks
agree on, as Slurm's warning does (rank/stopping.py); where no stop is taken in time, the process ends as
SIGTERM ended it before, even one blocked in a collective. Real signals; a world of one in this process, and
worlds of two gloo ranks (tests/support.py's run_world), with steps whose seconds a fake clock counts.

    .venv/bin/python -m pytest tests/trainer_backend/rank/test_stopping.py -q
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from tests.support import leave_with_results, run_world
from trainer_backend.rank import stopping
from trainer_backend.rank.stopping import STOP_FILE, TERM_GRACE_S, StopRequest, stop_on_sigterm

WORLD_OF_ONE = SimpleNamespace(output_device=torch.device("cpu"), is_main=True)
STEP_S = 3.0  # each fake step's seconds: longer than a look's 2 s


class Steps:
    """A clock for the stop request that runs ``step_s`` seconds a step."""

    def __init__(self, step_s: float = STEP_S):
        self.step_s, self.now = step_s, 0.0

    def __call__(self) -> float:
        return self.now

    def run(self, stop: StopRequest, steps: range, total_steps: int = 1000, before=None) -> int | None:
        """Steps until ``stop`` says stop (that step), or None; ``before(step)`` runs ahead of each."""
        for step in steps:
            if before is not None:
                before(step)
            self.now += self.step_s
            if stop(step, total_steps):
                return step
        return None


def test_sigterm_stops_within_two_looks_and_nothing_ends_the_process(tmp_path, signals):
    escalated = []
    stop_on_sigterm(lambda signum, frame: escalated.append(signum), grace_s=0.5)
    steps = Steps()
    stop = StopRequest(tmp_path, WORLD_OF_ONE, every_s=2.0, clock=steps)
    assert steps.run(stop, range(1, 11)) is None  # no signal, no stop

    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)  # torchrun passes Slurm's signal on: the second changes nothing
    assert stopping.stop_taken() is None
    # With 3 s steps every step is a look: the next look asks, the one after reads the agreed answer.
    assert steps.run(stop, range(11, 100)) == 12
    assert stopping.stop_taken() == "SIGTERM"  # the note names it
    os.kill(os.getpid(), signal.SIGTERM)  # torchrun's, or scontrol requeue's after the point: arms nothing
    time.sleep(1.0)
    assert escalated == []
    assert not (tmp_path / STOP_FILE).exists()


def test_looks_come_every_few_seconds_whatever_the_steps_take(tmp_path, signals):
    """A look about every 2 s: with 0.1 s steps one in 20 steps, a stop file seen at the first look after it and
    taken at the next; the epoch's last step never stops (the epoch simply ends)."""
    steps = Steps(0.1)
    stop = StopRequest(tmp_path, WORLD_OF_ONE, every_s=2.0, clock=steps)
    looks = []
    original = stopping._start_max
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stopping, "_start_max", lambda values, device: (looks.append((stop._calls, values[0])),
                                                                      original(values, device))[1])
        assert steps.run(stop, range(1, 101)) is None
        (tmp_path / STOP_FILE).touch()
        stopped = steps.run(stop, range(101, 200))
    # The first three steps look at once, to learn the pace (0.1 s a step, the slowest rank's); then one in 20.
    assert [step for step, _ in looks] == [1, 2, 3, 23, 43, 63, 83, 103]
    assert looks[-1][1] == stopping.ASKED_BY_FILE and stopped == 123
    assert stopping.stop_taken() == "stop file" and not (tmp_path / STOP_FILE).exists()  # taken by the main rank
    stop = StopRequest(tmp_path, WORLD_OF_ONE, every_s=2.0, clock=Steps())
    (tmp_path / STOP_FILE).touch()
    assert not any(stop(step, 2) for step in (1, 2))  # step 2 is the epoch's last


def test_a_sigterm_no_step_takes_ends_the_process_as_before_after_the_grace(tmp_path, signals):
    escalated = []
    stop_on_sigterm(lambda signum, frame: escalated.append(signum), grace_s=0.2)
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 5
    while not escalated and time.monotonic() < deadline:  # training that reaches no step, in Python
        time.sleep(0.01)
    assert escalated == [signal.SIGTERM]


# --- two gloo ranks ---

WORLD_TIMEOUT_S = 120


def _join(rank: int, port: int) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)


def _stop_world(rank: int, port: int, folder: str, out_path: str) -> None:
    """Fake 3 s steps; rank 1 alone is sent SIGTERM before step 7. Each rank: the step it stopped at, the
    collectives it waited for in the look that started them, and the step at which it stopped."""
    _join(rank, port)
    stop_on_sigterm(None)
    started_here, waited_here = [], []
    all_reduce = dist.all_reduce

    def counted(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        work = all_reduce(tensor, op=op, group=group, async_op=async_op)
        if not async_op:
            waited_here.append("blocking all_reduce")
            return work
        started_here.append(work)
        return SimpleNamespace(wait=lambda: (waited_here.append("own") if work in started_here else None,
                                             work.wait())[1])

    dist.all_reduce = counted
    steps = Steps()
    stop = StopRequest(Path(folder), SimpleNamespace(output_device=torch.device("cpu"), is_main=rank == 0),
                       every_s=2.0, clock=steps)

    def before(step: int) -> None:
        started_here.clear()  # works started at the looks before this step's are a look old
        if rank == 1 and step == 7:
            os.kill(os.getpid(), signal.SIGTERM)

    results = {"stopped": steps.run(stop, range(1, 100), before=before), "waited_in_own_look": waited_here}
    gathered = [None, None]
    dist.all_gather_object(gathered, results)
    leave_with_results(rank, {"ranks": gathered}, out_path)


@pytest.mark.processes
def test_a_sigterm_to_one_rank_stops_every_rank_at_one_step_within_the_grace_waiting_on_no_look(tmp_path):
    """Steps of 3 s (a fake clock), so that a look every 10 steps would outlast the 20 s grace: SIGTERM to rank 1
    before step 7 stops both ranks at the same step, less than the grace after it; and no look waits for the
    all-reduce it started (the step's path reads nothing but the answer of the look before)."""
    out = tmp_path / "rank0.json"
    run_world(_stop_world, 2, str(tmp_path), str(out), timeout_s=WORLD_TIMEOUT_S)
    ranks = json.loads(out.read_text())["ranks"]
    (stopped,) = {r["stopped"] for r in ranks}
    assert stopped is not None and 7 <= stopped and (stopped - 6) * STEP_S < TERM_GRACE_S, ranks
    assert all(r["waited_in_own_look"] == [] for r in ranks), ranks


def _blocked_world(rank: int, port: int, blocked_rank: int, db_url: str, run_id: int, out_path: str) -> None:
    """Rank ``blocked_rank`` waits in an all-reduce its peer never enters; the test sends it SIGTERM there. Rank
    0 records, as a torchrun job's rank 0 does, how the attempt ended. The peer waits for the test's word."""
    from db import make_engine
    from trainer_backend.supervisor import torchrun as torchrun_supervisor
    from trainer_backend.supervisor.liveness import raise_cancelled
    from contract.world import TorchrunWorld

    _join(rank, port)
    if rank == 0:
        world = TorchrunWorld(rank=0, world_size=2, local_rank=0, local_world_size=2, node_rank=0, job_id="job",
                              restart_count=0, max_restarts=0)
        engine, started = make_engine(db_url), time.time()
        stop_on_sigterm(raise_cancelled, grace_s=1.0)
        stopping.when_blocked(lambda grace_s: torchrun_supervisor.record_sigterm(
            engine, run_id, world, f"run-{run_id}", started, blocked_after_s=grace_s))
    else:
        stop_on_sigterm(None, grace_s=1.0)
    Path(out_path, f"rank{rank}.pid").write_text(str(os.getpid()))
    if rank == blocked_rank:
        dist.all_reduce(torch.ones(1))  # never returns: its peer does not come
    else:
        while not Path(out_path, "leave").exists():
            time.sleep(0.05)
    os._exit(0)


def _ended(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def _signal_blocked_rank(tmp_path, blocked_rank: int, engine, run_id: int, db_url: str) -> float:
    """Start the world, SIGTERM the blocked rank once it waits in the all-reduce; the seconds until it ended."""
    failures = []

    def world() -> None:
        try:
            run_world(_blocked_world, 2, blocked_rank, db_url, run_id, str(tmp_path), timeout_s=WORLD_TIMEOUT_S)
        except Exception as exc:  # the ended rank's exit status is its world's failure
            failures.append(exc)

    thread = threading.Thread(target=world)
    thread.start()
    try:
        pid_file = tmp_path / f"rank{blocked_rank}.pid"
        deadline = time.monotonic() + WORLD_TIMEOUT_S
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        pid = int(pid_file.read_text())
        time.sleep(1.0)  # inside the all-reduce by now
        signalled = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        while not _ended(pid) and time.monotonic() < signalled + 30:
            time.sleep(0.05)
        return time.monotonic() - signalled
    finally:
        (tmp_path / "leave").touch()
        thread.join(WORLD_TIMEOUT_S)


@pytest.mark.processes
def test_rank_0_blocked_in_a_collective_ends_within_the_grace_and_records_why(tmp_path, engine, db_url, parallax_home):
    from contract.config import RunConfig
    from db import store

    run_id = store.create_run(engine, RunConfig(strategy="ddp", devices=("cpu", "cpu")).to_dict(), status="running")
    took_s = _signal_blocked_rank(tmp_path, 0, engine, run_id, db_url)
    assert took_s <= 1.0 + 2.0, took_s
    run = store.get_run(engine, run_id)
    assert run.status == "failed" and "Rank 0 was blocked in a collective (waiting on a peer) and reached no step " \
        "within the 1 s grace after the signal" in run.error, run.error


@pytest.mark.processes
def test_another_rank_blocked_in_a_collective_ends_by_sigalrm_within_the_grace(tmp_path, engine, db_url,
                                                                               parallax_home):
    from contract.config import RunConfig
    from db import store

    run_id = store.create_run(engine, RunConfig(strategy="ddp", devices=("cpu", "cpu")).to_dict(), status="running")
    took_s = _signal_blocked_rank(tmp_path, 1, engine, run_id, db_url)
    assert took_s <= 1.0 + 2.0, took_s
