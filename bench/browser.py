"""The dashboard in a real server, and a real browser to drive it: one way to start ``streamlit run
app.py`` and wait for it, shared by the benchmarks, the soak and the end-to-end test.

    with running_dashboard(env, log=home / "streamlit.log") as server:
        page.goto(server.url)                        # server.process, server.start_s

The server runs in a process group of its own on a free port, is stopped with its whole group,
and a server that exits or does not answer its health check in time raises with its log's tail.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator

from bench.common import ROOT, child_env

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-dev-shm-usage"]
LOG_TAIL_CHARS = 3000
# The Run page's per-epoch charts, by the keys pages/run.py gives them (Streamlit marks a keyed
# element's container with the class st-key-<key>); the step, system and per-class charts come and
# go with what a run recorded, these five are on every run's page once an epoch has ended.
EPOCH_CHART_KEYS = ("loss", "accuracy", "throughput", "epoch_time", "memory")
EPOCH_CHARTS = ", ".join(f".st-key-{key} .stPlotlyChart" for key in EPOCH_CHART_KEYS)


# A click's rerun reaches a busy server late: a page is idle once Streamlit's script state has read
# "not running" this long on end.
IDLE_QUIET_MS = 800


def wait_idle(page, *, timeout_ms: float) -> None:
    """Until the page's Streamlit run has finished: the app's script state (stApp's
    data-test-script-state, which follows the server's messages) "notRunning" for IDLE_QUIET_MS on
    end. The "Running…" widget is no guide: the frontend draws it only once a run has lasted 500 ms,
    so a glance just after a click finds a busy page without it."""
    app = page.get_by_test_id("stApp")
    deadline = time.monotonic() + timeout_ms / 1000
    quiet_since = None
    while True:
        state = app.get_attribute("data-test-script-state", timeout=max(1.0, (deadline - time.monotonic()) * 1000))
        now = time.monotonic()
        if state != "notRunning":
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since >= IDLE_QUIET_MS / 1000:
            return
        if now > deadline:
            raise TimeoutError(f"the page's Streamlit run was still {state!r} after {timeout_ms / 1000:g} s")
        page.wait_for_timeout(100)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class DashboardServer:
    process: subprocess.Popen
    url: str
    log: Path
    start_s: float  # from process start until the health check answered

    def stop(self, grace_s: float = 20) -> None:
        """SIGTERM to the server's whole process group, SIGKILL after ``grace_s``."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=grace_s)


def make_run_command(address: str, port: int) -> list[str]:
    """What ``make run ADDRESS=address PORT=port`` runs (``parallax ui``), with this interpreter."""
    return [sys.executable, "-m", "trainer_backend.control.command", "ui", "--address", address, "--port", str(port)]


def start_dashboard(env: dict[str, str], *, log: Path, timeout_s: float = 60, address: str = "127.0.0.1",
                    extra_args: tuple[str, ...] | list[str] = ()) -> DashboardServer:
    """Start the dashboard as ``make run`` does (``parallax ui``: ``streamlit run app.py``, with the
    .streamlit/config.toml beside it, and only the address and port given) with ``env`` on a free port,
    bound to ``address`` (reached through 127.0.0.1) with ``extra_args`` for streamlit (a test's
    secrets file; never a serving setting, or the server measured is not the one users get), and wait
    until it answers its health check; RuntimeError with the log's tail if it exits or stays silent
    for ``timeout_s``."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [*make_run_command(address, port), *extra_args],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = DashboardServer(process, url, log, 0.0)
    try:
        wait_healthy(url, process, log, timeout_s=timeout_s - (time.perf_counter() - started))
    except BaseException:
        server.stop()
        raise
    server.start_s = time.perf_counter() - started
    return server


def wait_healthy(url: str, process: subprocess.Popen, log: Path, *, timeout_s: float = 60) -> None:
    """Wait until the Streamlit server at ``url`` answers its health check; RuntimeError with the
    log's tail if ``process`` exits or the server stays silent for ``timeout_s``."""
    deadline = time.perf_counter() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"streamlit exited with {process.returncode}:\n{log.read_text()[-LOG_TAIL_CHARS:]}")
        if time.perf_counter() > deadline:
            raise RuntimeError(f"streamlit did not answer on {url} within {timeout_s:g} s:\n"
                               f"{log.read_text()[-LOG_TAIL_CHARS:]}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)


@contextlib.contextmanager
def running_dashboard(env: dict[str, str], *, log: Path, timeout_s: float = 60) -> Iterator[DashboardServer]:
    """``start_dashboard``, stopped (its whole process group) when the block ends."""
    server = start_dashboard(env, log=log, timeout_s=timeout_s)
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def dashboard_server(home: Path, *, timeout_s: float = 60) -> Iterator[tuple[subprocess.Popen, str, float]]:
    """The dashboard on PARALLAX_HOME ``home`` (its own SQLite database): yields (process, URL,
    seconds from start until it answered its health check)."""
    env = child_env(PARALLAX_HOME=str(home))
    env.pop("PARALLAX_DB_URL", None)
    with running_dashboard(env, log=home / "streamlit.log", timeout_s=timeout_s) as server:
        yield server.process, server.url, server.start_s


def browser_missing() -> str | None:
    """Why a real browser cannot be driven here, or None."""
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing (apt-get install -y chromium)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright)"
    return None
