"""Resuming a run (rank/resume.py, control/lifecycle.resume): every run leaves a resume point at each
epoch's end, and a killed single, DDP or FSDP run continues from its last finished epoch as the same run,
each epoch recorded once; the points kept on disk are bounded by --keep-checkpoints.

    .venv/bin/python -m pytest tests/trainer_backend/control/test_resume.py -q
"""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from tests.support import SLEEPER, SLEEPER_ENV, run_cli, run_dir
from tests.trainer_backend.control.test_lifecycle import assert_group_gone, export, launch, wait_for
from db import make_engine, store
from contract.checkpoint_file import DamagedFileError
from contract.config import RunConfig
from trainer_backend.control.lifecycle import resume
from trainer_backend.rank import resume as points
from trainer_backend.rank.strategies import Strategy

WORLDS = {  # (the run's flags, the devices it resumes on: None for its own)
    "single": ((), None),
    "ddp": (("--strategy", "ddp", "--devices", "cpu,cpu"), None),
    "fsdp": (("--strategy", "fsdp", "--devices", "cpu,cpu"), None),
    "ddp moved to one process": (("--strategy", "ddp", "--devices", "cpu,cpu"), "cpu"),
}


def save_points(folder, epochs: int, keep: int) -> None:
    strategy = Strategy(RunConfig(), rank=0)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(1, epochs + 1):
        with torch.no_grad():
            model.weight.fill_(epoch)
        points.save_resume_point(folder, strategy, model, optimizer, None, epoch=epoch, best_acc=epoch / 10,
                                 keep=keep)


def test_keep_checkpoints_bounds_the_resume_points_on_disk(tmp_path):
    save_points(tmp_path, epochs=4, keep=2)
    assert sorted(p.name for p in tmp_path.glob("resume*.pt")) == ["resume-epoch3.pt", "resume.pt"]
    (tmp_path / "one").mkdir()
    save_points(tmp_path / "one", epochs=3, keep=1)
    assert sorted(p.name for p in (tmp_path / "one").glob("resume*.pt")) == ["resume.pt"]


def test_a_world_of_one_restores_its_last_point_without_a_process_group(tmp_path):
    save_points(tmp_path, epochs=3, keep=1)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    resumed = points.restore(tmp_path, Strategy(RunConfig(), rank=0), model, optimizer, None)
    assert (resumed.start_epoch, resumed.best_acc, resumed.first_step) == (4, 0.3, 1)
    assert torch.all(model.weight == 3)


def test_only_an_ended_run_with_a_resume_point_is_resumed(parallax_home, engine, monkeypatch):
    completed = store.create_run(engine, {"dataset": "digits", "model": "m", "strategy": "single"}, status="completed")
    with pytest.raises(ValueError, match=rf"run {completed} is completed: only a failed, cancelled, lost run can be "
                                         "resumed"):
        resume(completed)
    failed = store.create_run(engine, {"dataset": "digits", "model": "m", "strategy": "single"}, status="failed")
    with pytest.raises(ValueError, match=rf"run {failed} has no resume point .* it ended before its first epoch"):
        resume(failed)
    with pytest.raises(LookupError, match="no run with id 999"):
        resume(999)


def resumable_from(folder) -> int:
    """The epoch of the run folder's last resume point (resume.json, written after resume.pt), 0 if none yet."""
    try:
        return int(json.loads((folder / points.RESUME_EPOCH_FILE).read_text())["epoch"])
    except FileNotFoundError:
        return 0


@pytest.mark.processes
@pytest.mark.parametrize("world", list(WORLDS))
def test_a_killed_run_resumes_from_its_last_epoch_as_the_same_run(parallax_home, world):
    flags, devices = WORLDS[world]
    run_id = launch(parallax_home, *SLEEPER, *flags, "--batch-size", "64", "--epochs", "6",
                    env_extra=SLEEPER_ENV)
    folder = run_dir(parallax_home, run_id)
    # An epoch is recorded before its resume point is written: kill only once epoch 2's point is
    # there, so that the resumed run must start after it.
    run = wait_for(parallax_home, run_id, lambda r: len(r["epochs"]) >= 2 and resumable_from(folder) >= 2,
                   timeout_s=180, what="two epochs and the resume point of epoch 2")
    os.killpg(run["pid"], signal.SIGKILL)
    assert_group_gone(run["pid"])
    killed = export(parallax_home, run_id)
    assert killed["status"] == "lost" and len(killed["epochs"]) < 6
    assert (folder / "resume.pt").is_file()

    moved = ("--devices", devices) if devices else ()
    resumed = run_cli("resume", str(run_id), *moved, home=parallax_home, timeout=60, env_extra=SLEEPER_ENV)
    assert resumed.stdout.strip() == f"run_id={run_id} status=queued", resumed.stdout + resumed.stderr
    run = wait_for(parallax_home, run_id, lambda r: r["status"] not in ("queued", "running"), timeout_s=180,
                   what="the resumed run's end")
    assert run["status"] == "completed", run["error"]
    assert [e["epoch"] for e in run["epochs"]] == [1, 2, 3, 4, 5, 6]
    [note] = [n for n in run["notes"] if n.startswith("Resumed at epoch")]
    start = int(note.split()[3])
    assert 2 < start <= len(killed["epochs"]) + 1  # from the last point: no finished epoch is trained again
    assert run["started_at"] == killed["started_at"]  # the same run: its times run on across the gap
    assert len(store.list_runs(make_engine(f"sqlite:///{parallax_home / 'parallax.db'}"))) == 1
    if devices:
        assert run["config"]["devices"] == [devices] and "Resumed on cpu (trained on cpu,cpu before)." in run["notes"]


def test_a_staged_run_resumes_only_on_as_many_devices_as_it_has_stages(parallax_home, engine):
    config = RunConfig(strategy="mp", devices=("cpu", "cpu")).to_dict()
    run_id = store.create_run(engine, config, status="failed")
    folder = run_dir(parallax_home, run_id)
    folder.mkdir(parents=True)
    (folder / "resume.pt").write_bytes(b"point")
    with pytest.raises(ValueError, match=rf"devices cpu,cpu,cpu are not allowed for resuming run {run_id}: a mp "
                                         r"run resumes on as many devices as it has stages \(2\)"):
        resume(run_id, devices="cpu,cpu,cpu")
    assert store.get_run(engine, run_id).status == "failed"  # refused before anything changed


def damaged_copies(good: bytes) -> dict[str, bytes]:
    """A resume point's bytes as a cut copy, a disk error or a wrong file leave them."""
    return {"cut in half": good[:len(good) // 2], "cut at its end": good[:-30], "random bytes": os.urandom(len(good)),
            "empty": b""}


DAMAGE_WORDS = {"cut in half": "is cut short", "cut at its end": "is cut short", "random bytes": "is not a checkpoint",
                "empty": "is empty (0 bytes)"}


@pytest.mark.parametrize("damage", list(DAMAGE_WORDS))
def test_restoring_a_damaged_resume_point_names_the_file_and_what_is_wrong(tmp_path, damage):
    save_points(tmp_path, epochs=2, keep=1)
    point = tmp_path / points.RESUME_FILE
    point.write_bytes(damaged_copies(point.read_bytes())[damage])
    model = torch.nn.Linear(2, 2)
    with pytest.raises(DamagedFileError) as raised:  # was OSError: [Errno 22] Invalid argument, UnpicklingError ...
        points.restore(tmp_path, Strategy(RunConfig(), rank=0), model, torch.optim.SGD(model.parameters(), lr=0.1), None)
    message = str(raised.value)
    assert message.startswith(f"resume point {point} {DAMAGE_WORDS[damage]}"), message
    assert "\n" not in message and message.endswith("launch the run again from its first epoch")


def test_a_resume_point_torch_cannot_read_is_named_with_torchs_reason(tmp_path):
    """A whole archive that is not a checkpoint passes the look at its bytes; torch's own refusal is named."""
    import zipfile

    save_points(tmp_path, epochs=1, keep=1)
    with zipfile.ZipFile(tmp_path / points.RESUME_FILE, "w") as archive:
        archive.writestr("notes.txt", "not a checkpoint")
    model = torch.nn.Linear(2, 2)
    with pytest.raises(DamagedFileError, match=r"^resume point .*resume\.pt cannot be read \(RuntimeError: "):
        points.restore(tmp_path, Strategy(RunConfig(), rank=0), model, torch.optim.SGD(model.parameters(), lr=0.1), None)


@pytest.mark.parametrize("damage", list(DAMAGE_WORDS))
def test_resuming_from_a_damaged_point_is_refused_in_one_line_before_the_run_is_queued(parallax_home, engine, damage):
    run_id = store.create_run(engine, RunConfig().to_dict(), status="failed")
    folder = run_dir(parallax_home, run_id)
    save_points(folder, epochs=1, keep=1)
    point = folder / points.RESUME_FILE
    point.write_bytes(damaged_copies(point.read_bytes())[damage])
    with pytest.raises(DamagedFileError) as refused:
        resume(run_id)
    assert str(refused.value).startswith(f"run {run_id}'s resume point {point} {DAMAGE_WORDS[damage]}")
    assert store.get_run(engine, run_id).status == "failed"  # not queued: nothing started


@pytest.mark.processes
def test_a_resumed_run_whose_point_torch_cannot_read_fails_in_one_line_naming_it(parallax_home, engine):
    """Past resume's look at the file's bytes (a whole archive), the supervisor's rank fails reading it: the run ends
    failed with the file named, no traceback (was: a bare OSError or RuntimeError and its traceback)."""
    import zipfile

    config = RunConfig(model="parallax_sleeps_each_step", image_size=16, epochs=2).to_dict()
    run_id = store.create_run(engine, config, status="failed")
    folder = run_dir(parallax_home, run_id)
    folder.mkdir(parents=True)
    with zipfile.ZipFile(folder / points.RESUME_FILE, "w") as archive:
        archive.writestr("notes.txt", "not a checkpoint")
    (folder / points.RESUME_EPOCH_FILE).write_text(json.dumps({"epoch": 1}))
    resumed = run_cli("resume", str(run_id), home=parallax_home, timeout=60, env_extra=SLEEPER_ENV)
    assert resumed.returncode == 0, resumed.stderr
    run = wait_for(parallax_home, run_id, lambda r: r["status"] not in ("queued", "running"), timeout_s=180,
                   what="the resumed run's end")
    assert run["status"] == "failed"
    assert run["error"].startswith(f"resume point {folder / points.RESUME_FILE} cannot be read (RuntimeError: "), \
        run["error"]
    assert "\n" not in run["error"] and "Traceback" not in run["error"]
