"""Shared fixtures: every test gets its own PARALLAX_HOME and SQLite file, never the user's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def parallax_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("PARALLAX_HOME", str(home))
    monkeypatch.delenv("PARALLAX_DB_URL", raising=False)
    return home


@pytest.fixture
def db_url(parallax_home) -> str:
    return f"sqlite:///{parallax_home / 'parallax.db'}"


def run_cli(*args: str, home: Path, timeout: float = 600, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m trainer_backend`` as a real subprocess with its own PARALLAX_HOME."""
    env = {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    env.pop("PARALLAX_DB_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "trainer_backend", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )


@pytest.fixture
def cli(parallax_home):
    """``cli("run", "--epochs", "1")``: the CLI in a subprocess, on this test's PARALLAX_HOME."""
    return lambda *args, **kwargs: run_cli(*args, home=parallax_home, **kwargs)
