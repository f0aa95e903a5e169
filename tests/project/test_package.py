"""Parallax as an installed package: a wheel built from this checkout, installed into a folder of its own, used
from another directory through its one command, ``parallax``. The wheel is installed without its dependencies
(they are the test's own venv's), so that the run, the dashboard and the migrations can only have found
Parallax's modules in the installed folder, never in the checkout."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support import ROOT


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The folder the wheel was installed into (``--target``); its ``bin/parallax`` is the command."""
    wheels = tmp_path_factory.mktemp("wheel")
    target = tmp_path_factory.mktemp("installed")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                            str(ROOT)], capture_output=True, text=True, timeout=300, cwd=wheels)
    assert build.returncode == 0, build.stdout + build.stderr
    wheel = next(wheels.glob("parallax_train-*.whl"))
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(target),
                              str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    return target


def parallax(installed: Path, *args: str, cwd: Path, home: Path, timeout: float = 300, stdin: str | None = None):
    env = {**os.environ, "PYTHONPATH": str(installed), "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.pop("PARALLAX_DB_URL", None)
    return subprocess.run([str(installed / "bin" / "parallax"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, input=stdin)


def test_the_wheel_holds_the_dashboard_its_config_and_the_migrations(installed):
    assert (installed / "parallax_app" / "app.py").is_file()
    assert sorted(p.name for p in (installed / "parallax_app" / "pages").glob("*.py")) == sorted(
        p.name for p in (ROOT / "pages").glob("*.py"))
    # Streamlit reads the .streamlit folder beside the main script: the installed dashboard is served as make run
    # serves the checkout's.
    assert (installed / "parallax_app" / ".streamlit" / "config.toml").read_text() == (
        ROOT / ".streamlit" / "config.toml").read_text()
    migrations = sorted(p.name for p in (installed / "db" / "migrations" / "versions").glob("*.py"))
    assert migrations == sorted(p.name for p in (ROOT / "db" / "migrations" / "versions").glob("*.py"))
    assert (installed / "db" / "migrations" / "script.py.mako").is_file()


def test_parallax_trains_from_another_directory_with_the_installed_modules(installed, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    home = tmp_path / "home"
    done = parallax(installed, "run", "--dataset", "digits", "--epochs", "1", "--model", "test_resnet",
                    "--image-size", "16", cwd=elsewhere, home=home)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "run_id=1 status=completed"
    listed = parallax(installed, "list", cwd=elsewhere, home=home)
    assert listed.returncode == 0 and "run_id=1 status=completed" in listed.stdout
    where = subprocess.run([sys.executable, "-c", "import trainer_backend, db, ui; print(trainer_backend.__file__)"],
                           cwd=elsewhere, env={**os.environ, "PYTHONPATH": str(installed)}, capture_output=True,
                           text=True, timeout=60)
    assert Path(where.stdout.strip()).is_relative_to(installed), where.stdout + where.stderr


def test_the_chores_have_their_commands(installed, tmp_path):
    home = tmp_path / "home"
    upgraded = parallax(installed, "db", "upgrade", cwd=tmp_path, home=home)
    assert upgraded.returncode == 0, upgraded.stderr
    from db.connection import MIGRATIONS_DIR

    newest = max(p.stem.split("_")[0] for p in (MIGRATIONS_DIR / "versions").glob("0*.py"))
    assert upgraded.stdout.strip().endswith(f"is at revision {newest}") and (home / "parallax.db").is_file()

    hashed = parallax(installed, "hash-password", cwd=tmp_path, home=home, stdin="correct horse battery\n")
    assert hashed.returncode == 0 and hashed.stdout.startswith('[parallax]\npassword_hash = "scrypt$')

    unknown = parallax(installed, "trian", cwd=tmp_path, home=home)
    assert unknown.returncode == 2 and "trian" in unknown.stderr and len(unknown.stderr.strip().splitlines()) == 1
    helped = parallax(installed, "--help", cwd=tmp_path, home=home)
    assert helped.returncode == 0 and "parallax ui" not in helped.stderr and "ui " in helped.stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_parallax_ui_serves_the_installed_dashboard_from_any_directory(installed, tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(installed), "PARALLAX_HOME": str(tmp_path / "home")}
    server = subprocess.Popen([str(installed / "bin" / "parallax"), "ui", "--port", str(port)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as answer:
                    assert answer.read() == b"ok"
                    break
            except OSError:
                assert server.poll() is None, server.stdout.read()
                assert time.monotonic() < deadline, "the dashboard did not answer in 60 s"
                time.sleep(0.3)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as page:
            assert page.status == 200 and b"<title>" in page.read().lower()
        # The process serving is Streamlit on the installed app.py, not on a checkout's.
        command = Path(f"/proc/{server.pid}/cmdline").read_bytes().split(b"\0")
        assert str(installed / "parallax_app" / "app.py").encode() in command
    finally:
        os.killpg(server.pid, 9)
        server.wait(timeout=30)
