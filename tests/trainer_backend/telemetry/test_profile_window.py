"""A profiled window that does not fit the first epoch never fails the run: a window that starts
past the epoch's end keeps no profile and says so, one that starts inside and runs past the end
ends with the epoch and says how many steps it kept, and a profiler that cannot export is a note.
(Where preflight can count the steps it refuses the first case before launch:
tests/trainer_backend/control/test_cli_bad_input.py, case profile-wait-past-epoch.)

A real torch.profiler on CPU and a real SQLite database.

    .venv/bin/python -m pytest tests/trainer_backend/telemetry/test_profile_window.py -q
"""

from __future__ import annotations

import pytest
import torch

from db import make_engine, profiles, store
from contract.config import RunConfig
from trainer_backend.telemetry.profiling import StepProfiler
from trainer_backend.telemetry.recorder import Recorder


def profile_epoch(out_dir, *, wait: int, warmup: int, active: int, steps: int) -> StepProfiler:
    """One epoch of ``steps`` small steps under the profiler, as ``loop.train_epoch`` and ``run_epoch`` drive it."""
    profiler = StepProfiler(wait=wait, warmup=warmup, active=active, devices=[torch.device("cpu")], rank=0,
                            world_size=1, out_dir=out_dir)
    profiler.start()
    weights = torch.ones(32, 32, requires_grad=True)
    for _ in range(steps):
        with profiler.range("forward"):
            loss = (weights @ weights).sum()
        with profiler.range("backward"):
            loss.backward()
        profiler.step()
    profiler.finish()
    return profiler


@pytest.fixture
def recorded(db_url, tmp_path):
    """Profile one epoch, move its files into a run of a real database; (run notes, profiled runs, folder)."""
    def record(*, wait: int, warmup: int, active: int, steps: int):
        engine = make_engine(db_url)
        config = RunConfig(profile=True, profile_wait=wait, profile_warmup=warmup, profile_active=active)
        run_id = store.create_run(engine, config.to_dict(), status="running")
        out_dir = tmp_path / "profile"
        profile_epoch(out_dir, wait=wait, warmup=warmup, active=active, steps=steps)
        Recorder(engine, run_id).profiles(out_dir, config)
        left = sorted(p.name for p in out_dir.iterdir())
        return store.get_run(engine, run_id).notes, profiles.profiled_runs(engine, [run_id]), left
    return record


@pytest.mark.parametrize("wait, warmup", [(20, 1), (4, 2), (3, 0)])
def test_a_window_starting_past_the_epochs_end_keeps_no_profile_and_the_run_goes_on(recorded, wait, warmup):
    # was: AssertionError "Profiler must be initialized before exporting chrome trace", the run failed
    notes, profiled, left = recorded(wait=wait, warmup=warmup, active=2, steps=3)
    assert profiled == set() and left == []
    (note,) = [n for n in notes if "kept no profile" in n]
    assert f"after 3 steps, before the profiled window's first step ({wait + warmup + 1}" in note, note
    assert "training went on unprofiled" in note
    assert not any(n.startswith("Epoch 1 was profiled") for n in notes), notes


def test_a_window_running_past_the_epochs_end_ends_with_it_and_says_how_many_steps_it_kept(recorded):
    notes, profiled, left = recorded(wait=1, warmup=1, active=5, steps=4)
    assert len(profiled) == 1 and left == []
    assert "Epoch 1 was profiled (steps 3-4); its timings include the profiler's cost." in notes, notes
    assert "The profiled window ended with the first epoch, after 2 of the 5 steps asked (--profile-active)." in notes


def test_a_window_that_fits_keeps_its_steps_and_no_note_about_the_epochs_end(recorded):
    notes, profiled, _ = recorded(wait=1, warmup=1, active=2, steps=6)
    assert len(profiled) == 1
    assert "Epoch 1 was profiled (steps 3-4); its timings include the profiler's cost." in notes, notes
    assert not any("ended with the first epoch" in n or "kept no profile" in n for n in notes), notes


def test_a_profiler_that_fails_to_export_is_a_note_not_a_failed_run(db_url, tmp_path, monkeypatch):
    # The failure is made at torch's exporter, the one part of the profiler this cannot break for real.
    def fails(self, path):
        raise RuntimeError("trace exporter broke")

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", fails)
    engine = make_engine(db_url)
    config = RunConfig(profile=True, profile_wait=0, profile_warmup=0, profile_active=1)
    run_id = store.create_run(engine, config.to_dict(), status="running")
    profile_epoch(tmp_path / "profile", wait=0, warmup=0, active=1, steps=2)
    Recorder(engine, run_id).profiles(tmp_path / "profile", config)
    notes = store.get_run(engine, run_id).notes
    assert any("kept no profile: the profiler's trace could not be exported (RuntimeError: trace exporter broke)" in n
               for n in notes), notes
    assert list((tmp_path / "profile").iterdir()) == []
