"""Files of a streamed set (``--decode workers``) removed while a run trains: the error a loader
supervisor raises reaches the run as one line naming the file, not the supervisor's traceback, and the
epochs already recorded stay.

    .venv/bin/python -m pytest tests/trainer_backend/datasets/test_streaming_files_gone.py -q
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader

from tests.trainer_backend.datasets.test_streaming_decode import make_jpeg_folder
from trainer_backend.datasets import DatasetError, collate_batch, prepare_data
from trainer_backend.datasets.streaming import place_decoding
from trainer_backend.supervisor.runner import engine_forkserver

pytestmark = pytest.mark.usefixtures("own_data_dir")


def gone_line(path) -> str:
    return (f"dataset path {path} is missing: it was there when the folder was listed and has been removed or moved "
            "since; put it back, or start the run again so that the folder is listed anew")


def test_a_file_removed_between_epochs_is_named_in_one_line_from_a_loader_worker(parallax_home, tmp_path):
    make_jpeg_folder(tmp_path / "jpegs", 12, 24)
    data = prepare_data(str(tmp_path / "jpegs"), image_size=16, decode="workers")
    placed, _ = place_decoding(data, torch.device("cpu"), workers=1)
    loader = DataLoader(placed.train, batch_size=4, num_workers=1, collate_fn=collate_batch,
                        multiprocessing_context=engine_forkserver(), timeout=120)
    assert sum(len(images) for images, _ in loader) == len(data.train)  # the first epoch reads every file
    gone = placed.train.paths[0]
    gone.unlink()
    with pytest.raises(DatasetError) as caught:
        list(loader)
    assert str(caught.value) == f"{gone_line(gone)} (in DataLoader worker process 0)"


def recorded_epochs(database) -> int:
    if not database.exists():
        return 0
    with contextlib.closing(sqlite3.connect(database, timeout=30)) as connection:
        with contextlib.suppress(sqlite3.OperationalError):  # not migrated yet
            return connection.execute("select count(*) from epoch_metrics where run_id = 1").fetchone()[0]
    return 0


def test_a_run_whose_files_go_after_its_first_epoch_fails_in_one_line_and_keeps_that_epoch(cli, parallax_home,
                                                                                             tmp_path):
    make_jpeg_folder(tmp_path / "jpegs", 48, 24)
    outcome = {}
    runner = threading.Thread(target=lambda: outcome.update(result=cli(
        "run", "--dataset", str(tmp_path / "jpegs"), "--decode", "workers", "--num-workers", "1", "--epochs", "4",
        "--image-size", "16", "--batch-size", "4", "--model", "resnet18")), daemon=True)
    runner.start()
    deadline = time.monotonic() + 600
    while recorded_epochs(parallax_home / "parallax.db") < 1 and runner.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    shutil.rmtree(tmp_path / "jpegs" / "a")  # every file of one class, while epoch 2 reads them
    runner.join(600)
    assert not runner.is_alive() and "result" in outcome, "the run did not end"
    exported = cli("export", "1")
    run = json.loads(exported.stdout)
    assert run["status"] == "failed", run["status"]
    error = run["error"]
    assert "\n" not in error and "Traceback" not in error and len(error) < 400, error
    assert error.startswith(f"dataset path {tmp_path / 'jpegs' / 'a'}/") and " is missing: it was there" in error
    assert error.endswith(" (in DataLoader worker process 0)"), error
    assert 1 <= len(run["epochs"]) < 4  # what was recorded before the files went stays
