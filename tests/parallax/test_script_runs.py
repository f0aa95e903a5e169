"""Scripts that log through ``import parallax``, run as real processes against a real SQLite file: how
each way of ending is recorded, one run across torchrun's ranks, resuming, a locked database, offline runs."""

from __future__ import annotations

import signal
import socket
import sqlite3
import sys

import time

import pytest

import db
from db import run_state, script_metrics, system_metrics
from tests.parallax import scripts
from tests.parallax.scripts import finish_script, kill_group, run_script, start_script, wait_for_line, write_script

pytestmark = pytest.mark.processes


def only_run(engine):
    runs = db.list_runs(engine)
    assert len(runs) == 1, runs
    return db.get_run(engine, runs[0].id)


def test_a_plain_script_is_a_completed_script_run_with_every_logged_value(engine, tmp_path):
    script = write_script(tmp_path, "train.py", scripts.PLAIN)
    code, out, err = run_script([str(script)], cwd=tmp_path)
    assert code == 0, err
    run = only_run(engine)
    assert (run.status, run.kind, run.strategy, run.model) == ("completed", "script", "script", "plain")
    assert run.config == {"lr": 0.1, "batch_size": 32, "epochs": 3}  # the change made after init too
    assert run.tags == ["smoke"] and run.error is None
    assert run.measurements["summary"]["best"] == 0.75 and run.measurements["summary"]["train/loss"] == 1 / 200
    points = script_metrics.read_points(engine, [run.id], max_points=None)
    by_name = {name: [p for p in points if p["name"] == name] for name in ("train/loss", "lr", "val/acc")}
    assert [len(by_name[name]) for name in by_name] == [200, 200, 4]
    assert [p["step"] for p in by_name["val/acc"]] == [49, 99, 149, 199]
    assert by_name["train/loss"][9]["value"] == pytest.approx(0.1)
    samples = system_metrics.read_samples(engine, [run.id])
    assert samples and all(s["processes"][0]["rank"] == 0 for s in samples)
    assert "not written" not in err


def test_profile_stores_a_window_where_the_profile_views_read_it_and_the_import_loads_no_torch(engine, tmp_path):
    from db import profiles

    script = write_script(tmp_path, "train.py", scripts.PROFILED)
    code, out, err = run_script([str(script)], cwd=tmp_path)
    assert code == 0, err
    assert "torch before init False" in out
    run = only_run(engine)
    assert profiles.profiled_runs(engine, [run.id]) == {run.id}
    steps = profiles.read_steps(engine, [run.id])
    assert [row["step"] for row in steps] == [3, 4] and all(row["forward_ms"] > 0 for row in steps)
    assert profiles.read_ops(engine, run.id) and [t["rank"] for t in profiles.list_traces(engine, run.id)] == [0]


def test_a_forked_child_ended_by_sigterm_does_not_end_the_run(engine, tmp_path):
    script = write_script(tmp_path, "train.py", scripts.WITH_CHILD)
    code, out, err = run_script([str(script)], cwd=tmp_path)
    assert code == 0, err
    assert f"child exit {-signal.SIGTERM}" in out  # it died by the signal, as without Parallax
    run = only_run(engine)
    assert (run.status, run.error) == ("completed", None)
    assert len(script_metrics.read_points(engine, [run.id], max_points=None)) == 2


def test_an_uncaught_exception_fails_the_run_with_its_last_line(engine, tmp_path):
    script = write_script(tmp_path, "train.py", scripts.RAISES)
    code, _, err = run_script([str(script)], cwd=tmp_path)
    assert code == 1 and "ValueError: the loss exploded at step 3" in err  # the script's own traceback stays
    run = only_run(engine)
    assert run.status == "failed"
    headline, _, traceback = run.error.partition("\n")
    assert headline == "ValueError: the loss exploded at step 3"
    assert "in train" in traceback
    assert script_metrics.metric_names(engine, [run.id]) == {run.id: ["train/loss"]}


@pytest.mark.parametrize(("how", "block", "code", "error"), [
    ("sys.exit(3)", "plain", 3, "the script exited with code 3"),
    ("sys.exit(message)", "plain", 1, "the script exited with code 1: no data in /nowhere"),
    ("exit(2)", "plain", 2, "the script exited with code 2"),
    ("raise SystemExit(3)", "with", 3, "the script exited with code 3"),
    ("sys.exit(3)", "with", 3, "the script exited with code 3"),
    ("sys.exit(0)", "plain", 0, None),
    ("sys.exit()", "plain", 0, None),
    ("sys.exit(None)", "plain", 0, None),
    ("sys.exit(0)", "with", 0, None),
    ("sys.exit(4) in a thread", "plain", 0, None),  # ends only that thread, as without Parallax
])
def test_the_scripts_exit_code_decides_how_the_run_ends(engine, tmp_path, how, block, code, error):
    script = write_script(tmp_path, "train.py", scripts.EXITS)
    returncode, _, err = run_script([str(script), how, block], cwd=tmp_path)
    assert returncode == code, err  # the script's own exit status is kept
    run = only_run(engine)
    assert (run.status, run.error) == ("failed" if error else "completed", error)
    assert len(script_metrics.read_points(engine, [run.id], max_points=None)) == 1


def test_a_script_ended_by_os_exit_is_lost_once_its_pid_is_gone(engine, tmp_path):
    # os._exit runs no atexit handler: nothing in the script can record the end, the heartbeat's pid does.
    script = write_script(tmp_path, "train.py", scripts.EXITS)
    returncode, out, err = run_script([str(script), "os._exit(4)", "plain"], cwd=tmp_path)
    assert (returncode, out.split()) == (4, ["ready"]), err
    assert only_run(engine).status == "running"
    assert run_state.mark_lost_runs(engine) == [only_run(engine).id]
    assert only_run(engine).status == "lost"


def test_sigterm_cancels_the_run_and_the_script_still_dies_by_it(engine, tmp_path):
    script = write_script(tmp_path, "train.py", scripts.LOGS_UNTIL_STOPPED)
    process = start_script([str(script)], cwd=tmp_path)
    try:
        wait_for_line(process, "ready")
        process.send_signal(signal.SIGTERM)
        code, _, err = finish_script(process, 60)
    finally:
        kill_group(process)
    assert code == -signal.SIGTERM, err
    run = only_run(engine)
    assert (run.status, run.error) == ("cancelled", "cancelled by SIGTERM")
    assert len(script_metrics.read_points(engine, [run.id], max_points=None)) >= 20  # written before it went


def test_the_dashboards_cancel_stops_a_script_run(engine, tmp_path):
    from trainer_backend.control.lifecycle import cancel

    script = write_script(tmp_path, "train.py", scripts.LOGS_UNTIL_STOPPED)
    process = start_script([str(script)], cwd=tmp_path)
    try:
        wait_for_line(process, "ready")
        run = only_run(engine)
        assert (run.status, run.pid) == ("running", process.pid)
        assert cancel(run.id) == "cancelled"
        code, _, err = finish_script(process, 60)
    finally:
        kill_group(process)
    assert code == -signal.SIGTERM, err
    assert only_run(engine).error == "cancelled by the user"


def test_a_killed_script_is_lost_once_its_pid_is_gone(engine, tmp_path):
    script = write_script(tmp_path, "train.py", scripts.LOGS_UNTIL_STOPPED)
    process = start_script([str(script)], cwd=tmp_path)
    try:
        wait_for_line(process, "ready")
        assert run_state.mark_lost_runs(engine) == []  # alive: not lost
        process.send_signal(signal.SIGKILL)
        process.wait(30)
    finally:
        kill_group(process)
    run = only_run(engine)
    assert run.status == "running"  # nothing in the script could say so
    assert run_state.mark_lost_runs(engine) == [run.id]  # what the dashboard and `parallax list` ask
    run = only_run(engine)
    assert run.status == "lost" and f"process {process.pid}" in run.error


def test_resume_allow_logs_on_into_the_same_run_and_never_refuses_an_existing_id(engine, tmp_path):
    script = write_script(tmp_path, "train.py", scripts.STEADY)
    code, out, err = run_script([str(script), "exp-1", "30"], cwd=tmp_path)
    assert code == 0, err
    code, out, err = run_script([str(script), "exp-1", "20"], cwd=tmp_path)
    assert code == 0, err
    run = only_run(engine)
    assert run.status == "completed"
    steps = [p["step"] for p in script_metrics.read_points(engine, [run.id], names=["lr"], max_points=None)]
    assert steps == list(range(50))  # the second run counted on from the first's last step
    refuse = write_script(tmp_path, "again.py", """
        import parallax
        parallax.init(project="tests", id="exp-1")
    """)
    code, _, err = run_script([str(refuse)], cwd=tmp_path)
    assert code == 1 and "a run with id 'exp-1' exists" in err and "resume='allow'" in err
    assert len(db.list_runs(engine)) == 1


def test_a_database_locked_for_five_seconds_loses_nothing(engine, db_url, tmp_path):
    script = write_script(tmp_path, "train.py", scripts.STEADY)
    # SQLite's own wait for the lock cut to 0.4 s (a fifth of PARALLAX_DB_LOCK_WAIT_S): the writes fail while the
    # lock is held, and the writer must keep their values and write them once it is released.
    process = start_script([str(script), "locked", "400"], cwd=tmp_path, env_extra={"PARALLAX_DB_LOCK_WAIT_S": "2"})
    try:
        wait_for_line(process, "ready")
        time.sleep(1.0)
        locker = sqlite3.connect(db_url.removeprefix("sqlite:///"), timeout=30, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
        held_at = time.monotonic()
        time.sleep(5.0)
        locker.execute("COMMIT")
        locker.close()
        assert time.monotonic() - held_at >= 5.0
        code, out, err = finish_script(process, 120)
    finally:
        kill_group(process)
    assert code == 0 and "done" in out, err
    assert "not written" not in err
    run = only_run(engine)
    assert run.status == "completed"
    points = script_metrics.read_points(engine, [run.id], max_points=None)
    assert len(points) == 800 and sorted({p["step"] for p in points}) == list(range(400))


def test_an_offline_run_is_synced_once(engine, tmp_path):
    from trainer_backend.control.command import main

    script = write_script(tmp_path, "train.py", scripts.OFFLINE)
    code, out, err = run_script([str(script)], cwd=tmp_path, env_extra={"PARALLAX_HOME": str(tmp_path / "nowhere")})
    assert code == 0, err
    path = out.split("file ", 1)[1].strip()
    assert path.startswith(str(tmp_path)) and path.endswith(".jsonl")  # beside the script
    assert db.list_runs(engine) == []
    assert main(["sync", path]) == 0
    run = only_run(engine)
    assert (run.status, run.config, run.name if hasattr(run, "name") else run.model) == ("completed", {"lr": 0.3}, "offline")
    values = [p["value"] for p in script_metrics.read_points(engine, [run.id], max_points=None)]
    assert values == pytest.approx([3.0 - step * 0.1 for step in range(30)])
    assert main(["sync", path]) == 1  # a second sync is refused
    assert len(db.list_runs(engine)) == 1


def test_two_torchrun_ranks_share_one_run_with_both_ranks_samples(engine, tmp_path):
    script = write_script(tmp_path, "ddp.py", scripts.DDP)
    with socket.socket() as probe:  # a free port: torchrun's default (29500) may be another test's
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, out, err = run_script([
        "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port), str(script)],
        cwd=tmp_path, env_extra={"OMP_NUM_THREADS": "1"}, timeout_s=240)
    assert code == 0, err[-3000:]
    run = only_run(engine)
    assert (run.status, run.world_size, run.strategy) == ("completed", 2, "ddp")
    assert out.count(f"run_id {run.id}") == 2  # both ranks joined it
    logged = script_metrics.read_points(engine, [run.id], names=["rank_logged"], max_points=None)
    assert len(logged) == 30 and {p["value"] for p in logged} == {0.0}  # rank 0's log calls only
    ranks = {process["rank"] for sample in system_metrics.read_samples(engine, [run.id])
             for process in sample["processes"]}
    assert ranks == {0, 1}


if sys.platform != "linux":  # pragma: no cover
    pytestmark = [pytestmark, pytest.mark.skip(reason="signals and /proc as on Linux")]


def test_a_script_logging_while_the_database_is_locked_waits_for_room_and_stores_every_value(engine, db_url, tmp_path):
    """300,000 calls in a tight loop while another process holds the database: the queue fills, log waits for
    room (back-pressure) rather than refusing values, every value is stored, and the run says how long logging
    waited."""
    script = write_script(tmp_path, "tight.py", """
        import time
        import parallax
        run = parallax.init(project="p", name="tight")
        print("ready", flush=True)
        time.sleep(1.0)
        for step in range(300_000):
            parallax.log({"loss": 1.0 + (step == 123_456) * 99.0}, step=step)
        parallax.finish()
    """)
    process = start_script([str(script)], cwd=tmp_path, env_extra={"PARALLAX_DB_LOCK_WAIT_S": "20"})
    try:
        wait_for_line(process, "ready")
        locker = sqlite3.connect(db_url.removeprefix("sqlite:///"), timeout=30, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
        time.sleep(4.0)
        locker.execute("COMMIT")
        locker.close()
        code, out, err = finish_script(process, 120)
    finally:
        kill_group(process)
    assert code == 0, err
    assert "not written" not in err
    run = only_run(engine)
    assert script_metrics.points_logged(engine, run.id) == 300_000
    every = script_metrics.read_points(engine, [run.id], max_points=None)
    assert [p["step"] for p in every] == list(range(300_000))
    wait = run.measurements[script_metrics.LOG_WAIT_KEY]
    assert wait["waits"] >= 1 and 0.5 < wait["waited_s"] < 20
    assert max(b["max"] for b in script_metrics.read_points(engine, [run.id], max_points=500)) == 100.0
