"""The SDK's surface without a process of its own: what log accepts and refuses, the W&B names it does not
have, run.config, and the background writer's retries and its one line about what it could not write."""

from __future__ import annotations

import time

import pytest

import parallax
from parallax.ranks import RankInfo, group_key, rank_info
from parallax.script_run import Config
from parallax.values import as_step, as_values
from parallax.writer import BackgroundWriter


@pytest.mark.parametrize("name", ["watch", "Table", "Image", "save", "alert", "Histogram", "log_artifact", "config"])
def test_unsupported_wandb_names_raise_naming_what_there_is(name):
    with pytest.raises(NotImplementedError, match=rf"parallax\.{name} is not supported: .*There is: parallax\.init"):
        getattr(parallax, name)


def test_an_unknown_name_is_an_attribute_error_and_init_refuses_unknown_arguments():
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        parallax.nonsense  # noqa: B018
    with pytest.raises(NotImplementedError, match="does not take entity, reinit"):
        parallax.init(project="p", entity="me", reinit=True)


@pytest.mark.parametrize("arguments, message", [
    ({"mode": "cloud"}, "mode='cloud' is not one of online, offline, disabled"),
    ({"resume": "auto"}, "resume='auto' is not one of never, allow, must"),
    ({"resume": "allow"}, "needs the id of the run to resume"),
    ({"tags": "a,b"}, "tags is a list of strings"),
    ({"config": [1, 2]}, "config is a dict"),
])
def test_init_refuses_bad_arguments_in_one_line(arguments, message):
    with pytest.raises((ValueError, TypeError), match=message):
        parallax.init(project="p", **arguments)


def test_log_takes_numbers_and_flattens_nested_dicts():
    numpy = pytest.importorskip("numpy")
    assert as_values({"a": 1, "b": True, "c": numpy.float32(0.5), "d": {"e": 2.0}}) == \
        {"a": 1.0, "b": 1.0, "c": 0.5, "d/e": 2.0}


@pytest.mark.parametrize("data, message", [
    ({"loss": "high"}, "'loss' is str 'high'"),
    ({"loss": None}, "'loss' is NoneType"),
    ({"loss": [1, 2]}, "'loss' is a list, not a number"),
    ({1: 2.0}, "metric names are strings"),
    ([("loss", 1.0)], "takes a dict"),
])
def test_log_refuses_what_is_not_a_number_naming_the_key(data, message):
    with pytest.raises(TypeError, match=message):
        as_values(data)


def test_steps_are_whole_numbers_from_zero():
    assert as_step(3) == 3
    with pytest.raises(TypeError, match="step=1.5 is not a whole number"):
        as_step(1.5)
    with pytest.raises(ValueError, match="step=-1 is negative"):
        as_step(-1)


def test_a_disabled_run_counts_steps_keeps_its_summary_and_writes_nothing(parallax_home):
    with parallax.init(project="p", name="n", config={"lr": 0.1}, mode="disabled") as run:
        parallax.log({"loss": 2.0})
        parallax.log({"loss": 1.0}, step=10)
        run.log({"loss": 0.5})
        assert run._next_step == 12 and run.summary == {"loss": 0.5}
        run.config.batch_size = 32
        assert run.config == {"lr": 0.1, "batch_size": 32} and run.config.lr == 0.1
    assert parallax.run() is None
    assert not any(parallax_home.iterdir())  # no database was opened
    with pytest.raises(RuntimeError, match="after the run ended"):
        run.log({"loss": 0.1})


class DeviceScalar:
    """A one-element CUDA tensor at the point that matters: reading it on the host (``float``) waits for the
    GPU's queued work. It counts its reads and the thread that made each."""

    def __init__(self, value: float):
        self.value, self.read_by = value, []

    def __float__(self) -> float:
        import threading

        self.read_by.append(threading.current_thread().name)
        return self.value


def test_a_tensor_is_read_once_as_log_is_called_on_the_calling_thread(parallax_home):
    """As W&B does (and docs/OWN_SCRIPT.md says): log reads a tensor's value at the call, on the training
    thread, once; a CUDA tensor's read waits for the GPU there. Read later in the writer thread, a tensor the
    script goes on to change in place would be stored with a later value."""
    import threading

    loss = DeviceScalar(0.25)
    with parallax.init(project="p", mode="disabled") as run:
        parallax.log({"loss": loss})
        assert loss.read_by == [threading.current_thread().name] and run.summary == {"loss": 0.25}


def test_config_changes_are_taken_once():
    config = Config({"a": 1})
    assert config.take_change() is None
    config["b"] = 2
    config.update(c=3)
    assert config.take_change() == {"a": 1, "b": 2, "c": 3} and config.take_change() is None
    with pytest.raises(AttributeError, match="run.config has no 'z'"):
        config.z  # noqa: B018


class FlakySink:
    """Refuses its first ``failures`` writes, as a database locked by another process does."""

    def __init__(self, failures: int):
        self.failures, self.rows = failures, []

    def write(self, entries):
        if self.failures:
            self.failures -= 1
            raise RuntimeError("database is locked")
        self.rows += entries

    def tick(self):
        pass


def test_the_writer_keeps_what_a_failed_write_held_and_writes_it_in_order():
    sink = FlakySink(failures=2)
    writer = BackgroundWriter(sink, flush_s=1000)
    for step in range(5):
        writer.put((step, 0.0, {"loss": 1.0}))
    assert not writer.flush() and not writer.flush()
    writer.put((5, 0.0, {"loss": 1.0}))
    assert writer.flush()
    assert [entry[0] for entry in sink.rows] == [0, 1, 2, 3, 4, 5]
    assert writer.close(1.0) == (0, None)


class SlowSink:
    """Takes every write, each after ``delay_s``: a store slower than the script logs."""

    def __init__(self, delay_s: float):
        self.delay_s, self.rows, self.largest_batch = delay_s, [], 0

    def write(self, entries):
        time.sleep(self.delay_s)
        self.rows += entries
        self.largest_batch = max(self.largest_batch, len(entries))

    def tick(self):
        pass


def test_a_writer_that_falls_behind_makes_log_wait_and_loses_nothing():
    """Back-pressure: logging far faster than the store takes it stores every value, holds at most twice
    the queue in memory, and counts the time log waited."""
    sink = SlowSink(delay_s=0.02)
    writer = BackgroundWriter(sink, flush_s=1000, max_pending=50)
    writer.start()
    for step in range(2_000):
        writer.put((step, 0.0, {"loss": 1.0, "lr": 0.1}))
        assert writer.pending() <= 2 * writer.max_pending
    assert writer.close(5.0) == (0, None)
    assert [entry[0] for entry in sink.rows] == list(range(2_000)) and writer.refused_points == 0
    assert writer.waits > 0 and writer.waited_s > 0.02 and sink.largest_batch <= 2 * writer.max_pending
    assert writer.wait_record() == {"waited_s": round(writer.waited_s, 3), "waits": writer.waits}


def test_log_stops_waiting_only_once_the_store_has_refused_every_write_for_the_give_up_time():
    writer = BackgroundWriter(FlakySink(failures=10**6), flush_s=0.05, max_pending=3, give_up_s=0.3)
    writer.start()
    started = time.monotonic()
    for step in range(8):
        writer.put((step, 0.0, {"loss": 1.0, "lr": 0.1}))
    assert time.monotonic() - started >= 0.3  # training waited for the store before going on
    unwritten, why = writer.close(0.3)
    assert unwritten == 16 and writer.refused_points > 0  # every value counted: held and refused
    assert "RuntimeError: database is locked" in why
    assert f"{writer.refused_points} could not be held: the store refused every write for 0.3 s" in why


def test_a_writer_without_its_thread_writes_for_the_caller_when_full():
    sink = FlakySink(failures=0)
    writer = BackgroundWriter(sink, flush_s=1000, max_pending=3)  # never started, as in a forked child
    for step in range(10):
        writer.put((step, 0.0, {"loss": 1.0}))
    assert [entry[0] for entry in sink.rows] == list(range(9)) and writer.pending() == 1
    assert writer.close(1.0) == (0, None) and len(sink.rows) == 10


def test_ranks_of_one_job_share_a_key_and_other_jobs_do_not(monkeypatch):
    monkeypatch.delenv("PARALLAX_RUN_GROUP", raising=False)
    job = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}
    info = rank_info(job)
    assert info == RankInfo(rank=1, local_rank=1, world_size=2, node=0) and not info.is_main
    assert group_key(info, job) == group_key(RankInfo(0, 0, 2, 0), {**job, "RANK": "0"})
    assert group_key(info, job) != group_key(info, {**job, "MASTER_PORT": "29512"})
    torchrun = {**job, "TORCHELASTIC_RUN_ID": "job-7"}
    assert group_key(info, torchrun) != group_key(info, {**torchrun, "TORCHELASTIC_RUN_ID": "job-8"})
    assert group_key(RankInfo(0, 0, 1, 0), {}) == ""  # one process: no group
    with pytest.raises(ValueError, match="RANK='x' is not a whole number"):
        rank_info({"RANK": "x"})


def test_profile_waits_for_the_current_gpu_where_each_task_sees_one(engine, monkeypatch):
    """``srun --gpus-per-task=1``: a task's one visible GPU is cuda:0 whatever its LOCAL_RANK (3 here). The
    profile's phases wait for that GPU at their end, not for a cuda:3 that does not exist; the window is stored
    as rank 3's. (The CUDA edge is faked: one visible GPU, whose synchronize refuses another ordinal.)"""
    from types import SimpleNamespace

    import torch

    from contract.config import RunConfig
    from db import profiles, store
    from parallax import endings
    from parallax.profile_window import profile

    waited = []

    def synchronize(device=None):
        index = torch.device(device).index if device is not None else 0
        if index >= torch.cuda.device_count():
            raise RuntimeError("CUDA error: invalid device ordinal")
        waited.append(index)

    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    run_id = store.create_run(engine, RunConfig().to_dict(), status="running")
    run = SimpleNamespace(mode="online", run_id=run_id, info=rank_info({"RANK": "3", "LOCAL_RANK": "3",
                                                                         "WORLD_SIZE": "4"}), _engine=engine)
    monkeypatch.setattr(endings, "current", lambda: run)
    with profile(wait=0, warmup=0, active=2) as prof:
        for _ in range(2):
            with prof.range("forward"):
                torch.ones(64).sum()
            prof.step()
    assert len(waited) >= 2 and set(waited) == {0}  # each phase's end (and torch.profiler's own stop)
    assert profiles.profiled_runs(engine, [run_id]) == {run_id}
    assert [trace["rank"] for trace in profiles.list_traces(engine, run_id)] == [3]
