"""The run's folder deleted while the run trains (a clean-up script, a user tidying PARALLAX_HOME):
the run makes the folder again and goes on, says in a note what went with it and what was kept,
and its log starts again there (was: the next checkpoint failed the run with a bare "[Errno 2] No
such file or directory"). A real launched run (single and DDP on CPU), a real rmtree.

    .venv/bin/python -m pytest tests/system/test_run_folder_deleted.py -q
"""

from __future__ import annotations

import shutil

import pytest

from tests.support import SLEEPER, SLEEPER_ENV, run_dir
from tests.trainer_backend.control.test_lifecycle import launch, wait_for
from contract.storage import FolderGoneError, write_remaking_folder, writing

pytestmark = pytest.mark.processes

EPOCHS = 4


@pytest.mark.parametrize("flags", [(), ("--strategy", "ddp", "--devices", "cpu,cpu")], ids=["single", "ddp"])
def test_a_run_whose_folder_is_deleted_makes_it_again_and_goes_on(flags, parallax_home):
    # 45 steps of 32 images, each step asleep 0.05 s: an epoch lasts about 2.5 s, time enough to delete mid-run.
    run_id = launch(parallax_home, *SLEEPER, "--epochs", str(EPOCHS), "--batch-size", "32", *flags,
                    env_extra=SLEEPER_ENV)
    wait_for(parallax_home, run_id, lambda r: len(r["epochs"]) >= 1, timeout_s=240, what="epoch 1 recorded")
    folder = run_dir(parallax_home, run_id)
    shutil.rmtree(folder)
    run = wait_for(parallax_home, run_id, lambda r: r["status"] not in ("queued", "running"), timeout_s=240,
                   what="the run's end")
    assert run["status"] == "completed", run["error"]
    assert [e["epoch"] for e in run["epochs"]] == list(range(1, EPOCHS + 1))  # nothing recorded is lost
    (note,) = [n for n in run["notes"] if "was deleted while epoch" in n]
    assert f"The run's folder {folder} was deleted while epoch" in note and "made it again and went on" in note
    assert "Kept, in the database: every epoch's metrics" in note
    log = (folder / "run.log").read_text()  # the folder is back, and the lines printed after it went are in it
    assert f"epoch {EPOCHS}/{EPOCHS}" in log and f"run_id={run_id} status=completed" in log, log


def test_a_file_written_into_a_deleted_folder_is_one_line_naming_the_folder(tmp_path):
    folder = tmp_path / "run-7"
    with pytest.raises(FolderGoneError) as raised:
        with writing(folder / "best.pt", "checkpoint") as handle:
            handle.write(b"never")
    assert str(raised.value) == (f"cannot write checkpoint {folder / 'best.pt'}: its folder {folder} was deleted "
                                 "while it was in use; what was recorded in the database is kept")


@pytest.mark.parametrize("when", ["before", "during"])
def test_a_checkpoint_whose_folder_goes_before_or_during_its_write_makes_it_again(tmp_path, when):
    # As a run's best.pt or resume point is written just after its epoch is recorded, the moment a
    # clean-up that waited for that record may pick.
    folder = tmp_path / "run-7"
    folder.mkdir()
    (folder / "rank0.pid").write_text("1")
    if when == "before":
        shutil.rmtree(folder)
    tries = []

    def write(handle):
        tries.append(handle.name)
        if when == "during" and len(tries) == 1:
            shutil.rmtree(folder)
        handle.write(b"weights")

    write_remaking_folder(folder / "best.pt", "checkpoint", write)
    assert (folder / "best.pt").read_bytes() == b"weights"
    assert len(tries) == (1 if when == "before" else 2)
    assert not (folder / "rank0.pid").exists()  # what tells the run, at its epoch's end, that the folder went
