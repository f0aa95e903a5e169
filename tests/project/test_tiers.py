"""The test tiers (tests/conftest.py): a test is marked `processes` by what it uses, and in the fast tier a test
that starts a process without the mark fails, naming it. Checked on a small suite of its own, run by pytest in
a subprocess with this suite's conftest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from tests.support import ROOT

SUITE = '''
import subprocess
import sys


def start_python():
    return subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_arithmetic():
    assert 1 + 1 == 2


def test_through_a_helper():
    start_python()


def test_hidden_from_the_classifier():
    module = __import__("sub" + "process")  # names nothing the classifier looks for
    module.run([sys.executable, "-c", "pass"], check=True)
'''


def run_suite(tmp_path, *args: str, fast: bool) -> subprocess.CompletedProcess:
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_small.py").write_text(SUITE)
    # The copied conftest imports tests.support and tests.pg_server from this checkout.
    env = {**os.environ, "PARALLAX_TEST_TIER": "fast" if fast else "",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-c", os.devnull,
                           "--rootdir", str(tmp_path), *args, str(tmp_path / "test_small.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_test_that_starts_a_process_through_a_helper_is_marked_processes(tmp_path):
    listed = run_suite(tmp_path, "--co", "-m", "not processes", fast=False)
    assert "test_arithmetic" in listed.stdout and "test_hidden_from_the_classifier" in listed.stdout
    assert "test_through_a_helper" not in listed.stdout, listed.stdout


def test_the_fast_tier_fails_a_process_it_was_not_told_of(tmp_path):
    done = run_suite(tmp_path, "-m", "not processes", "-rf", fast=True)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 passed" in done.stdout
    assert "test_hidden_from_the_classifier starts a process: mark it `processes`" in done.stdout
    unguarded = run_suite(tmp_path, "-m", "not processes", fast=False)
    assert unguarded.returncode == 0 and "2 passed" in unguarded.stdout, unguarded.stdout
