"""scripts/system-deps, which `make test` runs first: it installs what a fresh machine lacks as root,
through `sudo -n` otherwise, and else stops with the one command to run. Run with --dry-run and
with stand-ins for `id` and `sudo` (nothing is installed)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support import ROOT

SCRIPT = ROOT / "scripts" / "system-deps"


def run_script(tmp_path, *, uid: int, sudo_allowed: bool, chromium: str, initdb: str = "/nowhere/initdb",
               slurmctld: str | None = None):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(exist_ok=True)
    for name, body in (("id", f"echo {uid}"), ("sudo", f"exit {0 if sudo_allowed else 1}")):
        (fake_bin / name).write_text(f"#!/bin/sh\n{body}\n")
        (fake_bin / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}", "CHROMIUM": chromium, "INITDB_GLOB": initdb,
           "PYTHON": "true",  # python3-venv counts as installed
           "SLURMCTLD": slurmctld or "/bin/sh"}  # Slurm counts as installed, unless said
    return subprocess.run(["bash", str(SCRIPT), "--dry-run"], env=env, capture_output=True, text=True, timeout=30)


def test_nothing_to_do_when_everything_is_there(tmp_path):
    present = tmp_path / "chromium"
    present.write_text("#!/bin/sh\n")
    present.chmod(0o755)
    done = run_script(tmp_path, uid=1000, sudo_allowed=False, chromium=str(present), initdb=str(present))
    assert done.returncode == 0 and done.stdout == "" and done.stderr == ""


@pytest.mark.parametrize("uid, sudo_allowed, prefix", [(0, False, "bash -c"), (1000, True, "sudo -n bash -c")])
def test_installs_what_is_missing_as_root_or_through_sudo(tmp_path, uid, sudo_allowed, prefix):
    done = run_script(tmp_path, uid=uid, sudo_allowed=sudo_allowed, chromium=str(tmp_path / "absent"))
    assert done.returncode == 0, done.stderr
    command = done.stdout.replace("\\", "")
    assert command.startswith(prefix)
    assert "apt-get update" in command and "apt-get install -y -qq chromium postgresql" in command


def test_installs_slurm_without_its_recommends(tmp_path):
    present = tmp_path / "chromium"
    present.write_text("#!/bin/sh\n")
    present.chmod(0o755)
    done = run_script(tmp_path, uid=0, sudo_allowed=False, chromium=str(present), initdb=str(present),
                      slurmctld=str(tmp_path / "absent"))
    assert done.returncode == 0, done.stderr
    command = done.stdout.replace("\\", "")
    assert "apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge" in command
    assert "chromium" not in command and "postgresql" not in command


def test_without_root_or_sudo_it_stops_with_the_command_to_run(tmp_path):
    done = run_script(tmp_path, uid=1000, sudo_allowed=False, chromium=str(tmp_path / "absent"))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "error: the tests need chromium postgresql: run  sudo apt-get update && sudo apt-get install -y chromium postgresql"]


def test_venv_only_asks_for_python3_venv_alone(tmp_path):
    no_ensurepip = tmp_path / "python3"
    no_ensurepip.write_text("#!/bin/sh\nexit 1\n")  # a Debian python3 without python3-venv: no ensurepip
    no_ensurepip.chmod(0o755)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "id").write_text("#!/bin/sh\necho 0\n")
    (fake_bin / "id").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}", "PYTHON": str(no_ensurepip),
           "CHROMIUM": str(tmp_path / "absent")}
    done = subprocess.run(["bash", str(SCRIPT), "--venv-only", "--dry-run"], env=env, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.replace("\\", "").rstrip().endswith("apt-get install -y -qq python3-venv")


def test_make_run_on_a_python_without_venv_asks_for_it_before_making_the_venv(tmp_path):
    """`make run` as a user on a fresh Debian (python3 without ensurepip, no sudo): it stops with the
    command that installs python3-venv, and never gets to `python3 -m venv`."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    marker = tmp_path / "venv-attempted"
    scripts = {"id": "echo 1000", "sudo": "exit 1",
               # import ensurepip fails, as on Debian without python3-venv; `-m venv` would leave a mark
               "python3": f'case "$*" in *venv*) touch {marker};; esac; exit 1'}
    for name, body in scripts.items():
        (fake_bin / name).write_text(f"#!/bin/sh\n{body}\n")
        (fake_bin / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    env.pop("MAKEFLAGS", None)
    done = subprocess.run(["make", "-C", str(ROOT), "run", f"VENV={tmp_path / 'venv'}"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert ("error: the dashboard needs python3-venv: run  sudo apt-get update && sudo apt-get install -y "
            "python3-venv") in done.stderr
    assert not marker.exists() and not (tmp_path / "venv").exists()
