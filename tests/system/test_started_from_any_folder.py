"""``parallax`` behaves the same from every folder: started in a project folder that holds packages
of its own named ``db``, ``ui``, ``trainer_backend`` and ``reports`` (each raises on import), every
Python process Parallax starts still imports Parallax's own (was: ``python -m`` put that folder
first on the import path, and hash-password and torchrun's ranks died importing the user's).

Real commands in real subprocesses, started in that folder.

    .venv/bin/python -m pytest tests/system/test_started_from_any_folder.py -q
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from contract.config import RunConfig
from contract.python_process import python_command
from ui.torchrun_command import torchrun_command

pytestmark = pytest.mark.processes

DECOYS = ("db", "ui", "trainer_backend", "reports")
PARALLAX = Path(sys.executable).with_name("parallax")  # the installed console script
TIMEOUT_S = 300


@pytest.fixture
def project(tmp_path) -> Path:
    """A user's project folder whose own packages share Parallax's names and fail when imported."""
    folder = tmp_path / "project"
    for name in DECOYS:
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(f"raise ImportError('the project folder\\'s own {name} was imported')\n")
    return folder


def environment(home: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PARALLAX_DB_URL")}
    return {**env, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1", **extra}


def started_in(folder: Path, argv: list[str], env: dict[str, str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, **kwargs)


def test_hash_password_from_a_folder_with_its_own_ui_package(project, parallax_home):
    done = started_in(project, [str(PARALLAX), "hash-password"], environment(parallax_home),
                      input="a long passphrase\na long passphrase\n")
    assert done.returncode == 0 and "own ui was imported" not in done.stderr, done.stderr
    assert 'password_hash = "scrypt$' in done.stdout and "cookie_secret = " in done.stdout, done.stdout


def test_python_parallax_starts_imports_nothing_from_the_folder_it_is_started_in(project, parallax_home):
    """The one way Parallax starts its Python processes (a launched supervisor, the dashboard, hash-password)."""
    probe = "import db, reports, trainer_backend, ui; print(json.dumps([m.__file__ for m in (db, reports, trainer_backend, ui)]))"
    env = environment(parallax_home, PYTHONPATH=str(project.parent / "elsewhere"))
    (project.parent / "elsewhere").mkdir()
    (project.parent / "elsewhere" / "parallax_probe.py").write_text(f"import json\n{probe}\n")
    done = started_in(project, python_command("-m", "parallax_probe"), env)
    assert done.returncode == 0, done.stderr
    assert not any(path.startswith(str(project)) for path in json.loads(done.stdout)), done.stdout


def test_a_launched_run_and_its_ranks_from_such_a_folder(project, parallax_home):
    env = environment(parallax_home)
    flags = ["--dataset", "digits", "--model", "test_resnet", "--image-size", "16", "--epochs", "1",
             "--strategy", "ddp", "--devices", "cpu,cpu"]
    launched = started_in(project, [str(PARALLAX), "launch", *flags], env)
    assert launched.returncode == 0, launched.stderr
    run_id = launched.stdout.split()[0].split("=")[1]
    waited = started_in(project.parent, [sys.executable, "-c", WAIT_FOR_RUN, run_id], env)  # the test's own reader
    assert waited.stdout.strip() == "completed", waited.stdout + waited.stderr + log_of(parallax_home)


WAIT_FOR_RUN = """
import sys, time
from db import run_state as lifecycle, make_engine, store
engine = make_engine(None)
deadline = time.monotonic() + 240
while time.monotonic() < deadline:
    lifecycle.mark_lost_runs(engine)
    run = store.get_run(engine, int(sys.argv[1]))
    if run.status not in lifecycle.ACTIVE_STATUSES:
        break
    time.sleep(0.5)
print(run.status)
"""


def log_of(home: Path) -> str:
    return "".join(path.read_text(errors="replace") for path in home.rglob("run.log"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_dashboards_torchrun_command_from_such_a_folder(project, parallax_home, tmp_path):
    """The command the Launch page gives, pasted in the project folder: torchrun starts each rank
    as ``python -m trainer_backend`` there."""
    command = torchrun_command(RunConfig(dataset="digits", model="test_resnet", image_size=16, epochs=1,
                                         strategy="ddp", devices=("cpu", "cpu")),
                               nodes=1, procs_per_node=2, endpoint=f"127.0.0.1:{free_port()}", job_id="any-folder")
    tools = tmp_path / "bin"  # `torchrun` as pip installs it: this interpreter's torch.distributed.run
    tools.mkdir()
    (tools / "torchrun").write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m torch.distributed.run \"$@\"\n")
    (tools / "torchrun").chmod(0o755)
    env = environment(parallax_home, PATH=f"{tools}{os.pathsep}{os.environ['PATH']}")
    done = started_in(project, ["sh", "-c", command], env, start_new_session=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "status=completed" in done.stdout, done.stdout[-2000:]


@pytest.mark.browser
def test_the_dashboard_served_from_such_a_folder_draws_its_pages(project, parallax_home, tmp_path):
    """``parallax ui`` in the project folder, a page opened in chromium: Parallax's ui and db, not the folder's.
    From a checkout Streamlit puts app.py's folder first, which hides the project's packages even
    without ``-P``; installed from a wheel (app.py in ``parallax_app``) only ``-P`` does."""
    from playwright.sync_api import expect, sync_playwright

    from bench.browser import CHROMIUM, CHROMIUM_ARGS, DashboardServer, free_port, wait_healthy

    port = free_port()
    log = tmp_path / "streamlit.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([str(PARALLAX), "ui", "--port", str(port)], cwd=project,
                                   env=environment(parallax_home), stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    server = DashboardServer(process, f"http://127.0.0.1:{port}", log, 0.0)
    try:
        wait_healthy(server.url, process, log, timeout_s=120)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.goto(f"{server.url}/runs")
                expect(page.get_by_text("No runs yet.")).to_be_visible(timeout=60_000)
                expect(page.get_by_text("was imported")).to_have_count(0)
            finally:
                browser.close()
    finally:
        server.stop(grace_s=15)
    assert "was imported" not in log.read_text(errors="replace")
