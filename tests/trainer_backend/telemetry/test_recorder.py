"""One recorder holds every database write of a rank: what it writes, how it waits out another
process's lock, the recorder of a rank that does not record (it writes nothing), and which one
``trainer.main`` hands each rank. A real SQLite file each; the lock is a real second connection
holding ``BEGIN EXCLUSIVE``."""

from __future__ import annotations

import inspect
import pickle
import sqlite3
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from sqlalchemy import select

from db import make_engine, series, store
from db.connection import DatabaseLockedError
from db.tables import StepMetric
from db.recorded_by import parallax_version
from contract.config import RunConfig
from trainer_backend.rank import trainer
from trainer_backend.telemetry.recorder import NoRecorder, Recorder

EPOCH_ROW = {"epoch": 1, "train_loss": 2.0, "train_acc": 0.25, "val_loss": 1.5, "val_acc": 0.5, "epoch_time_s": 3.0,
             "train_time_s": 2.5, "images_per_s": 100.0, "lr": 0.1, "peak_memory_mb": {"cpu": 12.0},
             "extra": {"t_end_s": 2.6}}


@pytest.fixture
def run_row(db_url):
    engine = make_engine(db_url)
    return engine, store.create_run(engine, RunConfig().to_dict(), status="running")


def locked(engine) -> sqlite3.Connection:
    """Another connection holding the database's write lock until it commits."""
    holder = sqlite3.connect(engine.url.database, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    return holder


def timed(call) -> float:
    started = time.monotonic()
    call()
    return time.monotonic() - started


def test_the_recorder_writes_an_epoch_its_progress_notes_and_measurements(run_row, capsys):
    engine, run_id = run_row
    recorder = Recorder(engine, run_id, echo=True)
    recorder.epoch(1, EPOCH_ROW, "epoch 1/2  the line")
    recorder.progress(1, 5, 10)
    recorder.notes(["first", None, "", "first", "second"])  # each note once; nothing for None or empty
    recorder.measurements({"effective_batch": 64})
    recorder.confusion(1, {"epoch": 1, "matrix": [[1]]})
    recorder.step_points([{"epoch": 1, "step": 1, "t_s": 0.5, "train_loss": 2.0, "images_per_s": 90.0, "lr": 0.1}],
                         window_s=1.0)
    (epoch,) = store.read_epoch_metrics(engine, [run_id])
    assert {k: epoch[k] for k in ("epoch", "train_loss", "val_acc", "images_per_s", "peak_memory_mb")} == {
        "epoch": 1, "train_loss": 2.0, "val_acc": 0.5, "images_per_s": 100.0, "peak_memory_mb": {"cpu": 12.0}}
    run = store.get_run(engine, run_id)
    assert (run.progress_epoch, run.progress_step, run.progress_total_steps) == (1, 5, 10)
    assert run.notes == ["first", "second"]
    assert run.measurements == {"effective_batch": 64, "confusion": {"epoch": 1, "matrix": [[1]]},
                                "parallax_version": parallax_version()}
    assert [p["step"] for p in series.read_steps(engine, [run_id], max_points=None)] == [1]
    assert capsys.readouterr().out == "epoch 1/2  the line\n"  # echo prints the epoch's line to the log


def test_progress_is_written_at_most_once_an_interval_and_at_an_epochs_last_step(run_row):
    engine, run_id = run_row
    recorder = Recorder(engine, run_id, progress_interval_s=60.0)
    recorder.progress(1, 1, 10)
    recorder.progress(1, 2, 10)  # too soon: skipped
    assert store.get_run(engine, run_id).progress_step == 1
    recorder.progress(1, 10, 10)  # the epoch's last step is always written
    assert store.get_run(engine, run_id).progress_step == 10


def test_a_locked_database_makes_the_recorder_back_off_and_must_keep_writes_wait(db_url, monkeypatch):
    monkeypatch.setenv("PARALLAX_DB_LOCK_WAIT_S", "1")  # must-keep writes wait 1 s; skippable ones 0.2 s
    engine = make_engine(db_url)
    run_id = store.create_run(engine, RunConfig().to_dict(), status="running")
    recorder = Recorder(engine, run_id, progress_interval_s=0.0)
    rows = [{"epoch": 1, "step": 1, "t_s": 0.5, "train_loss": 2.0, "images_per_s": 90.0, "lr": 0.1}]
    holder = locked(engine)
    try:
        # A progress update waits for the lock once, then is not tried again for 2 s: no wait per step.
        assert timed(lambda: recorder.progress(1, 1, 10)) >= 0.15
        assert max(timed(lambda step=step: recorder.progress(1, step, 10)) for step in range(2, 6)) < 0.1
        # Step points wait their short window once, say so, and then wait their turn.
        with pytest.raises(DatabaseLockedError, match="could not record step points"):
            recorder.step_points(rows, window_s=0.5)
        started = time.monotonic()
        assert recorder.step_points(rows, window_s=0.5) is False
        assert time.monotonic() - started < 0.1
        # An epoch waits out the lock for PARALLAX_DB_LOCK_WAIT_S, then fails the run naming what it lost.
        started = time.monotonic()
        with pytest.raises(DatabaseLockedError) as failure:
            recorder.epoch(3, {**EPOCH_ROW, "epoch": 3})
        assert time.monotonic() - started >= 0.9
        assert str(failure.value).startswith("could not record epoch 3: the database stayed locked by another "
                                             "process for 1 s (PARALLAX_DB_LOCK_WAIT_S sets how long to wait)")
        # A lock released within the wait delays the epoch and loses nothing.
        threading.Timer(0.4, lambda: holder.execute("COMMIT")).start()
        recorder.epoch(4, {**EPOCH_ROW, "epoch": 4})
    finally:
        if holder.in_transaction:
            time.sleep(0.5)
        if holder.in_transaction:
            holder.execute("COMMIT")
        holder.close()
    assert [e["epoch"] for e in store.read_epoch_metrics(engine, [run_id])] == [4]
    assert store.get_run(engine, run_id).progress_step is None  # every progress try found the lock
    # Once the lock is gone the next progress write lands, after its pause.
    time.sleep(2.0)
    recorder.progress(1, 7, 10)
    assert store.get_run(engine, run_id).progress_step == 7


def test_the_no_op_recorder_writes_nothing(run_row, tmp_path):
    engine, run_id = run_row
    before = store.export_run(engine, run_id)
    recorder = NoRecorder()
    recorder.epoch(1, EPOCH_ROW, "a line")
    recorder.progress(1, 5, 10)
    recorder.notes(["a note"])
    recorder.measurements({"effective_batch": 64})
    recorder.once_per_run(lambda: pytest.fail("a rank that does not record works out no run figures"))
    recorder.confusion(1, {"matrix": [[1]]})
    recorder.compile_time(1.0, "a compile note")
    recorder.step_points([{"epoch": 1, "step": 1, "t_s": 0.5}], window_s=1.0)
    recorder.checkpoint(tmp_path / "best.pt", {"model": {}})
    recorder.log_incomplete(OSError(28, "No space left on device"))
    assert store.export_run(engine, run_id) == before
    with engine.connect() as connection:
        assert connection.execute(select(StepMetric)).first() is None
    assert not (tmp_path / "best.pt").exists()


def test_the_no_op_recorder_has_every_method_of_the_recorder_with_the_same_parameters():
    def methods(cls) -> dict:
        return {name: list(inspect.signature(member).parameters) for name, member in vars(cls).items()
                if inspect.isfunction(member) and not name.startswith("_")}

    assert methods(NoRecorder) == methods(Recorder)


class FakeStrategy:
    torn_down = False

    def teardown(self) -> None:
        self.torn_down = True


@pytest.mark.parametrize(("rank", "kind"), [(0, Recorder), (1, NoRecorder)])
def test_main_gives_the_recording_rank_the_recorder_and_any_other_rank_the_no_op(run_row, monkeypatch, rank, kind):
    engine, run_id = run_row
    spec = trainer.RankSpec(RunConfig(), rank, run_id, str(engine.url), echo=False, folder_name=f"run-{run_id}")
    # A spawned rank gets the spec pickled and does not validate its config again.
    monkeypatch.setattr(RunConfig, "__post_init__", lambda self: pytest.fail("the config was validated again"))
    spec = pickle.loads(pickle.dumps(spec))
    strategy = FakeStrategy()
    given = {}
    monkeypatch.setattr(trainer, "build", lambda spec, folder: SimpleNamespace(spec=spec, strategy=strategy))
    monkeypatch.setattr(trainer, "train", lambda built, recorder: given.update(recorder=recorder))
    trainer.main(spec)
    assert type(given["recorder"]) is kind and given["recorder"].writes is (rank == 0)
    if rank == 0:
        assert given["recorder"].run_id == run_id
    assert strategy.torn_down


def test_main_tears_the_strategy_down_and_leaves_a_failure_note_when_training_fails(run_row, monkeypatch):
    engine, run_id = run_row
    spec = trainer.RankSpec(RunConfig(), 1, run_id, str(engine.url), echo=False, folder_name=f"run-{run_id}")
    strategy = FakeStrategy()
    monkeypatch.setattr(trainer, "build", lambda spec, folder: SimpleNamespace(spec=spec, strategy=strategy))

    def train(built, recorder):
        raise RuntimeError("a collective failed")

    monkeypatch.setattr(trainer, "train", train)
    with pytest.raises(RuntimeError, match="a collective failed"):
        trainer.main(spec)
    assert strategy.torn_down
    folder = trainer.open_run_folder(spec)
    (failure,) = trainer.read_rank_failures(folder)
    assert (failure["rank"], failure["type"], failure["message"]) == (1, "RuntimeError", "a collective failed")
    assert (folder / "rank1.pid").exists()


def test_a_step_recorder_keeps_its_points_through_a_lock_and_writes_them_after(db_url, monkeypatch):
    """The step points go through the recorder too: refused while locked, kept, written with the next write."""
    from trainer_backend.telemetry.steps import StepRecorder

    monkeypatch.setenv("PARALLAX_DB_LOCK_WAIT_S", "1")
    engine = make_engine(db_url)
    run_id = store.create_run(engine, RunConfig().to_dict(), status="running")
    recorder = StepRecorder(Recorder(engine, run_id), time.time(), min_interval_s=0.0, flush_s=0.0)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 1)), batch_size=1)
    recorder.start_epoch(1, loader, torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1))
    holder = locked(engine)
    try:
        for step in (1, 2):
            recorder.loss(torch.tensor(1.0))
            recorder.step(step, 4)
    finally:
        holder.execute("COMMIT")
        holder.close()
    assert recorder.written == 0 and recorder._unwritten  # refused, kept
    for step in (3, 4):
        recorder.loss(torch.tensor(1.0))
        recorder.step(step, 4)
    recorder.end_epoch()
    recorder.finish()
    assert recorder.written == 4 and recorder.dropped == 0
