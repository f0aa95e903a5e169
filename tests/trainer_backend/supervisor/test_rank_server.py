"""The server of a run's CPU ranks, forked from the runner that has the training code loaded, and the
server multiprocessing starts afresh where a fork is not safe."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.support import ROOT

PROBE = "tests.trainer_backend.supervisor.rank_server_probe"


def probe(out, *flags: str) -> tuple[str, dict, list[dict]]:
    """Run the probe (its process group ended whatever happens): what it printed before its last
    line, that line's facts of the server, and each rank's facts."""
    process = subprocess.Popen([sys.executable, "-m", PROBE, str(out), *flags], cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=120)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert process.returncode == 0, stderr
    printed, _, last = stdout.rstrip("\n").rpartition("\n")
    ranks = [json.loads((out / f"rank{index}.json").read_text()) for index in range(2)]
    return printed, json.loads(last), ranks


def test_ranks_fork_from_a_fork_of_the_runner_with_its_engine_and_fresh_signal_handlers(tmp_path):
    printed, server, ranks = probe(tmp_path)
    assert server["forked"] == server["server"]
    assert server["server_cmdline"] == server["own_cmdline"]  # a fork of the runner, not a new interpreter
    for facts in ranks:
        assert facts["ppid"] == server["server"]
        assert facts["engine_loaded"]  # inherited: the rank imported nothing
        assert facts["sigpipe_ignored"] and facts["sigusr1_default"]  # as a new interpreter has them
        assert facts["database_files_open"] == []  # the runner's pooled connection was closed before the fork
    assert printed == "buffered before the fork;"  # written by the runner once, not again by each rank


@pytest.mark.parametrize("flag", ["--thread", "--operator"])
def test_after_a_thread_or_an_operator_multiprocessing_starts_its_own_server(tmp_path, flag):
    """With another Python thread alive, or torch's OpenMP pool up (a rank forked after it would
    hang in its first operator), nothing is forked from the runner: the ranks come from a new server."""
    printed, server, ranks = probe(tmp_path, flag)
    assert server["forked"] is None
    assert "multiprocessing.forkserver" in server["server_cmdline"]
    for facts in ranks:
        assert facts["ppid"] == server["server"]
        assert not facts["engine_loaded"]
    assert printed == "buffered before the fork;"


def test_a_start_that_fails_leaves_the_ranks_to_multiprocessing(monkeypatch):
    """A fork refused (no memory, too many processes) is a saving lost, not a run failed."""
    from multiprocessing import forkserver, resource_tracker

    from trainer_backend.supervisor import rank_server

    def refused():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(rank_server, "can_fork_server", lambda: True)
    monkeypatch.setattr(rank_server.os, "fork", refused)
    monkeypatch.setattr(forkserver._forkserver, "_forkserver_pid", None)  # none started in this process yet
    monkeypatch.setattr(forkserver._forkserver, "_forkserver_address", None)
    resource_tracker.ensure_running()  # its pipe stays open by design: counted before
    open_fds = sorted(os.listdir("/proc/self/fd"))
    assert rank_server.start_rank_server() is None
    assert forkserver._forkserver._forkserver_pid is None and forkserver._forkserver._forkserver_address is None
    assert sorted(os.listdir("/proc/self/fd")) == open_fds  # the listener and both ends of the pipe closed
