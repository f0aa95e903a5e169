"""Full disks outside the dataset cache: a database that fills up mid-run ends the run with that
reason in one line and keeps every epoch already recorded. The disk is a real tmpfs mounted as
root (skipped with the reason where mounting is not allowed), always unmounted afterwards.

    .venv/bin/python -m pytest tests/db/test_reserve_full_disks.py -q
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import DDP_ON_CPU, SLEEPER, SLEEPER_ENV, run_cli
from db.reserve import RESERVE_BYTES

# Room left on the database's disk when the run starts, besides the run's reserve: a few dozen
# commits (each a 4 KiB page or more in the WAL), so the disk fills within the first epochs.
ROOM_BYTES = 160 * 1024


@contextlib.contextmanager
def mounted_tmpfs(path: Path, *options: str):
    """A tmpfs on ``path``; skips the test with the reason where mounting is not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(path)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here to make a full disk: {result.stderr.strip() or result.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(folder: Path, leave_bytes: int) -> Path:
    """A file that takes all but ``leave_bytes`` of ``folder``'s disk."""
    filler = folder / "filler"
    size = shutil.disk_usage(folder).free - leave_bytes
    with open(filler, "wb") as handle:
        handle.write(bytes(max(0, size)))
    return filler


def run_args(url: str, *flags: str) -> list[str]:
    """A run that goes on until the database's disk fills: its model sleeps through its steps
    (SLEEPER), as the writes that fill the disk come with time and steps, not with compute."""
    return ["--db", url, "run", *SLEEPER, "--epochs", "40", *flags]


@pytest.mark.parametrize("flags", [(), DDP_ON_CPU],
                         ids=["single", "ddp"])
def test_a_database_that_fills_mid_run_ends_it_with_the_reason_and_keeps_every_epoch(flags, tmp_path, parallax_home):
    with mounted_tmpfs(tmp_path / "db-disk", "size=4m") as disk:
        url = f"sqlite:///{disk / 'parallax.db'}"
        created = run_cli("--db", url, "list", home=parallax_home, timeout=120)
        assert created.returncode == 0, created.stderr
        filler = fill(disk, RESERVE_BYTES + ROOM_BYTES)
        result = run_cli(*run_args(url, *flags), home=parallax_home, timeout=300, env_extra=SLEEPER_ENV)
        assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
        assert result.stdout.strip().splitlines()[-1] == "run_id=1 status=failed"
        error_line = result.stderr.strip().splitlines()[-1]
        rank = "rank 0: " if flags else ""  # a DDP run names the rank that recorded into the database
        assert error_line.startswith(f"error: {rank}disk full while writing to the database {url}: could not "), \
            error_line
        assert f"left in {disk})" in error_line and "the metrics recorded so far are kept" in error_line, error_line
        assert "Traceback" not in result.stderr and "OperationalError" not in error_line

        listed = run_cli("--db", url, "list", home=parallax_home, timeout=120)  # readable while still full
        assert listed.returncode == 0 and "run_id=1 status=failed" in listed.stdout, listed.stderr
        filler.unlink()
        exported = json.loads(run_cli("--db", url, "export", "1", home=parallax_home, timeout=120).stdout)
        assert exported["status"] == "failed" and exported["error"] == error_line.removeprefix("error: ")
        epochs = [epoch["epoch"] for epoch in exported["epochs"]]
        printed = [int(n) for n in re.findall(r"^epoch (\d+)/40 ", result.stdout, flags=re.M)]
        # Every epoch printed is recorded; the last one recorded may not be printed yet (a write that
        # follows it in the same epoch found the disk full).
        assert epochs == list(range(1, len(epochs) + 1)) and epochs[:len(printed)] == printed, (epochs, printed)
        assert len(epochs) - len(printed) <= 1, (epochs, printed)
        assert not list(disk.glob("*.reserve")), list(disk.iterdir())


def test_exports_onto_a_full_or_read_only_disk_are_one_line_and_leave_no_half_file(tmp_path, parallax_home):
    trained = run_cli("run", "--dataset", "digits", "--model", "test_resnet", "--image-size", "16", "--epochs", "1",
                      "--profile", "--profile-wait", "0", "--profile-warmup", "0", "--profile-active", "1", "--quiet",
                      home=parallax_home, timeout=180)
    assert trained.returncode == 0, trained.stderr[-2000:]
    for flag, first in (("--csv", "CSV file"), ("--profile-dir", "profile trace")):
        with mounted_tmpfs(tmp_path / f"full{flag}", "size=4k") as disk:
            fill(disk, 0)
            result = run_cli("export", "1", flag, str(disk / "out"), home=parallax_home, timeout=120)
            assert result.returncode == 2, result.stdout[-500:] + result.stderr[-2000:]
            (line,) = result.stderr.strip().splitlines()
            assert line.startswith(f"error: disk full while writing {first} {disk}/out/"), line
            assert "No space left on device" in line and "no half-written file is left" in line, line
            assert not [p for p in disk.rglob("*") if p.name.endswith(".part")]
        with mounted_tmpfs(tmp_path / f"read-only{flag}", "ro", "size=64k") as disk:
            result = run_cli("export", "1", flag, str(disk / "out"), home=parallax_home, timeout=120)
            assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
            (line,) = result.stderr.strip().splitlines()
            assert line.startswith("error: cannot write ") and f"{flag} {disk}/out" in line, line
            assert "Read-only file system" in line, line


@pytest.mark.parametrize("command, disk, words", [
    ("run", "read-only", "cannot write the run's folder {runs}/"),
    ("launch", "read-only", "cannot write the run's log {runs}/"),
    ("run", "full", "disk full while writing the rank's pid file {runs}/"),
], ids=["run-read-only", "launch-read-only", "run-full"])
def test_a_read_only_or_full_runs_folder_ends_the_run_in_one_line(command, disk, words, parallax_home):
    runs = parallax_home / "runs"
    options = ("ro", "size=64k") if disk == "read-only" else ("size=4k",)
    with mounted_tmpfs(runs, *options):
        if disk == "full":
            fill(runs, 0)
        result = run_cli(command, "--model", "test_resnet", "--image-size", "16", "--epochs", "1",
                         home=parallax_home, timeout=180)
        assert result.returncode in (1, 2) and "Traceback" not in result.stderr, result.stderr[-3000:]
        line = result.stderr.strip().splitlines()[-1]
        assert line.startswith("error: " + words.format(runs=runs)), line
        assert ("Read-only file system: give PARALLAX_HOME a folder this user can write" in line
                if disk == "read-only" else "(No space left on device)" in line), line
        listed = run_cli("list", home=parallax_home, timeout=60).stdout
        assert listed.startswith("run_id=1 status=failed"), listed  # recorded with its reason, not left queued
        exported = json.loads(run_cli("export", "1", home=parallax_home, timeout=60).stdout)
        assert exported["error"] == line.removeprefix("error: ")


def test_a_database_that_cannot_be_written_any_more_is_one_line_and_heartbeats_skip(parallax_home):
    """A file system cannot be remounted read-only under an open SQLite writer, so the read-only
    database is SQLite's own: the same file opened with ``mode=ro``, every write refused by SQLite."""
    import db
    from db import run_state, store
    from db.connection import DatabaseReadOnlyError, retry_when_locked

    writable = db.make_engine(f"sqlite:///{parallax_home / 'parallax.db'}")
    run_id = store.create_run(writable, {"strategy": "single", "model": "test_resnet", "dataset": "digits"},
                              status="running")
    store.set_process(writable, run_id, pid=2**22 + 12345, host=__import__("socket").gethostname())  # no such process
    db.dispose_engines()
    read_only = db.make_engine(f"sqlite:///file:{parallax_home / 'parallax.db'}?mode=ro&uri=true")
    try:
        with pytest.raises(DatabaseReadOnlyError) as refused:
            retry_when_locked(lambda: store.log_epoch(read_only, run_id, {"epoch": 1}), what="record epoch 1")
        message = str(refused.value)
        assert "became read-only: could not record epoch 1 (attempt to write a readonly database)" in message
        assert "the metrics recorded so far are kept" in message and "\n" not in message
        assert run_state.heartbeat(read_only, run_id) is False  # skipped, as under a lock
        assert run_state.mark_lost_runs(read_only) == []  # reads go on; marking waits for a writable database
        assert [run.status for run in store.list_runs(read_only)] == ["running"]
    finally:
        db.dispose_engines()


def test_the_cpu_peak_cache_on_a_full_disk_is_measured_and_leaves_no_part_file(tmp_path):
    from trainer_backend.telemetry.flops import cpu_peak_tflops

    with mounted_tmpfs(tmp_path / "data-disk", "size=4k") as disk:
        fill(disk, 0)
        assert cpu_peak_tflops(1, disk) > 0  # measured; only the cache could not be kept
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]
