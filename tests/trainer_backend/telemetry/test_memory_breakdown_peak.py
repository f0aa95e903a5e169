"""Peak memory per device: on GPUs both what tensors took (max_memory_allocated) and what the
caching allocator held (max_memory_reserved, closer to nvidia-smi), through to the database and
the memory chart. On CPU torch.cuda's memory counters are faked at the edge.

    .venv/bin/python -m pytest tests/trainer_backend/telemetry/test_memory_breakdown_peak.py -q
"""

from __future__ import annotations

import torch

import db
from db import store
from trainer_backend.telemetry import memory_breakdown
from trainer_backend.rank import trainer
from contract.config import RunConfig
from trainer_backend.rank.strategies import Strategy
from reports import scaling
from reports import charts

MB = 2**20


def fake_cuda_peaks(monkeypatch, allocated: dict[int, int], reserved: dict[int, int]) -> None:
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: allocated[torch.device(device).index])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: reserved[torch.device(device).index])


def test_both_peaks_are_read_per_gpu_and_reserved_is_absent_on_cpu(monkeypatch):
    fake_cuda_peaks(monkeypatch, {0: 300 * MB, 1: 200 * MB}, {0: 512 * MB, 1: 256 * MB})
    gpus = [torch.device("cuda:0"), torch.device("cuda:1")]
    assert memory_breakdown.peak_memory_mb(gpus) == {"cuda:0": 300.0, "cuda:1": 200.0}
    assert memory_breakdown.peak_memory_reserved_mb(gpus) == {"cuda:0": 512.0, "cuda:1": 256.0}
    assert memory_breakdown.peak_memory_reserved_mb([torch.device("cpu")]) == {}


def test_one_process_keeps_every_device_and_an_empty_reading_needs_no_collective():
    strategy = Strategy(RunConfig())  # one CPU process: nothing to reduce across ranks
    assert trainer._gather_memory(strategy, {"cuda:0": 512.0, "cuda:1": 256.0}) == {"cuda:0": 512.0, "cuda:1": 256.0}
    assert trainer._gather_memory(strategy, {}) == {}


def test_reserved_peaks_reach_the_chart_beside_the_allocated_ones(db_url):
    engine = db.make_engine(db_url)
    config = {**RunConfig().to_dict(), "devices": ["cuda:0"]}  # stored as a GPU run records it
    run_id = store.create_run(engine, config, status="completed")
    store.log_epoch(engine, run_id, {"epoch": 1, "peak_memory_mb": {"cuda:0": 300.0},
                                     "extra": {"peak_memory_reserved_mb": {"cuda:0": 512.0}}})
    frame = scaling.memory_frame(scaling.epochs_frame(store.read_epoch_metrics(engine, [run_id])))
    assert frame[["device", "peak_memory_mb", "peak_memory_reserved_mb"]].values.tolist() == [["cuda:0", 300.0, 512.0]]
    figure = charts.memory_figure(frame)
    assert [t.name for t in figure.data] == ["cuda:0", "cuda:0 reserved"]
    db.dispose_engines()
