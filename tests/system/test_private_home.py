"""What Parallax keeps under PARALLAX_HOME (database, logs, checkpoints, rank notes) is its owner's
alone by default, so that a dashboard password is not undone by a readable file; sharing with a
group is a choice (PARALLAX_SHARE_GROUP). Real CLI processes, a launched run with its supervisor, and
the dashboard's entry file.

    .venv/bin/python -m pytest tests/system/test_private_home.py -q
"""

from __future__ import annotations

import grp
import os
import stat
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.support import ROOT, SLEEPER_DDP, SLEEPER_ENV, run_cli
from tests.trainer_backend.control.test_lifecycle import MODEL, launch, wait_for


def everything_under(home: Path) -> list[Path]:
    return [home, *home.rglob("*")]


def modes(paths) -> dict[str, str]:
    return {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in paths}


def test_everything_a_launched_run_writes_is_its_owners_alone(parallax_home):
    parallax_home.chmod(0o755)  # a home made before (or by hand), readable by every account
    run_id = launch(parallax_home, *SLEEPER_DDP, "--epochs", "1", env_extra=SLEEPER_ENV)
    run = wait_for(parallax_home, run_id, lambda r: r["status"] not in ("queued", "running"), what="the end")
    assert run["status"] == "completed", run["error"]
    written = everything_under(parallax_home)
    names = {p.name for p in written}
    assert {"parallax.db", "run.log", "best.pt", "rank0.pid", "rank1.pid", "queue.lock"} <= names, names
    shared = {path: mode for path, mode in modes(written).items() if int(mode, 8) & 0o077}
    assert shared == {}, shared  # was: 0644 files in 0755 folders
    assert stat.S_IMODE(parallax_home.stat().st_mode) == 0o700


def a_group_to_share_with() -> int:
    if os.geteuid() == 0:
        return next(g.gr_gid for g in grp.getgrall() if g.gr_gid != os.getgid())
    others = [gid for gid in os.getgroups() if gid != os.getgid()]
    if not others:
        pytest.skip("this user belongs to no group but its own: nothing to share with")
    return others[0]


def test_a_share_group_gives_that_group_the_home_and_no_one_else(tmp_path):
    gid = a_group_to_share_with()
    home = tmp_path / "shared-home"  # made by Parallax itself
    result = run_cli("run", *MODEL, "--image-size", "16", "--epochs", "1", home=home, timeout=300,
                     env_extra={"PARALLAX_SHARE_GROUP": grp.getgrgid(gid).gr_name})
    assert result.returncode == 0, result.stderr
    written = everything_under(home)
    assert "best.pt" in {p.name for p in written}
    assert {str(p) for p in written if p.stat().st_gid != gid} == set()  # all in the group
    assert {path: mode for path, mode in modes(written).items() if int(mode, 8) & 0o007} == {}  # none for others
    assert stat.S_IMODE(home.stat().st_mode) == 0o2770
    # The group may write what a launch or a cancel writes: the database and the run folders.
    for path in written:
        needed = 0o070 if path.is_dir() else 0o060 if path.suffix in (".db", ".pt") else 0o040
        assert stat.S_IMODE(path.stat().st_mode) & needed == needed, (path, oct(path.stat().st_mode))


def test_an_unknown_share_group_is_one_line(parallax_home):
    result = run_cli("list", home=parallax_home, timeout=60, env_extra={"PARALLAX_SHARE_GROUP": "no-such-group-x"})
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == ("error: PARALLAX_SHARE_GROUP='no-such-group-x' is not allowed: no group of that "
                                     "name or number on this machine; name a group to share PARALLAX_HOME with, or "
                                     "leave it unset to keep it private")


@pytest.fixture
def umask_kept():
    before = os.umask(0o022)
    os.umask(before)
    yield
    os.umask(before)


def test_the_dashboard_makes_its_home_and_database_private(tmp_path, monkeypatch, umask_kept):
    home = tmp_path / "dashboard-home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    monkeypatch.setenv("PARALLAX_HOME", str(home))
    monkeypatch.delenv("PARALLAX_DB_URL", raising=False)
    monkeypatch.delenv("PARALLAX_SHARE_GROUP", raising=False)
    os.umask(0o022)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=90).run()
    assert not at.exception, at.exception
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert {path: mode for path, mode in modes(everything_under(home)).items() if int(mode, 8) & 0o077} == {}
    assert os.umask(0o077) == 0o077  # what the runs it launches inherit
