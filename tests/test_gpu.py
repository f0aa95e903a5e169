"""The CUDA paths: NCCL DDP, DataParallel, model parallel over two GPUs, AMP.

These run on a GPU workstation with ``make test``; where CUDA is absent they skip (and only then).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import run_cli

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
one_gpu = pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
two_gpus = pytest.mark.skipif(GPUS < 2, reason="needs two CUDA GPUs")


def train(home, *flags):
    result = run_cli("run", "--dataset", "digits", "--model", "resnet18", "--epochs", "1", *flags, home=home)
    assert result.returncode == 0, result.stdout + result.stderr
    run_id = result.stdout.strip().splitlines()[-1].split()[0].split("=")[1]
    run = json.loads(run_cli("export", run_id, home=home).stdout)
    assert run["status"] == "completed"
    epoch = run["epochs"][0]
    assert all(math.isfinite(epoch[k]) for k in ("train_loss", "val_acc", "images_per_s"))
    return run


@one_gpu
@pytest.mark.parametrize("amp", ["bf16", "fp16", "off"])
def test_single_gpu_with_amp(parallax_home, amp):
    run = train(parallax_home, "--strategy", "single", "--devices", "0", "--amp", amp)
    assert set(run["epochs"][0]["peak_memory_mb"]) == {"cuda:0"}


@two_gpus
def test_ddp_over_two_gpus_with_nccl(parallax_home):
    run = train(parallax_home, "--strategy", "ddp", "--devices", "0,1", "--batch-size", "128")
    assert set(run["epochs"][0]["peak_memory_mb"]) == {"cuda:0", "cuda:1"}


@two_gpus
def test_dataparallel_over_two_gpus(parallax_home):
    run = train(parallax_home, "--strategy", "dp", "--devices", "0,1")
    assert not any("pass-through" in note for note in run["notes"])
    assert set(run["epochs"][0]["peak_memory_mb"]) == {"cuda:0", "cuda:1"}


@two_gpus
def test_model_parallel_over_two_gpus(parallax_home):
    run = train(parallax_home, "--strategy", "mp", "--devices", "cuda:0,cuda:1")
    memory = run["epochs"][0]["peak_memory_mb"]
    assert set(memory) == {"cuda:0", "cuda:1"} and all(v > 0 for v in memory.values())


# --- measurement ---
# The profiler, peak memory, pipeline busy time and GPU numbering as only a GPU shows them.

PHASE_FIELDS = ("data_loading_ms", "forward_ms", "backward_ms", "optimizer_step_ms")


def profiled_steps(home, run):
    from db import make_engine, profiles

    engine = make_engine(f"sqlite:///{home / 'parallax.db'}")
    return profiles.read_ops(engine, run["run_id"]), profiles.read_steps(engine, [run["run_id"]])


@one_gpu
def test_profiler_on_cuda_counts_each_step_once_with_kernels_on_the_gpu(parallax_home):
    run = train(parallax_home, "--strategy", "single", "--devices", "0", "--profile", "--profile-active", "3")
    ops, steps = profiled_steps(parallax_home, run)
    assert any(op["self_device_us"] > 0 for op in ops), "no kernel with device time"
    assert [s["step"] for s in steps] == [3, 4, 5]  # exactly the active steps: no device-side copies
    for step in steps:
        assert sum(step[f] for f in PHASE_FIELDS) <= step["total_ms"] * (1 + 1e-6)
        assert step["forward_ms"] > 0 and step["backward_ms"] > 0 and step["communication_ms"] == 0


@two_gpus
def test_profiler_reads_nccl_collectives_from_the_gpus(parallax_home):
    run = train(parallax_home, "--strategy", "ddp", "--devices", "0,1", "--profile", "--profile-active", "2")
    _, steps = profiled_steps(parallax_home, run)
    assert sorted((s["rank"], s["step"]) for s in steps) == [(r, n) for r in (0, 1) for n in (3, 4)]
    for step in steps:
        assert 0 < step["communication_ms"] <= step["total_ms"]
        assert sum(step[f] for f in PHASE_FIELDS) <= step["total_ms"] * (1 + 1e-6)


@one_gpu
def test_peak_memory_records_allocated_and_reserved_per_gpu(parallax_home):
    epoch = train(parallax_home, "--strategy", "single", "--devices", "0")["epochs"][0]
    allocated, reserved = epoch["peak_memory_mb"], epoch["extra"]["peak_memory_reserved_mb"]
    assert set(allocated) == set(reserved) == {"cuda:0"}
    assert 0 < allocated["cuda:0"] <= reserved["cuda:0"]


@two_gpus
def test_peak_memory_of_each_ddp_rank_has_both_figures(parallax_home):
    epoch = train(parallax_home, "--strategy", "ddp", "--devices", "0,1", "--batch-size", "128")["epochs"][0]
    reserved = epoch["extra"]["peak_memory_reserved_mb"]
    assert set(reserved) == {"cuda:0", "cuda:1"}
    assert all(0 < epoch["peak_memory_mb"][d] <= reserved[d] for d in reserved)


@two_gpus
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_stages_on_two_gpus_are_busy_less_than_all_the_time(parallax_home, schedule):
    run = train(parallax_home, "--strategy", "pp", "--devices", "0,1", "--pipeline-schedule", schedule)
    extra = run["epochs"][0]["extra"]
    busy = extra["stage_busy_fraction"]
    assert set(busy) == {"stage0", "stage1"} and all(0 < f < 1 for f in busy.values()), busy
    assert 0 < extra["bubble_fraction"] < 1


@one_gpu
def test_the_picker_and_cuda_name_the_same_gpu(parallax_home):
    """NVML's GPU for cuda:N is the GPU a process gets as cuda:N under Parallax's PCI bus order."""
    import os
    import subprocess
    import sys

    from conftest import ROOT
    from trainer_backend import devices

    statuses = devices.gpu_statuses()
    if not statuses or any(s.uuid.startswith("MIG-") for s in statuses):
        pytest.skip("needs NVML and whole GPUs")
    probe = ("import torch\n"
             "print(','.join(str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())))")
    env = {**os.environ, "CUDA_DEVICE_ORDER": devices.DEVICE_ORDER}
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)

    def plain(uuid: str) -> str:
        return uuid.strip().lower().removeprefix("gpu-")

    assert [plain(u) for u in done.stdout.split(",")] == [plain(s.uuid) for s in statuses], done.stderr


# --- engine ---

def run_of(home, result) -> dict:
    run_id = result.stdout.strip().splitlines()[-1].split()[0].split("=")[1]
    return json.loads(run_cli("export", run_id, home=home).stdout)


def auto_dtype() -> str:
    return "bfloat16" if torch.cuda.get_device_capability(0) >= (8, 0) else "float16"


@one_gpu
@pytest.mark.parametrize("amp", ["auto", "bf16", "fp16", "off"])
def test_single_gpu_forward_runs_in_the_dtype_asked_for(parallax_home, amp):
    # 64 px: larger activation gradients, so fp16's first steps overflow at the scaler's initial 2**16.
    run = train(parallax_home, "--strategy", "single", "--devices", "0", "--amp", amp, "--image-size", "64")
    extra = run["epochs"][0]["extra"]
    expected = {"auto": auto_dtype(), "bf16": "bfloat16", "fp16": "float16", "off": None}[amp]
    assert extra.get("forward_dtype") == expected
    if expected == "float16":
        # GradScaler starts at 2**16 and halves on every step whose gradients overflow.
        assert 0 < extra["grad_scale"] < 2.0**16
    else:
        assert "grad_scale" not in extra


@one_gpu
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_ddp_and_fsdp_on_one_gpu_train_as_a_world_of_one(parallax_home, strategy):
    run = train(parallax_home, "--strategy", strategy, "--devices", "0")
    assert run["world_size"] == 1 and any("world of one" in note for note in run["notes"])
    assert set(run["epochs"][0]["peak_memory_mb"]) == {"cuda:0"}


@two_gpus
def test_dataparallel_replicas_run_in_bf16(parallax_home):
    run = train(parallax_home, "--strategy", "dp", "--devices", "0,1", "--amp", "bf16")
    assert run["epochs"][0]["extra"]["forward_dtype"] == "bfloat16"
    assert all(v > 0 for v in run["epochs"][0]["peak_memory_mb"].values())


@two_gpus
@pytest.mark.parametrize("strategy", ["fsdp", "pp"])
def test_fsdp_and_pipeline_over_two_gpus(parallax_home, strategy):
    run = train(parallax_home, "--strategy", strategy, "--devices", "0,1", "--batch-size", "128")
    memory = run["epochs"][0]["peak_memory_mb"]
    assert set(memory) == {"cuda:0", "cuda:1"} and all(v > 0 for v in memory.values())


@two_gpus
@pytest.mark.parametrize("strategy", ["ddp", "dp", "mp"])
def test_devices_listed_in_reverse_keep_their_order(parallax_home, strategy):
    """--devices 1,0: rank 0 (ddp), DataParallel's gathering GPU and mp's first stage are cuda:1."""
    run = train(parallax_home, "--strategy", strategy, "--devices", "1,0")
    assert run["config"]["devices"] == ["cuda:1", "cuda:0"]
    memory = run["epochs"][0]["peak_memory_mb"]
    assert set(memory) == {"cuda:0", "cuda:1"} and all(v > 0 for v in memory.values())


@one_gpu
def test_out_of_memory_fails_with_the_hint_and_frees_the_gpu(parallax_home):
    from trainer_backend.preflight import OOM_HINT

    free_before, _ = torch.cuda.mem_get_info(0)
    # All 1437 training images in one batch of resnet50 at 384 px: hundreds of GB of activations.
    result = run_cli("run", "--dataset", "digits", "--model", "resnet50", "--image-size", "384", "--batch-size",
                     "2048", "--epochs", "1", "--amp", "off", "--devices", "0", home=parallax_home, timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr
    run = run_of(parallax_home, result)
    assert run["status"] == "failed" and run["error"].startswith(OOM_HINT), run["error"]
    free_after, _ = torch.cuda.mem_get_info(0)
    assert free_after > free_before - 2**30  # the failed run's memory went back to the GPU
    train(parallax_home, "--strategy", "single", "--devices", "0")  # and the GPU trains again


@one_gpu
def test_resume_state_of_a_gpu_model_is_saved_on_the_cpu():
    """So that reading it back puts nothing on the GPU of the rank that saved it."""
    from torch import nn

    from trainer_backend.config import RunConfig
    from trainer_backend.strategies import Strategy

    strategy = Strategy(RunConfig(strategy="single", devices="0"))
    model = strategy.wrap(nn.Linear(4, 2))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 4, device="cuda:0")).sum().backward()
    optimizer.step()
    state = strategy.resume_state(model, optimizer)
    tensors = [*state["model"].values(), *state["optimizer"]["state"][0].values()]
    assert any(t.numel() > 1 for t in tensors) and all(t.device.type == "cpu" for t in tensors)


# --- steps and system samples ---
# NVML's fields and counters on a real GPU, and step points timed by CUDA events.


def series_of(home, run):
    from sqlalchemy import select

    from db import make_engine
    from db.models import StepMetric, SystemSample

    with make_engine(f"sqlite:///{home / 'parallax.db'}").connect() as connection:
        steps = connection.execute(select(StepMetric).where(StepMetric.run_id == run["run_id"])).mappings().all()
        samples = connection.execute(select(SystemSample).where(SystemSample.run_id == run["run_id"])).mappings().all()
    return steps, samples


@one_gpu
def test_gpu_run_samples_nvml_fields_and_records_steps_and_energy(parallax_home, monkeypatch):
    monkeypatch.setenv("PARALLAX_SAMPLE_S", "0.2")
    run = train(parallax_home, "--strategy", "single", "--devices", "0")
    steps, samples = series_of(parallax_home, run)
    assert steps and all(math.isfinite(s["train_loss"]) and s["images_per_s"] > 0 for s in steps)
    gpus = [g for s in samples for g in s["gpus"]]
    assert gpus and {g["index"] for g in gpus} == {0}
    for field in ("util_pct", "memory_used_mb", "power_w", "temperature_c", "sm_clock_mhz"):
        assert any(g[field] is not None and g[field] > 0 for g in gpus), field
    extra = run["epochs"][0]["extra"]
    # Volta and later keep an energy counter; older boards are integrated from power readings.
    assert extra["energy_j"]["gpu0"] > 0 and extra["energy_j_per_image"] > 0


@two_gpus
def test_ddp_over_two_gpus_samples_both(parallax_home, monkeypatch):
    monkeypatch.setenv("PARALLAX_SAMPLE_S", "0.2")
    run = train(parallax_home, "--strategy", "ddp", "--devices", "0,1", "--batch-size", "128")
    _, samples = series_of(parallax_home, run)
    assert any({g["index"] for g in s["gpus"]} == {0, 1} for s in samples)
    assert any([p["rank"] for p in s["processes"]] == [0, 1] for s in samples)
    assert set(run["epochs"][0]["extra"]["energy_j"]) >= {"gpu0", "gpu1"}


@one_gpu
def test_another_machines_gpu_readings_reach_the_run_through_the_store(engine, served):
    """A torchrun machine other than rank 0's samples its GPU 0 (NVML) and sends the rows through a
    real c10d store; rank 0's sampler writes them with its own, the GPU fields intact."""
    import os
    import time
    from db import series, store
    from trainer_backend.machine_samples import StoreDrain, StorePusher, sample_store
    from trainer_backend.sampler import SystemSampler

    run_id = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": "ddp",
                                       "devices": ["cuda:0", "cuda:0"], "epochs": 1}, status="running")
    started_at_s = time.time()
    drain = StoreDrain(sample_store(run_id, 0, host="127.0.0.1", port=served), {1: "node 1 (b)"}, started_at_s)
    remote = SystemSampler(None, run_id, 0.0, [0], interval_s=0.1, flush_s=0.3, node=1, machine="node 1 (b)",
                           sink=StorePusher(sample_store(run_id, 0, host="127.0.0.1", port=served), node=1))
    remote.watch({1: os.getpid()})
    with SystemSampler(engine, run_id, started_at_s, [], interval_s=0.1, flush_s=0.3, extra=drain):
        with remote:
            time.sleep(1.0)
    theirs = [r for r in series.read_system(engine, [run_id], max_points=None) if r["node"] == 1]
    assert len(theirs) >= 5 and all(0 <= r["t_s"] < 5 for r in theirs)
    gpus = [g for r in theirs for g in r["gpus"]]
    assert gpus and {g["index"] for g in gpus} == {0}
    for field in ("memory_used_mb", "power_w", "temperature_c", "sm_clock_mhz"):
        assert any(g[field] is not None and g[field] > 0 for g in gpus), field
    assert store.get_run(engine, run_id).notes == []


@one_gpu
def test_a_machines_gpu_energy_reaches_the_job_through_an_object_gather_on_nccl(tmp_path):
    """Across machines, each machine's local rank 0 meters its GPUs and every process of the job
    joins one object all-gather on NCCL per epoch: here a world of one process on GPU 0."""
    import time
    from datetime import timedelta

    import torch.distributed as dist

    from trainer_backend.job_energy import EnergyPart, JobEnergy

    torch.cuda.set_device(0)
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=30))
    dist.init_process_group("nccl", store=server, rank=0, world_size=1, timeout=timedelta(seconds=60))
    try:
        energy = JobEnergy.open(EnergyPart({0: "node 0 (a)"}, node=0, meters=True, cuda_indices=(0,)),
                                powercap_dir=tmp_path / "no-rapl")
        (note,) = energy.take_notes()
        assert note.startswith("node 0 (a): ") and "counts the GPUs only" in note
        energy.start()
        x = torch.randn(2048, 2048, device="cuda")
        for _ in range(10):  # about a second of work, with ticks for a board that integrates power
            for _ in range(50):
                x = (x @ x).tanh()
            torch.cuda.synchronize()
            energy.tick()
            time.sleep(0.05)
        fields = energy.epoch_fields(energy.stop(), images=100)
        energy.close()
    finally:
        dist.destroy_process_group()
    assert set(fields["energy_j"]) == {"node0:gpu0"} and fields["energy_j"]["node0:gpu0"] > 0
    assert fields["energy_j_per_image"] == pytest.approx(fields["energy_j"]["node0:gpu0"] / 100)


# --- training recipe ---


@one_gpu
def test_fp16_clipping_bounds_the_unscaled_gradients_on_a_gpu():
    """Under fp16 the loss is scaled by 2**16: clipping before unscaling would leave gradients 65,536 times too small."""
    import torch.nn.functional as F
    from torch import nn

    from trainer_backend.config import RunConfig
    from trainer_backend.loop import make_grad_scaler, train_one_epoch
    from trainer_backend.strategies import Strategy
    from trainer_backend.trainer import build_optimizer

    config = RunConfig(strategy="single", devices="0", amp="fp16", grad_clip=0.05, optimizer="sgd", lr=0.1)
    strategy = Strategy(config)
    torch.manual_seed(0)
    model = strategy.wrap(nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 3)))
    images, labels = torch.randn(8, 1, 8, 8) * 5, torch.randint(0, 3, (8,))
    with torch.autocast("cuda", dtype=torch.float16):
        F.cross_entropy(model(images.cuda()), labels.cuda()).backward()
    raw_norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item()
    model.zero_grad(set_to_none=True)
    assert raw_norm > 0.5
    optimizer = build_optimizer(config, model.parameters())
    norms: list[float] = []
    optimizer.register_step_pre_hook(
        lambda *_: norms.append(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item()))
    train_one_epoch(model, [(images, labels)], optimizer, strategy, amp_dtype=torch.float16,
                    scaler=make_grad_scaler(torch.float16))
    assert norms == [pytest.approx(0.05, rel=1e-2)]


# --- MFU, ranks, memory breakdown ---
# MFU against the datasheet peak of the GPU this runs on, comm wait from CUDA events, and the
# memory breakdown with the activations only CUDA's allocator can tell.

RESNET18_DIGITS_PARAMS_MB = 42.63  # resnet18, 10 classes, one input channel, fp32


@one_gpu
def test_mfu_on_one_gpu_uses_the_peak_table(parallax_home):
    from trainer_backend.flops import gpu_peak

    run = train(parallax_home, "--strategy", "single", "--devices", "0", "--amp", "bf16")
    measured, extra = run["measurements"], run["epochs"][0]["extra"]
    name = torch.cuda.get_device_name(0)
    found = gpu_peak(name, "bf16")
    assert measured["flops_per_image"] > 0 and extra["achieved_tflops"] > 0
    if found is None:  # a GPU the table does not know: no MFU, and the run says why
        assert extra["mfu"] is None and measured["peak_tflops"] is None
        assert any(name in note for note in run["notes"])
    else:
        assert measured["peak_tflops"] == found[0] and measured["peak_source"] == found[1]
        assert 0 < extra["mfu"] <= 1
    (rank,) = extra["ranks"]
    assert rank["comm_wait_s"] == 0.0 and rank["compute_time_s"] > 0
    (label, entry), = extra["memory_breakdown"].items()
    assert label == "cuda:0"
    assert entry["parameters_mb"] == pytest.approx(RESNET18_DIGITS_PARAMS_MB, rel=0.01)
    assert entry["activations_other_mb"] > 0
    held = entry["parameters_mb"] + entry["gradients_mb"] + entry["optimizer_mb"] + entry["activations_other_mb"]
    assert held == pytest.approx(run["epochs"][0]["peak_memory_mb"]["cuda:0"], rel=0.01)


@one_gpu
def test_fsdp_on_one_gpu_reads_its_comm_wait_from_cuda_events(parallax_home):
    # A world of one gathers nothing, but FSDP's hooks run and are timed by events on the compute stream.
    run = train(parallax_home, "--strategy", "fsdp", "--devices", "0")
    (rank,) = run["epochs"][0]["extra"]["ranks"]
    assert isinstance(rank["comm_wait_s"], float) and 0 <= rank["comm_wait_s"] < rank["train_time_s"]
    parts = rank["data_time_s"] + rank["compute_time_s"] + rank["comm_wait_s"]
    assert parts == pytest.approx(rank["train_time_s"], abs=1e-3)


@two_gpus
@pytest.mark.parametrize("strategy, params_share", [("ddp", 1.0), ("fsdp", 0.5)])
def test_two_gpus_record_comm_wait_from_cuda_events_and_each_devices_memory(parallax_home, strategy, params_share):
    run = train(parallax_home, "--strategy", strategy, "--devices", "0,1", "--batch-size", "128")
    extra = run["epochs"][0]["extra"]
    assert [r["rank"] for r in extra["ranks"]] == [0, 1]
    for rank in extra["ranks"]:
        parts = rank["data_time_s"] + rank["compute_time_s"] + rank["comm_wait_s"]
        assert parts == pytest.approx(rank["train_time_s"], abs=1e-3)
        # From events on the compute stream (FSDP's around its hooks): a positive wait, shorter than the epoch.
        assert 0 < rank["comm_wait_s"] < rank["train_time_s"]
    assert extra["mfu"] is not None and 0 < extra["mfu"] <= 1  # every GPU this runs on is in the peak table
    breakdown = extra["memory_breakdown"]
    assert set(breakdown) == {"cuda:0", "cuda:1"}
    for entry in breakdown.values():
        assert entry["parameters_mb"] == pytest.approx(RESNET18_DIGITS_PARAMS_MB * params_share, rel=0.15)
        assert entry["activations_other_mb"] > 0


# --- the memory estimate against the allocator's peak ---

@pytest.mark.parametrize("model", ["resnet18", "resnet50"])
@pytest.mark.parametrize("strategy, devices", [("single", "0"), ("ddp", "0,1"), ("fsdp", "0,1")])
def test_the_memory_estimate_is_within_a_tenth_of_each_gpus_peak(parallax_home, model, strategy, devices):
    if GPUS < len(devices.split(",")):
        pytest.skip(f"needs {len(devices.split(','))} CUDA GPU(s)")
    result = run_cli("run", "--dataset", "digits", "--model", model, "--epochs", "1", "--image-size", "128",
                     "--batch-size", "128", "--strategy", strategy, "--devices", devices, "--amp", "bf16",
                     "--bn-stats-images", "0", home=parallax_home)
    assert result.returncode == 0, result.stdout + result.stderr
    run = run_of(parallax_home, result)
    estimate = run["measurements"]["memory_estimate"]["devices"]
    peaks = run["epochs"][0]["peak_memory_mb"]
    assert set(estimate) == set(peaks)
    for device, parts in estimate.items():
        assert parts["total_mb"] == pytest.approx(peaks[device], rel=0.10), (device, parts, peaks)
