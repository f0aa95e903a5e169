"""A run that hangs (supervisor/stall.py): marked stalled with every rank's stack in its log, told to its webhooks,
then waiting for a cancel or cancelled by itself; a real DDP run on two gloo ranks whose rank 1 never comes
back from epoch 2's first step (tests/plugins/hanging_model.py), with the stall bound cut to seconds.

    .venv/bin/python -m pytest tests/trainer_backend/supervisor/test_stall.py -q
"""

from __future__ import annotations

import faulthandler
import json
import threading
import time

import pytest

from tests.db.test_notify import Receiver
from tests.support import DDP_ON_CPU, run_cli, run_dir
from tests.trainer_backend.control.test_lifecycle import assert_group_gone, launch, wait_for
from trainer_backend.supervisor.stall import StallWatch, where

HANG = ("--dataset", "digits", "--model", "parallax_hangs_on_rank1", "--image-size", "16", *DDP_ON_CPU,
        "--epochs", "3", "--bn-stats-images", "0")
QUICK_STALL = {"PARALLAX_PLUGINS": "tests.plugins.hanging_model", "PARALLAX_STALL_AFTER_S": "3"}


def waits_in_a_queue(done: threading.Event) -> None:
    done.wait(30)


def test_where_names_the_innermost_frame_of_the_thread_it_reads(tmp_path):
    done = threading.Event()
    thread = threading.Thread(target=waits_in_a_queue, args=(done,))
    thread.start()
    try:
        time.sleep(0.2)
        with open(tmp_path / "stacks", "w") as handle:
            faulthandler.dump_traceback(handle, all_threads=True)
    finally:
        done.set()
        thread.join()
    text = (tmp_path / "stacks").read_text()
    waiting = next(block for block in text.split("\n\n") if "waits_in_a_queue" in block)
    assert where(waiting).startswith("in wait (threading.py:")
    assert where("") == "no stack was written"


def test_the_bound_is_the_floor_or_twenty_median_steps():
    watch = StallWatch(None, 1, None, after_s=300)
    assert watch.bound_s() == 300
    watch._step_s = [20.0, 25.0, 30.0]
    assert watch.bound_s() == 500


@pytest.mark.processes
def test_a_hung_rank_is_marked_stalled_with_both_ranks_stacks_then_cancelled_by_the_user(parallax_home):
    receiver = Receiver()
    try:
        run_id = launch(parallax_home, *HANG, env_extra={**QUICK_STALL, "PARALLAX_WEBHOOKS": receiver.url})
        run = wait_for(parallax_home, run_id, lambda r: (r["measurements"] or {}).get("stalled"), timeout_s=120,
                       what="marked stalled")
        assert run["status"] == "running"  # --on-stall wait: it waits for the user
        where_ranks = run["measurements"]["stalled"]["where"]
        assert where_ranks["1"].startswith("in forward (hanging_model.py:"), where_ranks
        # Rank 0 waits for rank 1 inside a training step: the strategy's (strategies/base.py's train_step).
        assert "from train_step (base.py:" in where_ranks["0"], where_ranks
        assert any(note.startswith("The run stalled: no step for") for note in run["notes"])
        log = (run_dir(parallax_home, run_id) / "run.log").read_text()
        assert "the stack of rank 0 (pid" in log and "the stack of rank 1 (pid" in log
        assert 'hanging_model.py", line' in log  # rank 1's own frames, as faulthandler wrote them
        assert [p["body"]["event"] for p in receiver.wait_for(1)] == ["run.stalled"]
        assert run_cli("cancel", str(run_id), home=parallax_home, timeout=60).returncode == 0
        run = wait_for(parallax_home, run_id, lambda r: r["status"] != "running", timeout_s=60, what="the end")
        assert run["status"] == "cancelled" and [e["epoch"] for e in run["epochs"]] == [1]
        assert_group_gone(run["pid"])
    finally:
        receiver.close()


@pytest.mark.processes
def test_on_stall_cancel_ends_a_hung_run_saying_it_stalled(parallax_home):
    result = run_cli("run", *HANG, "--on-stall", "cancel", home=parallax_home, env_extra=QUICK_STALL, timeout=180)
    assert result.stdout.strip().endswith("status=cancelled"), result.stdout + result.stderr
    run_id = result.stdout.strip().splitlines()[-1].split()[0].split("=")[1]
    exported = run_cli("export", run_id, home=parallax_home)
    run = json.loads(exported.stdout)
    assert run["error"].startswith("stalled: no step for"), run["error"]
    assert run["error"].endswith("cancelled (--on-stall cancel)")
    assert "rank 1 in forward (hanging_model.py:" in run["error"]
