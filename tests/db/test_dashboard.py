"""What the dashboard reads and changes outside the pages: the run table and its filters
(``db/dashboard.py``), deleting a run with its files (``trainer_backend/control/housekeeping.py``) and
device discovery (``contract/devices.py``). Real SQLite files in tmp_path and real PostgreSQL
databases: every test that takes ``db_url`` runs on both.

    .venv/bin/python -m pytest tests/db/test_dashboard.py -q
"""

from __future__ import annotations

import os
import socket

import pytest

from db import dashboard, store
from contract import devices
from db.folders import run_folder
from trainer_backend.control.housekeeping import RunActiveError, delete_run_and_files


def config(**changes) -> dict:
    base = {"dataset": "digits", "model": "resnet18", "strategy": "single", "devices": ["cpu"], "batch_size": 128,
            "image_size": 32, "amp": "auto", "epochs": 3, "tags": []}
    base.update(changes)
    return base


def add_run(engine, *, status="completed", accs=(0.5, 0.7), images_per_s=(100.0, 120.0), **changes) -> int:
    run_id = store.create_run(engine, config(**changes), status=status)
    for epoch, (acc, ips) in enumerate(zip(accs, images_per_s), start=1):
        store.log_epoch(engine, run_id, {"epoch": epoch, "val_acc": acc, "images_per_s": ips, "epoch_time_s": 2.0,
                                          "train_time_s": 1.5})
    return run_id


@pytest.fixture
def db_url(backend_db_url):
    return backend_db_url


def test_run_table_summarises_epochs_and_reads_config_fields(engine):
    run_id = add_run(engine, strategy="ddp", devices=["cpu", "cpu"], batch_size=64, tags=["fast"])
    empty_id = add_run(engine, status="queued", accs=(), images_per_s=())
    rows = {row["id"]: row for row in dashboard.run_table(engine)}
    assert list(rows) == [empty_id, run_id]  # newest first
    row = rows[run_id]
    assert row["devices"] == ["cpu", "cpu"] and row["batch_size"] == 64 and row["epochs"] == 3
    assert row["epochs_done"] == 2 and row["best_val_acc"] == pytest.approx(0.7)
    # The epochs after the first (as every page shows it); training steps only, then with validation.
    assert row["mean_images_per_s"] == pytest.approx(120.0) and row["train_time_s"] == pytest.approx(3.0)
    assert row["epochs_time_s"] == pytest.approx(4.0)
    assert row["tags"] == ["fast"]
    assert rows[empty_id]["epochs_done"] == 0 and rows[empty_id]["best_val_acc"] is None


def test_run_table_filters_by_every_column_and_by_tag(engine):
    single = add_run(engine, tags=["baseline"])
    ddp = add_run(engine, strategy="ddp", devices=["cpu", "cpu"], tags=["scaling", "cpu"])
    failed = add_run(engine, status="failed", model="resnet50", dataset="cifar10")
    ids = lambda **f: [r["id"] for r in dashboard.run_table(engine, dashboard.RunFilters(**f))]  # noqa: E731
    assert ids(statuses=("failed",)) == [failed]
    assert ids(strategies=("ddp",)) == [ddp]
    assert ids(models=("resnet18",)) == [ddp, single]
    assert ids(datasets=("cifar10",)) == [failed]
    assert ids(tags=("baseline", "scaling")) == [ddp, single]
    assert ids(strategies=("single",), tags=("scaling",)) == []
    choices = dashboard.filter_choices(engine)
    assert choices["statuses"] == ["completed", "failed"]
    assert choices["tags"] == ["baseline", "cpu", "scaling"]


def test_single_device_baselines_match_all_like_for_like_fields(engine):
    add_run(engine)                                   # older match
    newest = add_run(engine)                          # the one to use
    add_run(engine, batch_size=64)                    # other batch
    add_run(engine, amp="off")                        # other AMP
    add_run(engine, status="failed")                  # not completed
    add_run(engine, strategy="ddp", devices=["cpu", "cpu"])  # not the baseline strategy
    wanted = [config(strategy="ddp"), config(model="resnet50")]
    assert dashboard.single_device_baselines(engine, wanted) == {("digits", "resnet18", 128, 32, "auto"): newest}


def test_tags_and_note_are_replaced_and_cleaned(engine):
    run_id = add_run(engine, tags=["old"])
    assert dashboard.set_tags(engine, run_id, [" a ", "", "b", "a"]) == ["a", "b"]
    dashboard.set_user_note(engine, run_id, "  why this run  ")
    run = store.get_run(engine, run_id)
    assert run.tags == ["a", "b"] and run.user_note == "why this run"
    with pytest.raises(LookupError):
        dashboard.set_user_note(engine, 999, "x")


def test_delete_removes_row_metrics_and_folder(engine, db_url):
    run_id = add_run(engine)
    folder = run_folder(engine, run_id)
    folder.mkdir(parents=True)
    (folder / "best.pt").write_bytes(b"weights")
    (folder / "run.log").write_text("epoch 1/1\n")
    delete_run_and_files(run_id, db_url=db_url)
    assert store.get_run(engine, run_id) is None
    assert store.read_epoch_metrics(engine, [run_id]) == []
    assert not folder.exists()
    with pytest.raises(LookupError):
        delete_run_and_files(run_id, db_url=db_url)


def test_delete_refuses_an_active_run_but_takes_a_dead_one(engine, db_url):
    alive = add_run(engine, status="running")
    store.set_process(engine, alive, pid=os.getpid(), host=socket.gethostname())  # this very process: alive
    with pytest.raises(RunActiveError, match=f"run {alive} is running: cancel it first"):
        delete_run_and_files(alive, db_url=db_url)
    assert store.get_run(engine, alive) is not None

    dead = add_run(engine, status="running")
    store.set_process(engine, dead, pid=2**22 + 1, host=socket.gethostname())  # above pid_max: never alive
    delete_run_and_files(dead, db_url=db_url)  # marked lost first, so it may go
    assert store.get_run(engine, dead) is None


def test_gpu_statuses_describe_each_gpu_or_nothing_without_nvml():
    statuses = devices.gpu_statuses()
    for index, gpu in enumerate(statuses):
        assert gpu.index == index and gpu.name and 0 <= gpu.memory_used_mb <= gpu.memory_total_mb
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        assert statuses == []  # a machine without an NVIDIA driver falls back to CPU
    assert devices.cpu_cores() >= 1
