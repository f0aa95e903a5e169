"""Each database's run files kept apart, and launches that mean the caller's paths: real launched
workers on real SQLite files.

    .venv/bin/python -m pytest tests/db/test_folders.py -q
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

import db
from tests.support import ROOT, run_cli
from db import store
from db.folders import database_key, run_folder
from contract.config import RunConfig
from trainer_backend.control.housekeeping import delete_run_and_files, run_file

TINY = ("--dataset", "digits", "--model", "test_resnet", "--image-size", "8", "--epochs", "1")
TIMEOUT_S = 120


def launch_cli(*args: str, cwd: Path, home: Path) -> int:
    """``python -m trainer_backend ... launch`` from ``cwd`` (from the checkout's root, forked as
    ``run_cli`` forks it); the run id it printed."""
    if cwd == ROOT:
        done = run_cli(*args, home=home, timeout=TIMEOUT_S)
    else:
        env = {**os.environ, "PARALLAX_HOME": str(home), "PYTHONPATH": str(ROOT)}
        env.pop("PARALLAX_DB_URL", None)
        done = subprocess.run([sys.executable, "-m", "trainer_backend", *args], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    return int(done.stdout.split()[0].split("=")[1])


def wait_until_ended(url: str, run_id: int) -> store.RunRecord:
    engine = db.make_engine(url)
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        run = store.get_run(engine, run_id)
        if run is not None and run.status not in ("queued", "running"):
            return run
        time.sleep(0.5)
    raise AssertionError(f"run {run_id} of {url} did not end within {TIMEOUT_S} s")


def test_two_databases_under_one_home_keep_their_runs_files_apart(parallax_home):
    urls = {name: f"sqlite:///{parallax_home / f'{name}.db'}" for name in ("first", "second")}
    ids = {name: launch_cli("--db", url, "launch", *TINY, cwd=ROOT, home=parallax_home) for name, url in urls.items()}
    assert ids == {"first": 1, "second": 1}  # the same run id in each database
    runs = {name: wait_until_ended(url, 1) for name, url in urls.items()}
    assert all(run.status == "completed" for run in runs.values()), [run.error for run in runs.values()]

    engines = {name: db.make_engine(url) for name, url in urls.items()}
    folders = {name: run_folder(engine, 1) for name, engine in engines.items()}
    assert folders["first"] != folders["second"]
    for name, folder in folders.items():
        assert folder.parent.name == database_key(engines[name])[0] and folder.parent.parent == parallax_home / "runs"
        log = run_file(engines[name], 1, "run.log").read_text()
        assert log.count("run_id=1 single on cpu") == 1 and log.count("epoch 1/1") == 1  # its own run's lines only
        assert (folder / "best.pt").exists()

    # Deleting run 1 of the second database leaves the first's run 1 whole.
    delete_run_and_files(1, db_url=urls["second"])
    assert not folders["second"].exists() and (folders["first"] / "best.pt").exists()

    # A database deleted and created again under the same name gets folders of its own.
    db.dispose_engines()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{parallax_home / 'second.db'}{suffix}").unlink(missing_ok=True)
    again = db.make_engine(urls["second"])
    assert store.create_run(again, {"strategy": "single", "model": "m", "dataset": "digits"}) == 1
    assert run_folder(again, 1) not in (folders["first"], folders["second"])
    db.dispose_engines()


def png_set(folder: Path) -> Path:
    for index, name in enumerate(("forest", "river")):
        (folder / name).mkdir(parents=True)
        for i in range(5):
            Image.new("RGB", (8, 8), (80 * index, 30 * i, 90)).save(folder / name / f"{i}.png")
    return folder


def test_relative_paths_given_to_launch_mean_the_callers_directory(tmp_path, parallax_home, monkeypatch):
    """The supervisor runs in the project's folder; a relative database, dataset or data root must
    still mean the folder the caller was in: from the CLI, and from launch() (the dashboard's way)."""
    from trainer_backend.control.lifecycle import launch

    elsewhere = tmp_path / "elsewhere"
    png_set(elsewhere / "data" / "set")
    flags = ("--model", "test_resnet", "--image-size", "8", "--epochs", "1")
    cli_id = launch_cli("--db", "sqlite:///cli.db", "launch", "--dataset", "data/set", *flags, cwd=elsewhere,
                        home=parallax_home)
    monkeypatch.chdir(elsewhere)
    api_id = launch(RunConfig(dataset="data/set", model="test_resnet", image_size=8, epochs=1),
                    db_url="sqlite:///api.db", data_roots=[Path("data")])
    for name, run_id in (("cli", cli_id), ("api", api_id)):
        url = f"sqlite:///{elsewhere / f'{name}.db'}"
        run = wait_until_ended(url, run_id)
        assert run.status == "completed", run.error
        assert run.config["dataset"] == str(elsewhere / "data" / "set")
        assert not (ROOT / f"{name}.db").exists()  # nothing was created where the supervisor runs
    db.dispose_engines()


def test_a_relative_sqlite_url_is_made_absolute_and_others_are_left_alone(tmp_path, monkeypatch):
    from db.connection import absolute_database_url

    monkeypatch.chdir(tmp_path)
    assert absolute_database_url("sqlite:///rel/p.db") == f"sqlite:///{tmp_path / 'rel' / 'p.db'}"
    for unchanged in ("sqlite:////abs/p.db", "sqlite://", "sqlite:///:memory:",
                      "postgresql+psycopg://u:p%40ss@host/db", "not a url"):
        assert absolute_database_url(unchanged) == unchanged


@pytest.fixture
def upgraded(tmp_path, parallax_home):
    """The 0001 fixture database (runs 1-3) in a home that holds run 1's files from before."""
    import shutil

    from tests.db.test_connection_upgrades import FIXTURE

    path = parallax_home / "parallax.db"
    shutil.copyfile(FIXTURE, path)
    old_folder = parallax_home / "runs" / "run-1"
    old_folder.mkdir(parents=True)
    (old_folder / "best.pt").write_bytes(b"weights of run 1")
    (old_folder / "run.log").write_text("epoch 1/1 of run 1\n")
    yield db.make_engine(f"sqlite:///{path}"), old_folder
    db.dispose_engines()


def test_an_upgraded_database_keeps_its_runs_folders_and_keys_the_new_ones(upgraded, parallax_home):
    engine, old_folder = upgraded
    key, unkeyed_up_to = database_key(engine)
    assert unkeyed_up_to == 3  # the runs the database held when it was upgraded
    assert run_folder(engine, 1) == old_folder
    assert run_file(engine, 1, "run.log").read_text() == "epoch 1/1 of run 1\n"
    new_id = store.create_run(engine, {"strategy": "single", "model": "m", "dataset": "digits"}, status="completed")
    assert run_folder(engine, new_id) == parallax_home / "runs" / key / f"run-{new_id}"
    delete_run_and_files(1, db_url=str(engine.url))
    assert not old_folder.exists() and store.get_run(engine, 1) is None
