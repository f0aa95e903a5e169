"""Per-step series, system samples and energy per image.

One real ddp run on two CPU processes records a point per step and samples both ranks several
times a second, while this test reads the same processes through psutil beside it. GPUs and
RAPL counters that this machine lacks are exercised at the edge: the fake NVML and a powercap
folder written in a temporary directory.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch
from sqlalchemy import select
from torch.utils.data import DataLoader, TensorDataset

from tests.support import ROOT, leave_as_a_rank, run_cli, run_world
from tests.nvml_machines import cpu_machine, fake_nvml  # noqa: F401

from db import make_engine, store, system_metrics
from db.connection import LockBackoff
from db.tables import StepMetric
from contract.config import RunConfig
from trainer_backend.telemetry.energy import EnergyMeter, RaplPackages
from trainer_backend.telemetry.job_energy import EnergyPart, JobEnergy, combine
from trainer_backend.telemetry.sampler import SystemSampler
from trainer_backend.telemetry.recorder import Recorder
from trainer_backend.telemetry.steps import StepRecorder, step_images

SAMPLE_S = 0.2
RUN_TIMEOUT_S = 240
MB = 2**20

# cuda:0 is the lower PCI bus id (3B), listed second on purpose, as in nvml_machines.
METERED_GPUS = [
    {"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-aaaa0000-0000-0000-0000-000000000001", "bus_id": "00000000:AF:00.0",
     "memory_total_mb": 40960, "memory_used_mb": 3000, "utilization_pct": 97, "power_w": 300.0,
     "temperature_c": 70, "sm_clock_mhz": 1410},
    {"name": "Tesla P100-PCIE-16GB", "uuid": "GPU-bbbb0000-0000-0000-0000-000000000002", "bus_id": "00000000:3B:00.0",
     "memory_total_mb": 16280, "memory_used_mb": 1000, "utilization_pct": 40, "power_w": 100.0,
     "temperature_c": 50, "sm_clock_mhz": 1189, "energy_counter": False},  # Pascal: no energy counter
]


def rss_with_children_mb(pid: int) -> float:
    process = psutil.Process(pid)
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            pass
    return total / MB


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """A one-epoch ddp run on cpu,cpu sampled every 0.2 s with a point per step, and psutil's
    readings of its ranks taken beside it: (home, export, steps, samples, readings)."""
    home = tmp_path_factory.mktemp("steps-home")
    env = {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1",
           "PARALLAX_SAMPLE_S": str(SAMPLE_S), "PARALLAX_STEP_POINT_S": "0.001"}
    env.pop("PARALLAX_DB_URL", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "trainer_backend", "run", "--dataset", "digits", "--model", "test_resnet",
         "--image-size", "16", "--devices", "cpu,cpu", "--batch-size", "64", "--strategy", "ddp", "--epochs", "1"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    readings: list[dict] = []  # {"t": unix time, "ranks": {rank: rss_mb}, "host_mb": float}
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(process.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while process.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"the run did not end within {RUN_TIMEOUT_S} s:\n{''.join(output)}")
            ranks = {}
            for pid_file in home.glob("runs/*/run-*/rank*.pid"):
                try:
                    rss_mb = rss_with_children_mb(int(pid_file.read_text()))
                except (OSError, ValueError, psutil.Error):
                    continue
                if rss_mb > 0:  # a rank that has exited (not yet reaped) holds nothing: not a reading
                    ranks[int(pid_file.stem.removeprefix("rank"))] = rss_mb
            memory = psutil.virtual_memory()
            readings.append({"t": time.time(), "ranks": ranks, "host_mb": (memory.total - memory.available) / MB})
            time.sleep(0.1)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        reader.join(10)
    assert process.returncode == 0, "".join(output)
    exported = run_cli("export", "1", home=home)
    assert exported.returncode == 0, exported.stderr
    run = json.loads(exported.stdout)
    engine = make_engine(f"sqlite:///{home / 'parallax.db'}")
    with engine.connect() as connection:
        steps = connection.execute(select(StepMetric).order_by(StepMetric.step)).mappings().all()
    samples = system_metrics.read_samples(engine, [run["run_id"]])
    return home, run, [dict(s) for s in steps], samples, readings


def started_at_s(run: dict) -> float:
    from datetime import datetime

    return datetime.fromisoformat(run["started_at"]).timestamp()


def test_ddp_records_a_step_point_per_step(ddp_run):
    _, run, steps, _, _ = ddp_run
    assert run["status"] == "completed"
    epoch = run["epochs"][0]
    # 1,437 images over 2 ranks (719 each, padded) in batches of 32: 23 steps.
    assert [s["step"] for s in steps] == list(range(1, 24))
    assert {s["epoch"] for s in steps} == {1}
    assert all(s["lr"] == pytest.approx(1e-3) for s in steps)
    assert all(math.isfinite(s["train_loss"]) and s["train_loss"] > 0 for s in steps)
    assert all(s["images_per_s"] > 0 for s in steps)
    times = [s["t_s"] for s in steps]
    assert times == sorted(times) and 0 < times[0] and times[-1] <= epoch["extra"]["t_end_s"] + 0.5
    # The loss falls over the epoch, as the epoch's own figure says it trained.
    assert sum(s["train_loss"] for s in steps[-5:]) < sum(s["train_loss"] for s in steps[:5])
    assert any("rank 0's training loss" in note for note in run["notes"])


def test_ddp_samples_both_ranks_every_interval(ddp_run):
    _, run, steps, samples, _ = ddp_run
    training = [s for s in samples if steps[0]["t_s"] - 0.5 <= s["t_s"] <= run["epochs"][0]["extra"]["t_end_s"]]
    # As many samples as the run lasted intervals (half of them at least, on 2 busy cores); how many that is
    # depends on the machine's speed (9 once, in 1.8 s, on a loaded machine), so no fixed count.
    span = samples[-1]["t_s"] - samples[0]["t_s"]
    assert len(samples) >= 5 and len(samples) >= span / (2 * SAMPLE_S) and training, (len(samples), span)
    gaps = sorted(b["t_s"] - a["t_s"] for a, b in zip(samples, samples[1:]))
    assert SAMPLE_S * 0.75 <= gaps[len(gaps) // 2] <= SAMPLE_S * 2  # 2 busy cores: allow a late sample
    for sample in training:
        assert [p["rank"] for p in sample["processes"]] == [0, 1]
        assert all(p["rss_mb"] > 50 for p in sample["processes"])
        assert sample["gpus"] == []  # no NVML here
        assert 0 <= sample["host_cpu_pct"] <= 100
    # While training, the ranks use the CPU.
    assert max(sum(p["cpu_pct"] for p in s["processes"]) for s in training) > 20


def test_samples_match_psutil_readings_beside_them(ddp_run):
    _, run, _, samples, readings = ddp_run
    start = started_at_s(run)
    both = [dict(r, t_s=r["t"] - start) for r in readings if len(r["ranks"]) == 2]
    matched = 0
    for sample in samples:
        if len(sample["processes"]) != 2:
            continue
        # The psutil readings just before and just after the sample bracket it: resident memory
        # can grow by 100 MB in a tenth of a second while a rank starts, so the sample must lie
        # between them (within a tolerance), not beside either one.
        before = [r for r in both if sample["t_s"] - SAMPLE_S / 2 <= r["t_s"] <= sample["t_s"]]
        after = [r for r in both if sample["t_s"] <= r["t_s"] <= sample["t_s"] + SAMPLE_S / 2]
        if not before or not after:
            continue
        matched += 1
        bracket = (before[-1], after[0])
        for process in sample["processes"]:
            low, high = sorted(r["ranks"][process["rank"]] for r in bracket)
            tolerance = max(40.0, 0.2 * low)
            assert low - tolerance <= process["rss_mb"] <= high + tolerance, (process, bracket)
        low, high = sorted(r["host_mb"] for r in bracket)
        assert low - max(400.0, 0.1 * low) <= sample["host_memory_mb"] <= high + max(400.0, 0.1 * high)
    assert matched >= 3, f"only {matched} of {len(samples)} samples fell between two psutil readings"


@pytest.mark.skipif(RaplPackages().domains != [], reason="this machine's RAPL counters are readable")
def test_energy_is_null_with_a_reason_without_counters(ddp_run):
    _, run, _, _, _ = ddp_run
    extra = run["epochs"][0]["extra"]
    assert extra["energy_j_per_image"] is None and extra["energy_j"] == {}
    assert any(note.startswith("Energy per image is not recorded") and "RAPL" in note for note in run["notes"])


# --- the parts on their own: real SQLite, a fake powercap folder and the fake NVML at the edge ---


@pytest.fixture
def run_row(db_url):
    engine = make_engine(db_url)
    return engine, store.create_run(engine, RunConfig().to_dict(), status="running")


def write_rapl(root: Path, uj: dict[str, int], max_uj: int = 1_000_000) -> None:
    for name, value in uj.items():
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "name").write_text("core\n" if name.count(":") == 2 else f"package-{name[-1]}\n")
        (folder / "energy_uj").write_text(f"{value}\n")
        (folder / "max_energy_range_uj").write_text(f"{max_uj}\n")


def test_rapl_packages_are_read_across_a_wrap(tmp_path, cpu_machine):
    write_rapl(tmp_path, {"intel-rapl:0": 900_000, "intel-rapl:0:0": 5, "intel-rapl:1": 100})
    meter = EnergyMeter.open([], powercap_dir=tmp_path)
    assert meter.complete and meter.note() is None
    meter.start()
    write_rapl(tmp_path, {"intel-rapl:0": 100_000, "intel-rapl:1": 2_000_100})  # package 0 wrapped
    meter.tick()
    write_rapl(tmp_path, {"intel-rapl:0": 300_000, "intel-rapl:1": 3_000_100})
    joules = meter.stop()
    # package 0: 0.1 J to the wrap, 0.1 J after it, 0.2 J more; package 1: 3 J. The core domain is inside the package.
    assert joules == {"cpu_package": pytest.approx(3.4)}
    assert meter.per_image(joules, 17) == pytest.approx(3.4 / 17)


def test_a_counter_that_fails_mid_run_is_noted_once_and_nulls_energy_from_then_on(tmp_path, cpu_machine):
    write_rapl(tmp_path, {"intel-rapl:0": 1_000})
    meter = EnergyMeter.open([], powercap_dir=tmp_path)
    assert meter.note() is None and meter.take_notes() == []
    meter.start()
    (tmp_path / "intel-rapl:0" / "energy_uj").unlink()  # the counter goes away during the run
    joules = meter.stop()
    assert meter.per_image(joules, 100) is None
    (note,) = meter.take_notes()
    assert note.startswith("Energy per image is not recorded from this epoch on: cpu_package: its reading failed "
                           "during the run (FileNotFoundError")
    assert meter.take_notes() == []  # said once


def test_unreadable_or_absent_rapl_gives_no_figure_and_says_why(tmp_path, cpu_machine):
    absent = EnergyMeter.open([], powercap_dir=tmp_path / "missing")
    assert not absent.complete and absent.per_image({}, 100) is None
    assert "does not exist" in absent.note() and absent.note().startswith("Energy per image is not recorded")
    # Root reads any file whatever its mode; a folder in the counter's place fails the read the same way.
    (tmp_path / "intel-rapl:0" / "energy_uj").mkdir(parents=True)
    (tmp_path / "intel-rapl:0" / "max_energy_range_uj").write_text("1000\n")
    unreadable = EnergyMeter.open([], powercap_dir=tmp_path)
    assert unreadable.sources == [] and "RAPL is not readable" in unreadable.note()
    unreadable.start()
    assert unreadable.per_image(unreadable.stop(), 100) is None


def test_gpu_energy_from_the_counter_or_from_integrated_power(tmp_path, fake_nvml, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_nvml(METERED_GPUS)
    meter = EnergyMeter.open([0, 1], powercap_dir=tmp_path / "none")
    assert {s.label: s.is_power for s in meter.sources} == {"gpu0": True, "gpu1": False}  # cuda:0 is the P100
    meter.start()
    time.sleep(0.3)
    meter.tick()
    time.sleep(0.3)
    joules = meter.stop()
    seconds = 0.6
    assert joules["gpu0"] == pytest.approx(100.0 * seconds, rel=0.25)
    assert joules["gpu1"] == pytest.approx(300.0 * seconds, rel=0.25)
    # Both GPUs read; the CPU package does not, and the note says both things.
    assert meter.complete and meter.per_image(joules, 10) == pytest.approx(sum(joules.values()) / 10)
    note = meter.note()
    assert "gpu0 is NVML's power readings integrated" in note and "counts the GPUs only" in note
    meter.close()


# --- a torchrun job across machines: each machine metered on its own, summed by rank 0 ---

MACHINES = {0: "node 0 (host-a)", 1: "node 1 (host-b)", 2: "node 2 (host-c)"}


def test_the_job_sums_every_machines_joules_and_has_no_figure_where_one_lacks_a_reading():
    gpus = {"node": 0, "joules": {"gpu0": 120.5, "gpu1": 130.0, "cpu_package": 40.0}, "complete": True}
    cpu_only = {"node": 1, "joules": {"cpu_package": 9.5}, "complete": True}
    gpus_without_rapl = {"node": 2, "joules": {"gpu0": 100.0}, "complete": True}  # counts the GPUs only
    # Processes that do not meter (the other local ranks) contribute None.
    energy_j, per_image = combine([gpus, None, cpu_only, None, gpus_without_rapl], MACHINES, images=1000)
    assert energy_j == {"node0:gpu0": 120.5, "node0:gpu1": 130.0, "node0:cpu_package": 40.0,
                        "node1:cpu_package": 9.5, "node2:gpu0": 100.0}
    assert per_image == pytest.approx(400.0 / 1000)
    # One machine without a reading for a device the run uses: the machines' joules, no figure per image.
    lacking = {**gpus_without_rapl, "joules": {}, "complete": False}
    energy_j, per_image = combine([gpus, cpu_only, lacking], MACHINES, images=1000)
    assert set(energy_j) == {"node0:gpu0", "node0:gpu1", "node0:cpu_package", "node1:cpu_package"}
    assert per_image is None
    # A machine that sent nothing, and an epoch without images, have no figure either.
    assert combine([gpus, cpu_only], MACHINES, images=1000)[1] is None
    assert combine([gpus, cpu_only, gpus_without_rapl], MACHINES, images=0)[1] is None


ENERGY_WORLD = 3  # ranks 0 and 1 on node 0 (rank 0 meters it), rank 2 on node 1
ENERGY_WORLD_TIMEOUT_S = 90


def _energy_world(rank: int, port: int, root: str, out_path: str) -> None:
    """One process of a job on two machines, each machine's RAPL folder its own."""
    from datetime import timedelta

    import torch.distributed as dist

    node, meters = (0, rank == 0) if rank < 2 else (1, True)
    folder = Path(root) / f"node{node}"
    machines = {0: MACHINES[0], 1: MACHINES[1]}
    results = {}
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=client, rank=rank, world_size=ENERGY_WORLD, timeout=timedelta(seconds=30))
    try:
        def rapl(uj: int) -> None:
            if meters:
                write_rapl(folder, {"intel-rapl:0": uj}, max_uj=100_000_000)

        # Both machines read RAPL: node 0 uses 3 J in epoch 1, node 1 1.5 J.
        rapl(1_000_000 if node == 0 else 500_000)
        energy = JobEnergy.open(EnergyPart(machines, node, meters), powercap_dir=folder)
        results["open_notes"] = energy.take_notes()
        energy.start()
        rapl(4_000_000 if node == 0 else 2_000_000)
        results["epoch1"] = energy.epoch_fields(energy.stop(), images=9)
        # Epoch 2: node 1's counter goes away mid-epoch (a permission change, say); node 0 uses 2 J.
        energy.start()
        rapl(6_000_000 if node == 0 else 2_000_000)
        if node == 1:
            (folder / "intel-rapl:0" / "energy_uj").unlink()
        results["epoch2"] = energy.epoch_fields(energy.stop(), images=9)
        results["epoch2_notes"] = energy.take_notes()
        energy.close()
        # A job whose node 1 has no RAPL at all: said when the meters open, and no figure.
        energy = JobEnergy.open(EnergyPart(machines, node, meters),
                                powercap_dir=folder if node == 0 else Path(root) / "missing")
        results["absent_notes"] = energy.take_notes()
        energy.start()
        rapl(7_000_000)
        results["absent"] = energy.epoch_fields(energy.stop(), images=9)
        energy.close()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(out_path).write_text(json.dumps(results))
    leave_as_a_rank()


def test_a_job_across_machines_sums_their_rapl_counters_through_a_real_collective(tmp_path):
    out = tmp_path / "rank0.json"
    run_world(_energy_world, ENERGY_WORLD, str(tmp_path), str(out), timeout_s=ENERGY_WORLD_TIMEOUT_S)
    results = json.loads(out.read_text())
    assert results["open_notes"] == []  # every counter reads
    assert results["epoch1"] == {"energy_j": {"node0:cpu_package": 3.0, "node1:cpu_package": 1.5},
                                 "energy_j_per_image": pytest.approx(4.5 / 9)}
    assert results["epoch2"] == {"energy_j": {"node0:cpu_package": 2.0}, "energy_j_per_image": None}
    (failed,) = results["epoch2_notes"]
    assert failed.startswith("node 1 (host-b): cpu_package: its reading failed during the run (FileNotFoundError")
    assert results["absent"] == {"energy_j": {"node0:cpu_package": 1.0}, "energy_j_per_image": None}
    assert results["absent_notes"] == [
        f"node 1 (host-b): Energy per image is not recorded (no estimate is shown instead): cpu_package: "
        f"RAPL is not available ({tmp_path / 'missing'} does not exist)."]


def test_sampler_fills_gpu_fields_from_nvml(run_row, fake_nvml, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_nvml(METERED_GPUS)
    engine, run_id = run_row
    sampler = SystemSampler(engine, run_id, time.time(), [0, 1], interval_s=1)
    sampler.start()
    try:
        sample = sampler.sample()
    finally:
        sampler.stop()
    assert sample["gpus"] == [
        {"index": 0, "util_pct": 40, "memory_used_mb": 1000.0, "power_w": 100.0, "temperature_c": 50, "sm_clock_mhz": 1189},
        {"index": 1, "util_pct": 97, "memory_used_mb": 3000.0, "power_w": 300.0, "temperature_c": 70, "sm_clock_mhz": 1410},
    ]


def test_without_nvml_samples_have_no_gpus(run_row, cpu_machine):
    engine, run_id = run_row
    sampler = SystemSampler(engine, run_id, time.time(), [0], interval_s=1)
    sampler.start()
    sampler.stop()
    assert sampler.sample()["gpus"] == []


def test_sampler_thread_writes_in_batches_and_stops(run_row, cpu_machine):
    engine, run_id = run_row
    # A child holding 60 MB stands in for a DataLoader worker: it is summed under its rank.
    child = subprocess.Popen([sys.executable, "-c", "b = bytearray(60 * 2**20); import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 20
        while psutil.Process(child.pid).memory_info().rss < 60 * MB and time.monotonic() < deadline:
            time.sleep(0.05)
        own_mb = psutil.Process().memory_info().rss / MB
        with SystemSampler(engine, run_id, time.time(), [], interval_s=0.05, flush_s=0.2) as sampler:
            sampler.watch({0: os.getpid()})
            time.sleep(0.6)
        assert not sampler._thread.is_alive() and sampler._thread.daemon
    finally:
        child.kill()
        child.wait(10)
    rows = system_metrics.read_samples(engine, [run_id])
    assert 6 <= len(rows) == sampler.written <= 14
    assert all(r["processes"][0]["rss_mb"] >= own_mb + 55 for r in rows)
    assert sampler.cost_s < 0.6


def test_step_recorder_thins_points_and_averages_their_losses(run_row):
    engine, run_id = run_row
    loader = DataLoader(TensorDataset(torch.zeros(10, 1)), batch_size=3)  # batches of 3, 3, 3, 1
    assert step_images(loader) == [3, 3, 3, 1]
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    recorder = StepRecorder(Recorder(engine, run_id), time.time() - 100, images_factor=2, min_interval_s=0.15)
    before, after = [time.perf_counter()], []  # around each call that may close a window: what bounds it
    recorder.start_epoch(2, loader, optimizer)
    after.append(time.perf_counter())
    for step, (loss, pause_s) in enumerate([(4.0, 0.2), (1.0, 0.01), (3.0, 0.2), (9.0, 0.01)], start=1):
        time.sleep(pause_s)
        recorder.loss(torch.tensor(loss))
        before.append(time.perf_counter())
        recorder.step(step, 4)
        after.append(time.perf_counter())
    recorder.end_epoch()
    with engine.connect() as connection:
        rows = [SimpleNamespace(**r) for r in connection.execute(
            select(StepMetric).where(StepMetric.run_id == run_id).order_by(StepMetric.step)).mappings()]
    # Step 2 came too soon after step 1: its point is step 3, the mean of steps 2 and 3. The last
    # step always closes a point. Steps count across epochs: epoch 2 starts at step 5.
    assert [r.step for r in rows] == [5, 7, 8]
    assert [r.train_loss for r in rows] == pytest.approx([4.0, 2.0, 9.0])
    assert all(r.epoch == 2 and r.lr == 0.5 and 100 < r.t_s < 200 for r in rows)
    # Global images (2 ranks) over the host time of each window: at least the sleeps in it, at most the time
    # from before the call that opened it to after the call that closed it (one rank's images would be half).
    for row, images, opened, closed, slept_s in ((rows[0], 6, 0, 1, 0.2), (rows[1], 12, 1, 3, 0.21)):
        longest_s = after[closed] - before[opened]
        assert 0.98 * images / longest_s <= row.images_per_s <= 1.02 * images / slept_s
    # The time the training thread spent here is counted; how small it is, bench/series_cost.py
    # measures (a bound here would time a database write on a busy machine).
    assert recorder.written == 3 and recorder.cost_s > 0


def test_skipped_writes_back_off_while_locked_and_resume_once_one_lands():
    backoff = LockBackoff(first_s=2.0, max_s=30.0)
    assert backoff.due(0.0)
    waits = []
    now = 0.0
    for _ in range(6):
        backoff.tried(False, now)
        waits.append(next(t for t in range(1, 100) if backoff.due(now + t)))
        now += waits[-1]
    assert waits == [2, 4, 8, 16, 30, 30]
    backoff.tried(True, now)
    assert backoff.due(now)  # the first write that lands resets it


def test_a_locked_database_costs_training_a_few_tries_not_a_wait_per_step(run_row, monkeypatch):
    monkeypatch.setenv("PARALLAX_DB_LOCK_WAIT_S", "1")  # a progress try waits 0.2 s for the lock, step points 1 s
    engine, run_id = run_row
    loader = DataLoader(TensorDataset(torch.zeros(1000, 1)), batch_size=1)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    writer = Recorder(engine, run_id, progress_interval_s=0.05)  # one recorder: a back-off for each kind
    progress = writer.progress
    recorder = StepRecorder(writer, time.time(), min_interval_s=0.0, flush_s=0.05)
    recorder.start_epoch(1, loader, optimizer)
    holder = sqlite3.connect(engine.url.database, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    waited = {"progress": [], "steps": []}
    started, step = time.monotonic(), 0
    try:
        while time.monotonic() - started < 2.5:  # steps of 20 ms while another process holds the lock
            step += 1
            time.sleep(0.02)
            for name, call in (("progress", lambda step=step: progress(1, step, 1000)),
                               ("steps", lambda step=step: (recorder.loss(torch.tensor(1.0)), recorder.step(step, 1000)))):
                before = time.monotonic()
                call()
                waited[name].append(time.monotonic() - before)
    finally:
        holder.execute("COMMIT")
        holder.close()
    # Each kind tried at the start and at most once more: waiting at every step would have made
    # this loop a handful of steps long.
    assert step >= 20
    assert 1 <= sum(w >= 0.15 for w in waited["progress"]) <= 2, waited["progress"]
    assert sum(w >= 0.5 for w in waited["steps"]) == 1, waited["steps"]
    # Nothing is lost: the points that waited are written with the next write that lands.
    recorder.end_epoch()
    recorder.finish()
    with engine.connect() as connection:
        steps = connection.execute(select(StepMetric.step).where(StepMetric.run_id == run_id)).scalars().all()
    assert sorted(steps) == list(range(1, step + 1)) and recorder.dropped == 0


def test_a_step_point_write_waits_its_window_for_a_lock_not_sqlites_whole_busy_timeout(run_row, monkeypatch):
    """While training, step points wait about a second for a lock another process holds, then stay for the
    next write (``Recorder.step_points``). SQLite's own per-statement wait is 30 s by default: unless the
    write lowers it, one locked statement blocked the training thread for 30 s before its window was looked at."""
    from db.connection import SKIPPABLE_WRITE_WAIT_S, DatabaseLockedError, busy_timeout_ms

    monkeypatch.delenv("PARALLAX_DB_LOCK_WAIT_S", raising=False)
    assert busy_timeout_ms() == 30_000
    engine, run_id = run_row
    writer = Recorder(engine, run_id)
    row = {"epoch": 1, "step": 1, "t_s": 0.1, "train_loss": 1.0, "images_per_s": 100.0, "lr": 0.1}
    holder = sqlite3.connect(engine.url.database, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    before = time.monotonic()
    try:
        with pytest.raises(DatabaseLockedError):
            writer.step_points([row], window_s=SKIPPABLE_WRITE_WAIT_S)
        waited_s = time.monotonic() - before
    finally:
        holder.execute("COMMIT")
        holder.close()
    assert waited_s < 3 * SKIPPABLE_WRITE_WAIT_S, waited_s
    assert writer.step_points([row], window_s=None)  # the same pooled connection waits its whole time again
    with engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000


def test_a_bad_sample_interval_is_refused_in_one_line(cli):
    result = cli("run", "--dataset", "digits", "--epochs", "1", env_extra={"PARALLAX_SAMPLE_S": "often"}, timeout=120)
    assert result.returncode != 0
    assert "PARALLAX_SAMPLE_S='often' is not allowed" in result.stderr
    assert "Traceback" not in result.stderr


def three_tiny_steps(hooks=None, **kwargs) -> float:
    """An epoch of three steps of a linear model on the CPU, through Parallax's loop; its training seconds.
    ``hooks`` (StepHooks) are started and given every hook the trainer gives them; ``kwargs`` go to the loop."""
    from trainer_backend.rank.loop import train_one_epoch
    from trainer_backend.rank.strategies import Strategy

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
    loader = DataLoader(TensorDataset(torch.randn(12, 1, 4, 4), torch.randint(0, 3, (12,))), batch_size=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if hooks is not None:
        hooks.start_epoch(1, loader, optimizer)
        kwargs.update(on_start=hooks.begin_training, on_step=hooks, on_loss=hooks.loss)
    _, train_time_s = train_one_epoch(model, loader, optimizer, Strategy(RunConfig(strategy="single", devices="cpu")),
                                      **kwargs)
    return train_time_s


@pytest.mark.parametrize("stopped", [False, True], ids=["epoch-end", "stopped-at-the-last-step"])
def test_the_last_steps_hooks_write_after_the_epochs_clock_has_stopped(stopped):
    """An epoch's last step writes its progress, its step points and its energy: training time stops before
    them, so a slow write (a busy database) lowers no epoch's images/s, and a short epoch is not
    charged a fixed cost the hand-written loop it is compared with does not pay. Every step's hook still
    runs, the last one after the clock, also where a stop asked at that step ends the epoch."""
    from trainer_backend.rank.stopping import StopAtStep

    write_s, hooked = 0.5, []

    def on_step(step: int, total_steps: int) -> None:
        hooked.append(step)
        if step == total_steps:
            time.sleep(write_s)

    stop = (lambda step, total_steps: step == total_steps) if stopped else None
    started = time.perf_counter()
    try:
        train_time_s = three_tiny_steps(on_step=on_step, stop=stop)
    except StopAtStep as at:
        assert stopped and at.step == 3
        train_time_s = at.train_time_s
    assert hooked == [1, 2, 3]
    assert time.perf_counter() - started >= write_s  # the write ran, within the call
    assert train_time_s < write_s / 2, train_time_s


def test_the_last_step_points_window_ends_before_the_epochs_progress_write():
    """The epoch's last step writes its progress; the last step point's window must end before that write,
    else a slow one (a locked database, waited out for a second) drags the series' last point down."""
    from trainer_backend.telemetry.steps import StepHooks

    class Rows:
        def __init__(self):
            self.rows: list[dict] = []

        def step_points(self, rows, *, window_s):
            self.rows += rows
            return True

    write_s = 0.5

    def progress(epoch: int, step: int, total_steps: int) -> None:
        if step == total_steps:
            time.sleep(write_s)

    writer = Rows()
    hooks = StepHooks(progress=progress, recorder=StepRecorder(writer, time.time(), min_interval_s=60.0))
    train_time_s = three_tiny_steps(hooks)
    hooks.end_epoch(images=12)
    (point,) = writer.rows  # one window: the whole epoch
    assert point["step"] == 3 and train_time_s < write_s / 2
    assert point["images_per_s"] > 12 / (write_s / 2), (point, train_time_s)
