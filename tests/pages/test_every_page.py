"""Every dashboard page through Streamlit's AppTest, on an empty database and on one with runs:
the Launch form's checks and a real launch, the Run page (live, finished, failed, lost), the
Runs table (filter, sort, edit, delete) and Compare (scaling view, like-for-like warning).

Runs are made with ``db.store`` for speed; the one launch is a real background process.
Fragments with ``run_every`` do not tick in AppTest: a second ``.run()`` stands for the tick.
Every test pins the machine it tests by faking NVML: a CPU machine unless it asks for
``two_gpu_machine``, so the tests read the same on a laptop and on a GPU workstation.

    .venv/bin/python -m pytest tests/pages/test_every_page.py -q
"""

from __future__ import annotations

import os
import re
import socket
import time

import pytest
from streamlit.testing.v1 import AppTest

from tests.support import ROOT
from tests.nvml_machines import fake_nvml, two_gpu_machine  # noqa: F401
from db import store
from db.connection import session_scope
from db.tables import EpochMetric, Run, utcnow
from db.folders import run_folder
from trainer_backend.control.lifecycle import cancel, group_members
from ui.run_notes import NOTES_LABEL

APP = str(ROOT / "app.py")
TIMEOUT_S = 90  # the first page in a process imports torch and timm
DEAD_PID = 2**22 + 1  # above Linux's pid_max: never a live process


def open_page(page: str, **session) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    for key, value in session.items():
        at.session_state[key] = value
    return at.switch_page(page).run()


def texts(elements) -> list[str]:
    return [element.value for element in elements]


def run_notes(at: AppTest) -> list[str]:
    """The lines of the Run page's Notes section, as Parallax or the page wrote them (Markdown escapes undone)."""
    [notes] = [expander for expander in at.expander if expander.label.startswith(NOTES_LABEL)]
    return [re.sub(r"\\(.)", r"\1", line.value).replace("\u2060", "") for line in notes.markdown]


def shown_status(at: AppTest) -> str:
    """The status in the Run page's badge (st.badge renders as ':color-badge[:icon: status]')."""
    badge = next(m.value for m in at.markdown if "-badge[" in m.value)
    return badge.rsplit(" ", 1)[-1].rstrip("]")


def config(**changes) -> dict:
    base = {"dataset": "digits", "model": "test_resnet", "strategy": "single", "devices": ["cpu"], "batch_size": 128,
            "image_size": 32, "amp": "auto", "epochs": 3, "tags": []}
    base.update(changes)
    return base


def add_run(engine, *, status="completed", images_per_s=(50.0, 100.0, 100.0), val_acc=(0.5, 0.8, 0.95),
            notes=None, **changes) -> int:
    n_devices = len(changes.get("devices", ["cpu"]))
    run_id = store.create_run(engine, config(**changes), status=status, notes=notes)
    for epoch, (ips, acc) in enumerate(zip(images_per_s, val_acc), start=1):
        store.log_epoch(engine, run_id, {
            "epoch": epoch, "train_loss": 1 / epoch, "val_loss": 1.2 / epoch, "train_acc": acc, "val_acc": acc,
            "epoch_time_s": 2.0, "train_time_s": 1.8, "images_per_s": ips,
            "peak_memory_mb": {f"rank{r}:cpu": 900.0 for r in range(n_devices)},
        })
    return run_id


def hold_by_this_process(engine, run_id: int) -> None:
    """Make a 'running' run look alive: its pid is this test process."""
    store.set_process(engine, run_id, pid=os.getpid(), host=socket.gethostname())


@pytest.fixture(autouse=True)
def cpu_machine(fake_nvml, monkeypatch):  # noqa: F811
    """A machine without GPUs, whatever this one has (``two_gpu_machine`` overrides it)."""
    from tests.nvml_machines import pin_cuda_count

    fake_nvml(None)
    pin_cuda_count(monkeypatch, 0)


# --- empty database -----------------------------------------------------------------------


@pytest.mark.parametrize("page, expected", [
    ("pages/launch.py", None), ("pages/run.py", "No runs yet."),
    ("pages/runs.py", "No runs yet."), ("pages/compare.py", "No runs to compare yet."),
])
def test_every_page_renders_on_an_empty_database(parallax_home, page, expected):
    at = open_page(page)
    assert not at.exception, at.exception
    if expected:
        assert expected in texts(at.info)
    else:
        assert not at.error and not launch_button(at).disabled


# --- Launch -------------------------------------------------------------------------------


def launch_button(at: AppTest):
    return next(button for button in at.button if button.label == "Launch")


def column_with(at: AppTest, label: str):
    """The innermost column holding the widget labelled ``label``: its error must be there too."""
    columns = [c for c in at.columns if any(w.label == label for w in [*c.number_input, *c.selectbox])]
    return min(columns, key=lambda c: len(list(c)))


def test_launch_defaults_are_valid_and_quick(parallax_home):
    at = open_page("pages/launch.py")
    assert at.selectbox(key="dataset").value == "digits"
    assert at.selectbox(key="model").value == "resnet18"
    assert at.radio(key="strategy").value == "single"
    assert at.number_input(key="epochs").value == 3
    assert not at.error and not launch_button(at).disabled
    assert "1,797 images · 10 classes · 8×8 px · 1 band" in texts(at.caption)
    assert "11.2 M parameters for 10 classes" in texts(at.caption)
    assert "One device takes all 128 images per step." in texts(at.caption)


def test_launch_form_starts_from_the_engines_defaults(parallax_home):
    """One source: the form's first values are RunConfig's, which the CLI's defaults are too."""
    from contract.config import RunConfig

    at = open_page("pages/launch.py")
    defaults = RunConfig()
    for name in ("image_size", "batch_size", "epochs", "lr", "weight_decay", "val_fraction", "seed", "num_workers",
                 "bn_stats_images"):
        assert at.number_input(key=name).value == getattr(defaults, name), name
    for name in ("dataset", "model", "optimizer", "amp"):
        assert at.selectbox(key=name).value == getattr(defaults, name), name


def test_launch_form_shows_each_error_next_to_its_field(parallax_home):
    at = open_page("pages/launch.py")
    at.number_input(key="epochs").set_value(0)
    at.radio(key="strategy").set_value("ddp").run()
    at.number_input(key="batch_size").set_value(5).run()

    epochs_errors = texts(column_with(at, "Epochs").error)
    assert epochs_errors == ["epochs 0 is not allowed: use a whole number from 1 to 10000"]
    batch_errors = texts(column_with(at, "Global batch size").error)
    assert len(batch_errors) == 1 and "batch_size 5" in batch_errors[0] and "2 DDP processes" in batch_errors[0]
    assert launch_button(at).disabled

    at.number_input(key="epochs").set_value(2)
    at.number_input(key="batch_size").set_value(64).run()
    assert not at.error and not launch_button(at).disabled
    assert "Global batch: each of the 2 processes takes 32 images per step." in texts(at.caption)


def test_launch_offers_the_class_folders_under_the_data_roots(parallax_home, tmp_path, monkeypatch):
    from PIL import Image

    root = tmp_path / "roots"
    for class_name in ("forest", "river"):
        (root / "tiny_set" / class_name).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (16, 12), (40 * i, 90, 20)).save(root / "tiny_set" / class_name / f"{i}.png")
    (root / ".hidden").mkdir()
    monkeypatch.setenv("PARALLAX_DATA_ROOTS", f"{root}:{tmp_path / 'missing'}")

    at = open_page("pages/launch.py")
    folder = str((root / "tiny_set").resolve())
    assert at.selectbox(key="dataset").options[-1] == f"tiny_set  ({root.resolve()})"
    at.selectbox(key="dataset").set_value(folder).run()
    assert "6 images · 2 classes · 12×16 px · 3 bands" in texts(at.caption)
    assert "parameters for 2 classes" in " ".join(texts(at.caption))
    assert not at.error and not launch_button(at).disabled


def test_launch_on_cpu_notes_that_data_parallel_is_a_pass_through(parallax_home):
    at = open_page("pages/launch.py")
    at.radio(key="strategy").set_value("dp").run()
    assert any("DataParallel on CPU is a pass-through" in text for text in texts(at.info))


def gpu_table(at: AppTest) -> list[tuple[str, str]]:
    frame = next(d.value for d in at.dataframe if "utilisation (%)" in d.value)
    return list(zip(frame["GPU"], frame["name"]))


def test_launch_on_a_gpu_machine_defaults_to_its_gpus_in_pci_order(parallax_home, two_gpu_machine):  # noqa: F811
    at = open_page("pages/launch.py")
    assert not at.exception, at.exception
    assert at.radio(key="device_kind").value == "GPUs"
    picker = at.multiselect(key="gpus_single")
    assert picker.value == [0]  # single: the first GPU
    # The fake driver lists the A6000 first, but CUDA (pinned to PCI order) numbers the 4090 (bus 3B) cuda:0.
    assert picker.options == ["cuda:0 · NVIDIA GeForce RTX 4090 · 24 GB", "cuda:1 · NVIDIA RTX A6000 · 48 GB"]
    assert gpu_table(at) == [("cuda:0", "NVIDIA GeForce RTX 4090"), ("cuda:1", "NVIDIA RTX A6000")]
    assert not at.error and not launch_button(at).disabled
    assert not [n for n in at.number_input if n.key.startswith("cpu_processes")]

    at.radio(key="strategy").set_value("ddp").run()
    assert at.multiselect(key="gpus_ddp").value == [0, 1]  # the others: every GPU
    assert "Global batch: each of the 2 processes takes 64 images per step." in texts(at.caption)
    at.radio(key="strategy").set_value("dp").run()
    assert "DataParallel splits each batch: about 64 images per GPU." in texts(at.caption)
    assert not any("pass-through" in text for text in texts(at.info))
    assert not at.error and not launch_button(at).disabled


def test_launch_on_a_gpu_machine_can_still_train_on_cpu_processes(parallax_home, two_gpu_machine):  # noqa: F811
    at = open_page("pages/launch.py")
    at.radio(key="strategy").set_value("ddp").run()
    at.radio(key="device_kind").set_value("CPU processes").run()
    assert at.number_input(key="cpu_processes_ddp").label == "CPU training processes"
    assert not [d for d in at.dataframe if "utilisation (%)" in d.value]
    assert "Global batch: each of the 2 processes takes 64 images per step." in texts(at.caption)
    assert not at.error and not launch_button(at).disabled


def test_launch_on_a_cpu_machine_offers_cpu_processes_only(parallax_home):
    at = open_page("pages/launch.py")
    at.radio(key="strategy").set_value("ddp").run()
    assert not [r for r in at.radio if r.key == "device_kind"]
    assert at.number_input(key="cpu_processes_ddp").label == "CPU training processes"


def test_launch_starts_a_real_run_opens_its_page_and_cancel_stops_it(parallax_home, engine):
    at = open_page("pages/launch.py")
    at.selectbox(key="model").set_value("test_resnet")
    at.number_input(key="epochs").set_value(1)
    at.text_input(key="tags").set_value("smoke, ui")
    at.text_area(key="note").set_value("launched from the form")
    launch_button(at).click().run()

    assert not at.exception, at.exception
    assert texts(at.title) == ["Run #1"]
    assert at.query_params["run"] in ("1", ["1"])
    run = store.get_run(engine, 1)
    assert run.config["model"] == "test_resnet" and run.config["epochs"] == 1
    assert run.tags == ["smoke", "ui"] and run.user_note == "launched from the form"
    assert run.pid and group_members(run.pid)  # a real detached supervisor

    # AppTest reruns the page it was pointed at, not the one st.switch_page went to: point it there.
    at.switch_page("pages/run.py").run()
    assert texts(at.title) == ["Run #1"]
    next(b for b in at.button if b.label == "Cancel run").click().run()
    assert store.get_run(engine, 1).status in ("queued", "running")  # asked first: Cancel opens a question
    assert any(b.label == "Cancel run #1" for b in at.button)
    # AppTest reruns the whole page for a button in a dialog, where Streamlit reruns the dialog alone: the answer
    # is given in a real browser (tests/e2e/test_browser_run_page.py); here the run is cancelled as it does.
    cancel(1)
    at.run()
    assert store.get_run(engine, 1).status == "cancelled"
    deadline = time.monotonic() + 10
    while group_members(run.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert group_members(run.pid) == []
    assert shown_status(at) == "cancelled" and texts(at.warning) == ["cancelled by the user"]


# --- Run ----------------------------------------------------------------------------------


def test_run_page_shows_a_finished_run_with_charts_notes_and_checkpoint(parallax_home, engine):
    run_id = add_run(engine, strategy="ddp", devices=["cpu", "cpu"], notes=["DDP on CPU: 2 processes on gloo"])
    folder = run_folder(engine, run_id)
    folder.mkdir(parents=True)
    (folder / "best.pt").write_bytes(b"\0" * 1024)
    (folder / "run.log").write_text("".join(f"line {i}\n" for i in range(100)))

    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.query_params["run"] = str(run_id)
    at.switch_page("pages/run.py").run()
    assert not at.exception, at.exception
    assert texts(at.title) == [f"Run #{run_id}"]
    assert len(at.get("plotly_chart")) == 5  # loss, accuracy, throughput, epoch time, memory
    assert [p.text for p in at.get("progress")] == ["Epoch 3 of 3 done", "All steps done"]
    assert "DDP on CPU: 2 processes on gloo" in run_notes(at)
    assert not at.info  # every note in the one Notes section, none standing above the numbers
    assert {m.label: m.value for m in at.metric}["Best validation accuracy"] == "95.0%"
    [checkpoint] = at.get("link_button")
    assert checkpoint.proto.label == "Download the best checkpoint (1.0 kB)"  # not "0.0 MB"
    assert checkpoint.proto.url.startswith(f"/_parallax/download/{run_id}/best.pt?expires=")
    log = at.code[0].value.splitlines()
    assert log[0] == "line 60" and log[-1] == "line 99"  # the last 40 lines


def test_run_page_counts_the_steps_a_run_skipped_for_a_nan_loss(parallax_home, engine):
    run_id = add_run(engine, on_nonfinite="skip")
    store.log_epoch(engine, run_id, {
        "epoch": 4, "train_loss": 0.2, "val_loss": 0.3, "train_acc": 0.9, "val_acc": 0.9, "epoch_time_s": 2.0,
        "train_time_s": 1.8, "images_per_s": 100.0, "peak_memory_mb": {"cpu": 900.0},
        "extra": {"nonfinite_steps": 2, "skipped_steps": 2}})
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.query_params["run"] = str(run_id)
    at.switch_page("pages/run.py").run()
    assert not at.exception, at.exception
    assert ("The training loss was NaN or infinite in 2 steps; 2 optimizer updates were skipped "
            "(--on-nonfinite skip).") in texts(at.warning)


def test_run_page_refreshes_an_active_run_and_shows_its_end(parallax_home, engine):
    run_id = add_run(engine, status="running", images_per_s=(80.0,), val_acc=(0.4,))
    hold_by_this_process(engine, run_id)
    at = open_page("pages/run.py", run_id=run_id)
    assert shown_status(at) == "running"
    assert "Epoch 1 of 3 done" in [p.text for p in at.get("progress")]
    assert any(b.label == "Cancel run" for b in at.button)

    store.log_epoch(engine, run_id, {"epoch": 2, "val_acc": 0.6, "images_per_s": 90.0, "epoch_time_s": 2.0})
    at.run()  # the fragment's tick
    assert "Epoch 2 of 3 done" in [p.text for p in at.get("progress")]

    store.set_status(engine, run_id, "failed", error="RuntimeError: boom\n\nTraceback (most recent call last):\n  ...")
    at.run()
    assert shown_status(at) == "failed"
    assert texts(at.error) == ["RuntimeError: boom"]
    assert "Traceback (most recent call last)" in at.code[0].value
    assert not any(b.label == "Cancel run" for b in at.button)


def test_run_page_never_shows_a_dead_run_as_running(parallax_home, engine):
    run_id = add_run(engine, status="running", images_per_s=(), val_acc=())
    store.set_process(engine, run_id, pid=DEAD_PID, host=socket.gethostname())
    at = open_page("pages/run.py", run_id=run_id)
    assert shown_status(at) == "lost"
    assert store.get_run(engine, run_id).status == "lost"
    assert any("is gone without recording how the run ended" in e for e in texts(at.error))


# --- Runs ---------------------------------------------------------------------------------


def table(at: AppTest):
    return at.dataframe[0]


def select_rows(at: AppTest, rows: list[int]) -> AppTest:
    at.session_state[table(at).key] = {"selection": {"rows": rows, "columns": [], "cells": []}}
    return at.run()


def test_runs_page_filters_and_sorts(parallax_home, engine):
    low = add_run(engine, val_acc=(0.2, 0.3, 0.4), tags=["baseline"])
    high = add_run(engine, strategy="ddp", devices=["cpu", "cpu"], tags=["scaling"])
    failed = add_run(engine, status="failed", model="resnet18", images_per_s=(), val_acc=())
    at = open_page("pages/runs.py")
    assert table(at).value["run"].tolist() == [failed, high, low]

    at.multiselect(key="filter_statuses").set_value(["completed"]).run()
    assert table(at).value["run"].tolist() == [high, low]
    at.multiselect(key="filter_tags").set_value(["baseline"]).run()
    assert table(at).value["run"].tolist() == [low]
    at.multiselect(key="filter_tags").set_value([]).run()
    at.selectbox(key="sort_by").set_value("Oldest first").run()
    assert table(at).value["run"].tolist() == [low, high]
    at.multiselect(key="filter_statuses").set_value([])
    at.selectbox(key="sort_by").set_value("Best validation accuracy").run()
    assert table(at).value["run"].tolist() == [high, low, failed]


def test_runs_page_edits_tags_and_note_of_the_picked_run(parallax_home, engine):
    run_id = add_run(engine, tags=["old"])
    at = select_rows(open_page("pages/runs.py"), [0])
    next(field for field in at.text_input if field.label.startswith("Tags")).set_value("fp32, baseline")
    at.text_area[0].set_value("reference for the speedups")
    next(b for b in at.get("form_submit_button") if b.label == "Save").click().run()
    run = store.get_run(engine, run_id)
    assert run.tags == ["fp32", "baseline"] and run.user_note == "reference for the speedups"
    assert table(at).value.loc[0, "tags"] == "fp32, baseline"


def test_runs_page_deletes_after_confirmation_and_refuses_active_runs(parallax_home, engine):
    done = add_run(engine)
    run_folder(engine, done).mkdir(parents=True)
    (run_folder(engine, done) / "best.pt").write_bytes(b"weights")
    active = add_run(engine, status="running")
    hold_by_this_process(engine, active)

    at = select_rows(open_page("pages/runs.py"), [0])  # the active run, newest first
    next(b for b in at.button if b.label == "Delete…").click().run()
    assert texts(at.error) == [f"Run #{active} is running: cancel it on its Run page first."]
    assert not any(b.label == "Yes, delete" for b in at.button)
    next(b for b in at.button if b.label == "Keep them").click().run()

    at = select_rows(at, [1])
    next(b for b in at.button if b.label == "Delete…").click().run()
    assert any(f"Delete #{done} for good" in w for w in texts(at.warning))
    assert store.get_run(engine, done) is not None  # nothing happens before the confirmation
    next(b for b in at.button if b.label == "Yes, delete").click().run()
    deadline = time.monotonic() + 30
    while store.get_run(engine, done) is not None and time.monotonic() < deadline:  # deleted behind the page
        time.sleep(0.05)
    assert store.get_run(engine, done) is None
    assert not run_folder(engine, done).exists()
    at.run()
    assert table(at).value["run"].tolist() == [active]


def test_runs_page_sends_picked_runs_to_compare(parallax_home, engine):
    first, second = add_run(engine), add_run(engine, strategy="ddp", devices=["cpu", "cpu"])
    at = select_rows(open_page("pages/runs.py"), [0, 1])
    next(b for b in at.button if b.label == "Compare 2 runs").click().run()
    assert texts(at.title) == ["Compare runs"]
    assert at.multiselect(key="compare_picker").value == [second, first]


# --- Compare ------------------------------------------------------------------------------


def test_compare_shows_the_scaling_view_for_like_for_like_runs(parallax_home, engine):
    single = add_run(engine, images_per_s=(50.0, 100.0, 100.0))
    ddp = add_run(engine, strategy="ddp", devices=["cpu", "cpu"], images_per_s=(60.0, 170.0, 190.0))
    at = open_page("pages/compare.py", compare_ids=[ddp, single])
    assert not at.exception, at.exception
    assert not at.warning
    speedups = {m.label: m.value for m in at.metric}
    assert speedups == {f"Speedup of #{ddp} ddp×2 test_resnet": "1.80×"}
    assert "Strategy scaling" in texts(at.subheader)
    scaling_table = at.dataframe[0].value
    assert scaling_table["efficiency"].tolist() == ["90%", "100%"]
    assert scaling_table["time to 90% val acc"].tolist() == ["6.0 s", "6.0 s"]
    assert len(at.get("plotly_chart")) == 3  # speedup, efficiency, curves
    assert sorted(at.dataframe[1].value.index) == ["devices", "strategy"]
    assert [b.label for b in at.get("download_button")] == ["Download the metrics (CSV)"]

    at.number_input(key="target_acc").set_value(0.99).run()
    assert at.dataframe[0].value["time to 99% val acc"].tolist() == ["not reached", "not reached"]


def test_compare_finds_the_baseline_in_the_database_and_warns_when_not_like_for_like(parallax_home, engine):
    add_run(engine, images_per_s=(50.0, 100.0, 100.0))  # the baseline, not picked
    ddp = add_run(engine, strategy="ddp", devices=["cpu", "cpu"], images_per_s=(60.0, 150.0, 150.0))
    other = add_run(engine, strategy="ddp", devices=["cpu", "cpu"], model="resnet18", batch_size=64)
    at = open_page("pages/compare.py", compare_ids=[ddp])
    assert {m.label: m.value for m in at.metric} == {f"Speedup of #{ddp} ddp×2 test_resnet": "1.50×"}

    at.multiselect(key="compare_picker").set_value([ddp, other]).run()
    [warning] = texts(at.warning)
    assert "not like for like" in warning
    assert f"model differs (#{ddp} test_resnet, #{other} resnet18)" in warning
    assert f"batch size differs (#{ddp} 128, #{other} 64)" in warning


# --- many runs ----------------------------------------------------------------------------


def insert_many_runs(engine, n_runs: int, n_epochs: int) -> list[int]:
    """n_runs completed runs in one transaction (the store's one-commit-per-call is slow for 500)."""
    now = utcnow()
    with session_scope(engine) as session:
        runs = []
        for i in range(n_runs):
            strategy = ("single", "ddp")[i % 2]
            cfg = config(strategy=strategy, devices=["cpu"] * (1 + i % 2), tags=[f"t{i % 7}"])
            runs.append(Run(created_at=now, status="completed", strategy=strategy, model=cfg["model"],
                            dataset=cfg["dataset"], config=cfg, notes=[], tags=cfg["tags"], user_note="",
                            world_size=1 + i % 2))
        session.add_all(runs)
        session.flush()
        session.add_all(EpochMetric(run_id=r.id, epoch=e, val_acc=0.1 * e, images_per_s=100.0 + e,
                                    epoch_time_s=2.0, peak_memory_mb={"cpu": 900.0}, created_at=now)
                        for r in runs for e in range(1, n_epochs + 1))
        return [r.id for r in runs]


def test_runs_and_compare_pages_stay_quick_with_500_runs(parallax_home, engine):
    ids = insert_many_runs(engine, 500, 10)
    open_page("pages/runs.py")  # warm: imports and the cached engine

    start = time.perf_counter()
    at = open_page("pages/runs.py")
    runs_s = time.perf_counter() - start
    assert len(table(at).value) == 50  # a page; the database counts the rest
    assert any("500 run(s) match; showing 1–50" in caption.value for caption in at.caption)

    start = time.perf_counter()
    at = open_page("pages/compare.py", compare_ids=ids[-4:])
    compare_s = time.perf_counter() - start
    assert len(at.metric) == 2
    print(f"500 runs: Runs page {runs_s:.2f} s, Compare page {compare_s:.2f} s")
    # About a second each on a quiet machine; the bound leaves room for a busy 2-core CI box.
    assert runs_s < 3.0 and compare_s < 3.0
