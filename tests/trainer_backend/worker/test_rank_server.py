"""The server of a run's CPU ranks, forked from the runner that has the engine loaded, and the
server multiprocessing starts afresh where a fork is not safe."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys


from tests.support import ROOT

PROBE = "tests.trainer_backend.worker.rank_server_probe"


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
    assert printed == "buffered before the fork;"  # written by the runner once, not again by each rank


def test_with_another_thread_alive_multiprocessing_starts_its_own_server(tmp_path):
    printed, server, ranks = probe(tmp_path, "--thread")
    assert server["forked"] is None
    assert "multiprocessing.forkserver" in server["server_cmdline"]
    for facts in ranks:
        assert facts["ppid"] == server["server"]
        assert not facts["engine_loaded"]
    assert printed == "buffered before the fork;"
