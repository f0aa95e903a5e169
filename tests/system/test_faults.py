"""Faults around a run, with real processes on CPU and nothing lost: the dashboard restarted
mid-run, the database locked by another process (briefly, and for longer than a write may wait),
the log's disk full, and a rank hung in a collective.

    .venv/bin/python -m pytest tests/system/test_faults.py -q
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

from streamlit.testing.v1 import AppTest

from tests.support import DDP_ON_CPU, ROOT, SLEEPER, SLEEPER_DDP, SLEEPER_ENV, run_dir
from bench.browser import free_port, make_run_command, wait_healthy
from tests.trainer_backend.control.test_lifecycle import assert_group_gone, export, launch, wait_for

# The runs train tests.plugins.sleeping_model (SLEEPER; the hang test its own hanging model): these
# tests are about faults, not learning.


def ended(run: dict) -> bool:
    return run["status"] not in ("queued", "running")


def epochs_of(run: dict) -> list[int]:
    return [epoch["epoch"] for epoch in run["epochs"]]


def logged_epochs(home, run_id) -> list[int]:
    """The epochs the run printed to its log (it prints one only after recording it)."""
    text = (run_dir(home, run_id) / "run.log").read_text()
    return [int(n) for n in re.findall(r"^epoch (\d+)/\d+ ", text, flags=re.M)]


def hold_write_lock(db_path, seconds: float | None) -> subprocess.Popen:
    """Another process takes the database's write lock (BEGIN EXCLUSIVE) for ``seconds``, or
    until its stdin is closed (None); returns once it holds it."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sqlite3, sys, time\n"
         "connection = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)\n"
         "connection.execute('BEGIN EXCLUSIVE')\n"
         "print('locked', flush=True)\n"
         "time.sleep(float(sys.argv[2])) if sys.argv[2] else sys.stdin.read()\n"
         "connection.execute('COMMIT')\n",
         str(db_path), "" if seconds is None else str(seconds)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    return holder


def start_dashboard(home, port: int) -> subprocess.Popen:
    """A real ``streamlit run app.py`` server, started as ``make run`` starts it, in its own process group
    (as from a terminal)."""
    log = open(home / f"streamlit-{port}.log", "wb")
    return subprocess.Popen(
        make_run_command("127.0.0.1", port),
        cwd=ROOT, env={**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1"},
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )


def test_the_dashboard_killed_and_restarted_mid_run_shows_the_run_with_every_epoch(parallax_home):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    dashboard = start_dashboard(parallax_home, port)
    try:
        wait_healthy(url, dashboard, parallax_home / f"streamlit-{port}.log")
        run_id = launch(parallax_home, *SLEEPER, "--epochs", "30", env_extra=SLEEPER_ENV)
        before = wait_for(parallax_home, run_id, lambda r: len(r["epochs"]) >= 1, what="epoch 1")

        os.killpg(dashboard.pid, signal.SIGKILL)  # the whole server, as a closed terminal would
        dashboard.wait()
        # The run goes on while no dashboard is up (waited for, not assumed: on a busy machine an
        # epoch can take longer than a dashboard's start).
        wait_for(parallax_home, run_id, lambda r: len(r["epochs"]) > len(before["epochs"]),
                 what="an epoch recorded while the dashboard was down")
        dashboard = start_dashboard(parallax_home, port)
        wait_healthy(url, dashboard, parallax_home / f"streamlit-{port}.log")
        during = export(parallax_home, run_id)
        assert during["status"] == "running", "the run must still be training after the restart"
        with urllib.request.urlopen(f"{url}/run?run={run_id}", timeout=10) as response:
            assert response.status == 200

        done = wait_for(parallax_home, run_id, ended, timeout_s=120, what="the end")
    finally:
        os.killpg(dashboard.pid, signal.SIGKILL)
        dashboard.wait()
    assert done["status"] == "completed" and epochs_of(done) == list(range(1, 31))

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=90)
    at.session_state["run_id"] = run_id
    at.switch_page("pages/run.py").run()
    assert not at.exception
    badge = next(m.value for m in at.markdown if "-badge[" in m.value)
    assert badge.rstrip("]").endswith("completed")
    assert [p.text for p in at.get("progress")] == ["Epoch 30 of 30 done", "All steps done"]
    assert len(at.get("plotly_chart")) >= 4  # loss, accuracy, throughput, epoch time


def test_a_briefly_locked_database_delays_epochs_but_loses_none(parallax_home):
    # Each write waits 1 s inside SQLite, then retries with backoff for up to 5 s in all.
    wait = {"PARALLAX_DB_LOCK_WAIT_S": "5", **SLEEPER_ENV}
    run_id = launch(parallax_home, *SLEEPER, "--epochs", "12", env_extra=wait)
    wait_for(parallax_home, run_id, lambda r: len(r["epochs"]) >= 1, what="epoch 1")
    holder = hold_write_lock(parallax_home / "parallax.db", 3.5)
    held_from = len(export(parallax_home, run_id)["epochs"])
    assert held_from < 12, "the run ended before the lock was taken"
    holder.wait()
    assert len(export(parallax_home, run_id)["epochs"]) <= held_from + 1, "nothing can be written while locked"

    done = wait_for(parallax_home, run_id, ended, timeout_s=120, what="the end")
    assert done["status"] == "completed", done["error"]
    assert epochs_of(done) == list(range(1, 13)) == logged_epochs(parallax_home, run_id)


def test_a_lock_held_past_the_wait_fails_the_run_with_the_reason_and_keeps_earlier_epochs(parallax_home):
    wait = {"PARALLAX_DB_LOCK_WAIT_S": "1", **SLEEPER_ENV}
    run_id = launch(parallax_home, *SLEEPER, "--epochs", "200", env_extra=wait)
    wait_for(parallax_home, run_id, lambda r: len(r["epochs"]) >= 1, what="epoch 1")
    holder = hold_write_lock(parallax_home / "parallax.db", None)
    try:
        kept = epochs_of(export(parallax_home, run_id))
        # Held until the run gives up on an epoch, however slow its epochs are on a busy machine:
        # its log says why before the database can take the reason.
        log, deadline = run_dir(parallax_home, run_id) / "run.log", time.monotonic() + 120
        while "could not record epoch" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "could not record epoch" in log.read_text(), log.read_text()[-3000:]
    finally:
        holder.stdin.close()
        try:
            holder.wait(timeout=30)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()

    run = wait_for(parallax_home, run_id, ended, timeout_s=60, what="the end")
    assert run["status"] == "failed"
    failed_epoch = len(run["epochs"]) + 1
    assert run["error"].startswith(f"could not record epoch {failed_epoch}: the database stayed locked"), run["error"]
    assert "PARALLAX_DB_LOCK_WAIT_S" in run["error"]
    assert epochs_of(run)[: len(kept)] == kept and epochs_of(run) == list(range(1, failed_epoch))
    assert epochs_of(run) == logged_epochs(parallax_home, run_id)


def test_a_full_log_disk_keeps_training_and_notes_the_log_is_incomplete(parallax_home):
    # The first run of a fresh home is run 1: its log is made a file every write to which fails
    # with ENOSPC, exactly as on a full disk.
    folder = run_dir(parallax_home, 1)
    folder.mkdir(parents=True)
    (folder / "run.log").symlink_to("/dev/full")
    run_id = launch(parallax_home, *SLEEPER_DDP, "--epochs", "2", env_extra=SLEEPER_ENV)
    assert run_id == 1

    run = wait_for(parallax_home, run_id, ended, timeout_s=120, what="the end")
    assert run["status"] == "completed", run["error"]
    assert epochs_of(run) == [1, 2] and (folder / "best.pt").exists()
    incomplete = [note for note in run["notes"] if "log could not be written" in note]
    assert incomplete == ["The run's log could not be written (No space left on device), so run.log is "
                          "incomplete; training went on and every epoch's metrics are recorded here."]


def test_a_rank_hung_in_a_collective_fails_the_run_naming_the_timeout_and_the_rank(parallax_home):
    timeout = {"PARALLAX_COLLECTIVE_TIMEOUT_S": "5", "PARALLAX_PLUGINS": "tests.plugins.hanging_model"}
    flags = ("--dataset", "digits", "--model", "parallax_hangs_on_rank1", "--image-size", "16", *DDP_ON_CPU)
    run_id = launch(parallax_home, *flags, "--epochs", "3", env_extra=timeout)
    wait_for(parallax_home, run_id, lambda r: len(r["epochs"]) >= 1, what="epoch 1")
    hang_from = time.monotonic()  # rank 1 stops in the first step of epoch 2

    run = wait_for(parallax_home, run_id, ended, timeout_s=60, what="the end")
    assert time.monotonic() - hang_from < 30
    assert run["status"] == "failed"
    headline = run["error"].splitlines()[0]
    assert headline.startswith("collective timeout: rank 1 did not arrive at a collective within 5 s "
                               "(PARALLAX_COLLECTIVE_TIMEOUT_S); rank 0 stopped waiting"), headline
    assert "Timed out waiting 5000ms" in run["error"]  # gloo's own words, in the details
    assert epochs_of(run) == [1]
    assert_group_gone(run["pid"])
