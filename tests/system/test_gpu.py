"""The CUDA paths: NCCL DDP, DataParallel, model parallel over two GPUs, AMP.

These run on a GPU workstation with ``make test``; where CUDA is absent they skip (and only then).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.support import run_cli

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
one_gpu = pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
two_gpus = pytest.mark.skipif(GPUS < 2, reason="needs two CUDA GPUs")


def train(home, *flags, env_extra: dict | None = None):
    result = run_cli("run", "--dataset", "digits", "--model", "resnet18", "--epochs", "1", *flags, home=home,
                     env_extra=env_extra)
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

    from tests.support import ROOT
    from contract import devices
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
    # 64 px: a short run whose activations are still large enough for fp16 to overflow at times.
    run = train(parallax_home, "--strategy", "single", "--devices", "0", "--amp", amp, "--image-size", "64")
    extra = run["epochs"][0]["extra"]
    expected = {"auto": auto_dtype(), "bf16": "bfloat16", "fp16": "float16", "off": None}[amp]
    assert extra.get("forward_dtype") == expected
    # The dtype --amp auto stood for is settled before the ranks start and shown in the run's config.
    assert run["config"]["amp"] == {"auto": {"bfloat16": "bf16", "float16": "fp16"}[auto_dtype()]}.get(amp, amp)
    if expected == "float16":
        # GradScaler starts at 2**16, halves on every step whose gradients overflow and doubles only after
        # 2,000 steps without one: within one epoch of the digits it is 2**16 or a power of two below it
        # (an H100 at 64 px saw no overflow, so 2**16).
        scale = extra["grad_scale"]
        assert 0 < scale <= 2.0**16 and math.log2(scale).is_integer(), scale
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
    from trainer_backend.supervisor.preflight import OOM_HINT

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

    from contract.config import RunConfig
    from trainer_backend.rank.strategies import Strategy

    strategy = Strategy(RunConfig(strategy="single", devices="0"))
    model = strategy.wrap(nn.Linear(4, 2))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 4, device="cuda:0")).sum().backward()
    optimizer.step()
    state = strategy.checkpoints.resume_state(model, optimizer)
    tensors = [*state["model"].values(), *state["optimizer"]["state"][0].values()]
    assert any(t.numel() > 1 for t in tensors) and all(t.device.type == "cpu" for t in tensors)


# --- steps and system samples ---
# NVML's fields and counters on a real GPU, and step points timed by CUDA events.


def series_of(home, run):
    from sqlalchemy import select

    from db import make_engine, system_metrics
    from db.tables import StepMetric

    engine = make_engine(f"sqlite:///{home / 'parallax.db'}")
    with engine.connect() as connection:
        steps = connection.execute(select(StepMetric).where(StepMetric.run_id == run["run_id"])).mappings().all()
    return steps, system_metrics.read_samples(engine, [run["run_id"]])


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
    from db import store, system_metrics
    from trainer_backend.telemetry.machine_samples import StoreDrain, StorePusher, sample_store
    from trainer_backend.telemetry.sampler import SystemSampler

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
    theirs = [r for r in system_metrics.read_samples(engine, [run_id]) if r["node"] == 1]
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

    from trainer_backend.telemetry.job_energy import EnergyPart, JobEnergy

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

    from contract.config import RunConfig
    from trainer_backend.rank.loop import make_grad_scaler, train_one_epoch
    from trainer_backend.rank.strategies import Strategy
    from trainer_backend.rank.trainer import build_optimizer

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
    # The scaler skips each step whose scaled gradients overflow fp16 and halves its scale, as these inputs
    # did at 2**16 on an H100: the same batch again, so that steps are taken.
    batches = 40
    train_one_epoch(model, [(images, labels)] * batches, optimizer, strategy, amp_dtype=torch.float16,
                    scaler=make_grad_scaler(torch.float16))
    assert 0 < len(norms) <= batches
    assert norms[0] == pytest.approx(0.05, rel=1e-2)
    assert max(norms) <= 0.05 * 1.01, norms


# --- MFU, ranks, memory breakdown ---
# MFU against the datasheet peak of the GPU this runs on, comm wait from CUDA events, and the
# memory breakdown with the activations only CUDA's allocator can tell.

RESNET18_DIGITS_PARAMS_MB = 42.63  # resnet18, 10 classes, one input channel, fp32


@one_gpu
def test_mfu_on_one_gpu_uses_the_peak_table(parallax_home):
    from trainer_backend.telemetry.flops import gpu_peak

    run = train(parallax_home, "--strategy", "single", "--devices", "0", "--amp", "bf16")
    measured, extra = run["measurements"], run["epochs"][0]["extra"]
    name = torch.cuda.get_device_name(0)
    found = gpu_peak(name, "bf16")
    assert measured["flops_per_image"] > 0 and extra["achieved_tflops"] > 0
    if found is None:  # a GPU the table does not know: no MFU, and the run says why
        assert extra["mfu"] is None and measured["peak_tflops"] is None
        assert any(name in note for note in run["notes"])
    else:
        assert measured["peak_tflops"] == found[0] and measured["peak_source"] == f"{found[1]}: autocast bf16"
        assert 0 < extra["mfu"] <= 1
    (rank,) = extra["ranks"]
    assert rank["comm_wait_s"] == 0.0 and rank["compute_time_s"] > 0
    (label, entry), = extra["memory_breakdown"].items()
    assert label == "cuda:0"
    assert entry["parameters_mb"] == pytest.approx(RESNET18_DIGITS_PARAMS_MB, rel=0.01)
    assert entry["activations_other_mb"] > 0
    held = (entry["parameters_mb"] + entry["gradients_mb"] + entry["optimizer_mb"] + entry["data_mb"]
            + entry["activations_other_mb"])
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


@one_gpu
@pytest.mark.parametrize("mode", ["on", "off"])
def test_the_dataset_is_kept_on_the_gpu_as_asked_and_shown_as_its_own_part(parallax_home, mode):
    """--data-on-device on keeps digits (28 MB at 128 px) on cuda:0, copied in chunks, and the breakdown
    and the estimate both show it as "data_mb"; off reads batches from host memory and shows none."""
    run = train(parallax_home, "--strategy", "single", "--devices", "0", "--image-size", "128",
                "--data-on-device", mode)
    kept = any("of stored pixels are kept on cuda:0 (as --data-on-device on asks)" in note for note in run["notes"])
    assert kept == (mode == "on"), run["notes"]
    (entry,) = run["epochs"][0]["extra"]["memory_breakdown"].values()
    estimated = run["measurements"]["memory_estimate"]["devices"]["cuda:0"]["data_mb"]
    if mode == "on":
        # The pixels and labels of both splits, exactly; the estimate counts the same bytes.
        assert entry["data_mb"] == pytest.approx(28.1, abs=0.1) and estimated == pytest.approx(entry["data_mb"], abs=0.01)
    else:
        assert entry["data_mb"] == 0.0 and estimated == 0.0
    assert entry["activations_other_mb"] > 0


@one_gpu
def test_on_that_cannot_fit_the_free_memory_is_refused_before_training(parallax_home):
    """Another process holds all but about 20 MB of the GPU: digits at 128 px (28 MB) cannot be kept."""
    free, _ = torch.cuda.mem_get_info(0)
    hold = torch.empty(max(0, free - 20 * 2**20), dtype=torch.uint8, device="cuda:0")
    try:
        result = run_cli("run", "--dataset", "digits", "--model", "resnet18", "--epochs", "1", "--image-size", "128",
                         "--devices", "0", "--data-on-device", "on", home=parallax_home)
    finally:
        del hold
        torch.cuda.empty_cache()
    assert result.returncode != 0
    assert "data_on_device on: the dataset's 28 MB of stored pixels do not fit" in result.stdout + result.stderr


# --- devices, batches, precision and recipe flags as only GPUs run them ---

def nvml_gpus_by_torch_index() -> dict[int, object]:
    """NVML's handle for each cuda:N (by UUID, so CUDA_VISIBLE_DEVICES and PCI bus order cannot mislead)."""
    import pynvml

    from contract import devices
    statuses = devices.gpu_statuses()
    if not statuses or any(s.uuid.startswith("MIG-") for s in statuses):
        pytest.skip("needs NVML and whole GPUs")
    return {s.index: pynvml.nvmlDeviceGetHandleByUUID(s.uuid) for s in statuses}


class GpusSeen:
    """Which processes NVML saw on which GPU while a run trained, polled every 0.2 s.

    ``by_rank``: per rank, the cuda indices its process appeared on; None where NVML names none of the run's
    processes: in a container NVML reports the host's PIDs, which the container's PID namespace does not show.
    ``most_at_once``: per cuda index, the most processes NVML saw on it in one poll, which needs no PIDs of ours."""

    def __init__(self, by_rank: dict[int, set[int]] | None, most_at_once: dict[int, int]):
        self.by_rank, self.most_at_once = by_rank, most_at_once

    def assert_each_rank_on(self, wanted: list[int]) -> None:
        """Rank r made a context on GPU ``wanted[r]`` only. Where the PIDs are hidden (a container): each of
        those GPUs held one process at a time and the others none, so no rank made a second context (which
        rank sat on which GPU is then left to the run's own record of its devices)."""
        if self.by_rank is not None:
            assert self.by_rank == {rank: {index} for rank, index in enumerate(wanted)}, self.by_rank
            return
        assert {index: count for index, count in self.most_at_once.items() if count} == \
            {index: 1 for index in wanted}, self.most_at_once


def train_watching_gpus(home, command: list[str], tmp_path, env_extra: dict | None = None,
                        timeout_s: float = 600) -> tuple[dict, GpusSeen]:
    """Run ``command`` (a ``trainer_backend run`` or a torchrun of one) to its end while NVML is asked
    every 0.2 s which processes hold a context on which GPU (``GpusSeen``)."""
    import os
    import subprocess
    import time

    import pynvml

    from tests.support import ROOT, run_dir

    handles = nvml_gpus_by_torch_index()
    env = {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    env.pop("PARALLAX_DB_URL", None)
    seen: dict[int, set[int]] = {}
    most_at_once = {index: 0 for index in handles}
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=err, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        try:
            while proc.poll() is None:
                assert time.monotonic() < deadline, "the run did not end in time"
                for index, handle in handles.items():
                    try:
                        processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                    except pynvml.NVMLError:
                        continue
                    most_at_once[index] = max(most_at_once[index], len({p.pid for p in processes}))
                    for process in processes:
                        seen.setdefault(process.pid, set()).add(index)
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    output = (tmp_path / "out.txt").read_text() + (tmp_path / "err.txt").read_text()
    assert proc.returncode == 0, output[-6000:]
    listed = run_cli("list", home=home).stdout.strip().splitlines()
    run = json.loads(run_cli("export", listed[0].split()[0].split("=")[1], home=home).stdout)
    assert run["status"] == "completed", run["error"]
    folder = run_dir(home, run["run_id"])
    pids = {int(p.name[len("rank"):-len(".pid")]): int(p.read_text()) for p in folder.glob("rank*.pid")}
    by_rank = {rank: seen.get(pid, set()) for rank, pid in pids.items()} \
        if any(pid in seen for pid in pids.values()) else None
    return run, GpusSeen(by_rank, most_at_once)


def engine_command(*flags: str) -> list[str]:
    import sys

    return [sys.executable, "-m", "trainer_backend", "run", "--dataset", "digits", "--model", "resnet18",
            "--epochs", "2", *flags]


@two_gpus
@pytest.mark.parametrize("strategy, devices", [("fsdp", "1,0"), ("pp", "1,0"), ("fsdp", "1"), ("ddp", "1,0")])
def test_each_rank_makes_a_context_on_its_own_gpu_only(parallax_home, tmp_path, strategy, devices):
    """Bound process groups: NCCL's communicators and the first barrier live on the rank's GPU, not
    on GPU rank % count (cuda:0 for rank 0 of --devices 1,0)."""
    run, gpus = train_watching_gpus(parallax_home, engine_command("--strategy", strategy, "--devices", devices,
                                                                  "--batch-size", "128"), tmp_path)
    gpus.assert_each_rank_on([int(d) for d in devices.split(",")])


@two_gpus
@pytest.mark.parametrize("batch_size", ["6", "7", "130"])
def test_dataparallel_batches_that_do_not_split_evenly(parallax_home, batch_size):
    """1437 images: a last batch of 3 (batch 6) would be 2 and 1 on two GPUs, and train-mode BatchNorm
    refuses a replica of one; batch 7 splits 4 and 3 every step; 130 leaves a last batch of 7."""
    run = train(parallax_home, "--strategy", "dp", "--devices", "0,1", "--batch-size", batch_size)
    assert set(run["epochs"][0]["peak_memory_mb"]) == {"cuda:0", "cuda:1"}


@one_gpu
@pytest.mark.parametrize("amp, arithmetic", [("off", "convolutions in TF32, matrix multiplies in fp32"),
                                             ("fp16", "autocast fp16")])
def test_mfu_of_amp_off_and_fp16_divides_by_the_peak_of_what_ran(parallax_home, amp, arithmetic):
    from trainer_backend.telemetry.flops import gpu_peak

    if torch.cuda.get_device_capability(0) < (8, 0) and amp == "off":
        arithmetic = "fp32 (no TF32 before Ampere)"
    run = train(parallax_home, "--strategy", "single", "--devices", "0", "--amp", amp)
    measured, extra = run["measurements"], run["epochs"][0]["extra"]
    dtype = "fp16" if amp == "fp16" else ("tf32" if torch.cuda.get_device_capability(0) >= (8, 0) else "fp32")
    found = gpu_peak(torch.cuda.get_device_name(0), dtype)
    if found is None:
        assert extra["mfu"] is None and arithmetic in " ".join(run["notes"])
        return
    assert measured["peak_source"] == f"{found[1]}: {arithmetic}" and measured["peak_tflops"] == found[0]
    assert 0 < extra["mfu"] <= 1
    assert not any("CPU peak" in note for note in run["notes"])


@one_gpu
def test_step_points_never_outrun_the_training_on_a_gpu(parallax_home):
    """The first window begins before step 1 is queued: no point above twice the best epoch's images/s
    (epoch 1's own figure is held down by cuDNN's algorithm search in its first step), and epoch 2's
    first point, which has no search in it, within twice its own epoch's."""
    run = train(parallax_home, "--strategy", "single", "--devices", "0", "--epochs", "3",
                env_extra={"PARALLAX_STEP_POINT_S": "0.05"})
    steps, _ = series_of(parallax_home, run)
    by_epoch = {e["epoch"]: e["images_per_s"] for e in run["epochs"]}
    assert len(steps) >= 6
    for step in steps:
        assert 0 < step["images_per_s"] <= 2 * max(by_epoch.values()), (step["step"], step["images_per_s"], by_epoch)
    first_of_2 = min((s for s in steps if s["epoch"] == 2), key=lambda s: s["step"])
    assert first_of_2["images_per_s"] <= 2 * by_epoch[2], (first_of_2, by_epoch)


@two_gpus
def test_model_parallel_step_losses_are_read_after_their_copy_lands(parallax_home):
    """mp: the losses and their host copy are on the last stage's GPU, and so is the event guarding it:
    a point read before its copy landed would hold pinned memory's stale values. The last stage sleeps on its
    GPU each step (tests/plugins/slow_last_stage.py), so that an event on the first stage's GPU would pass
    before the copy lands every time, not only when a race is lost."""
    run = train(parallax_home, "--strategy", "mp", "--devices", "0,1", "--epochs", "2", "--model",
                "parallax_slow_last_stage", "--image-size", "16",
                env_extra={"PARALLAX_STEP_POINT_S": "0.05", "PARALLAX_PLUGINS": "tests.plugins.slow_last_stage"})
    steps, _ = series_of(parallax_home, run)
    assert steps and all(math.isfinite(s["train_loss"]) and s["train_loss"] > 0 for s in steps)
    for epoch in run["epochs"]:
        losses = [s["train_loss"] for s in steps if s["epoch"] == epoch["epoch"]]
        assert min(losses) <= epoch["train_loss"] <= max(losses)


SPEED_SWITCHES = ("--compile", "--channels-last")


@one_gpu
@pytest.mark.parametrize("switches", [("--compile",), ("--channels-last",), SPEED_SWITCHES])
def test_speed_switches_on_a_single_gpu(parallax_home, switches):
    run = train(parallax_home, "--strategy", "single", "--devices", "0", "--epochs", "2", *switches)
    assert [e["epoch"] for e in run["epochs"]] == [1, 2]
    if "--compile" in switches:
        assert run["measurements"]["compile_time_s"] > 0
        assert any(note.startswith("torch.compile:") for note in run["notes"])


@two_gpus
@pytest.mark.parametrize("switches", [("--compile",), ("--channels-last",), SPEED_SWITCHES])
def test_speed_switches_under_ddp_over_two_gpus(parallax_home, switches):
    run = train(parallax_home, "--strategy", "ddp", "--devices", "0,1", "--batch-size", "128", *switches)
    assert set(run["epochs"][0]["peak_memory_mb"]) == {"cuda:0", "cuda:1"}
    if "--compile" in switches:
        assert run["measurements"]["compile_time_s"] > 0


@two_gpus
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "dp"])
def test_fp16_with_a_gradient_scaler_over_two_gpus(parallax_home, strategy):
    """The scaler's skipped steps must be the same on every rank (the gradients it checks are reduced,
    or sharded DTensors): a rank that stepped while another skipped would leave them apart."""
    run = train(parallax_home, "--strategy", strategy, "--devices", "0,1", "--batch-size", "128", "--amp", "fp16",
                "--image-size", "64", "--epochs", "2", "--grad-clip", "1.0")
    for epoch in run["epochs"]:
        assert epoch["extra"]["forward_dtype"] == "float16"
        assert 0 < epoch["extra"]["grad_scale"] <= 2.0**16
    assert run["epochs"][-1]["train_loss"] < run["epochs"][0]["train_loss"]  # it learns


@two_gpus
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_accumulation_and_clipping_over_nccl(parallax_home, strategy):
    run = train(parallax_home, "--strategy", strategy, "--devices", "0,1", "--batch-size", "64",
                "--accumulate-steps", "2", "--grad-clip", "0.5", "--epochs", "2")
    assert run["measurements"]["effective_batch"] == 128
    assert run["epochs"][-1]["train_loss"] < run["epochs"][0]["train_loss"]


@one_gpu
def test_augmentation_draws_from_a_cuda_generator(parallax_home):
    run = train(parallax_home, "--strategy", "single", "--devices", "0", "--augment", "flip,crop", "--epochs", "2")
    assert run["config"]["augment"] == "flip,crop"
    assert all(0 < e["train_acc"] <= 1 for e in run["epochs"])


@two_gpus
def test_batchnorm_reestimation_with_buffers_broadcast_over_nccl(parallax_home):
    """Every rank re-estimates over the same images and rank 0's buffers are broadcast: the saved
    checkpoint, evaluated in one process, scores what the run recorded for its best epoch."""
    from tests.support import evaluate_checkpoint

    run = train(parallax_home, "--strategy", "ddp", "--devices", "0,1", "--batch-size", "128",
                "--bn-stats-images", "512", "--epochs", "2")
    best = max(run["epochs"], key=lambda e: e["val_acc"])
    _, accuracy, _, images = evaluate_checkpoint(parallax_home, run)
    assert images == 360
    assert accuracy == pytest.approx(best["val_acc"], abs=3 / 360)  # GPU and CPU kernels differ in rounding


@two_gpus
@pytest.mark.parametrize("strategy, ranks", [("dp", [0]), ("pp", [0, 1]), ("fsdp", [0, 1])])
def test_profiler_under_dp_pp_and_fsdp_on_two_gpus(parallax_home, strategy, ranks):
    run = train(parallax_home, "--strategy", strategy, "--devices", "0,1", "--batch-size", "128", "--profile",
                "--profile-active", "2")
    ops, steps = profiled_steps(parallax_home, run)
    assert any(op["self_device_us"] > 0 for op in ops), "no kernel with device time"
    assert sorted({s["rank"] for s in steps}) == ranks
    for step in steps:
        assert sum(step[f] for f in PHASE_FIELDS) <= step["total_ms"] * (1 + 1e-6)


@one_gpu
def test_nvml_readings_follow_cuda_visible_devices_given_as_a_uuid_and_as_a_subset(parallax_home):
    """cuda:0 of a process started with CUDA_VISIBLE_DEVICES=<the last GPU> is that GPU: the picker,
    the samples and the energy counter read it, not NVML's GPU 0."""
    import os
    import subprocess
    import sys

    from tests.support import ROOT
    from contract import devices
    statuses = devices.gpu_statuses()
    if not statuses or any(s.uuid.startswith("MIG-") for s in statuses):
        pytest.skip("needs NVML and whole GPUs (a MIG slice has no NVML readings of its own)")
    last = statuses[-1]
    # Where this test itself runs under CUDA_VISIBLE_DEVICES (every Slurm node sets it), cuda:N is the N-th GPU
    # that list names: the child is given that entry, not N, which would name another GPU.
    visible_here = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    by_index = visible_here[last.index] if visible_here else str(last.index)
    probe = ("import json, torch\nfrom contract import devices\n"
             "print(json.dumps([[s.index, s.uuid] for s in devices.gpu_statuses()] + "
             "[str(torch.cuda.get_device_properties(0).uuid)]))")
    for visible in (last.uuid, by_index):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible, "CUDA_DEVICE_ORDER": devices.DEVICE_ORDER}
        done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        *seen, torch_uuid = json.loads(done.stdout.strip().splitlines()[-1])
        assert seen == [[0, last.uuid]], (visible, seen)
        assert torch_uuid.lower().removeprefix("gpu-") == last.uuid.lower().removeprefix("gpu-")
        run = train(parallax_home, "--strategy", "single", "--devices", "0",
                    env_extra={"CUDA_VISIBLE_DEVICES": visible, "PARALLAX_SAMPLE_S": "0.2"})
        _, samples = series_of(parallax_home, run)
        gpus = [g for s in samples for g in s["gpus"]]
        assert gpus and {g["index"] for g in gpus} == {0}
        assert max(g["memory_used_mb"] or 0 for g in gpus) > 0
        assert run["epochs"][0]["extra"]["energy_j"]["gpu0"] > 0


@two_gpus
def test_torchrun_maps_local_ranks_to_gpus_and_a_restart_resumes(parallax_home, tmp_path):
    import sys

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--max-restarts", "1", "-m", "trainer_backend", "run", "--dataset", "digits",
               "--model", "parallax_fails_in_epoch2_once", "--image-size", "32", "--epochs", "3",
               "--strategy", "ddp", "--devices", "cuda"]
    run, gpus = train_watching_gpus(parallax_home, command, tmp_path,
                                    env_extra={"PARALLAX_PLUGINS": "tests.plugins.failing_model"})
    assert [e["epoch"] for e in run["epochs"]] == [1, 2, 3]
    assert "Resumed at epoch 2 after restart 1 of the torchrun job, from the checkpoint of epoch 1." in run["notes"]
    assert set(run["epochs"][-1]["peak_memory_mb"]) == {"cuda:0", "cuda:1"}
    gpus.assert_each_rank_on([0, 1])  # LOCAL_RANK r on cuda:r, and nowhere else


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
    # The digits (28 MB at 128 px) are kept on the GPU, and the run's estimate counts them there.
    kept = any("of stored pixels are kept on cuda:0" in note for note in run["notes"])
    assert kept and estimate["cuda:0"]["data_mb"] == pytest.approx(28.1, abs=0.1), (run["notes"], estimate)
    for device, parts in estimate.items():
        assert parts["total_mb"] == pytest.approx(peaks[device], rel=0.10), (device, parts, peaks, run["notes"])


WORKSPACE_PROBE = """
import json, torch
from trainer_backend.rank.forecast.memory_estimate import cublas_workspace_bytes
layer = torch.nn.Linear(64, 64).cuda()
images = torch.randn(32, 64, device="cuda")
before = torch.cuda.memory_allocated()
layer(images).sum().backward()  # forward in this thread, backward in autograd's
print(json.dumps({"added": torch.cuda.memory_allocated() - before, "gradients": 4 * (64 * 64 + 64),
                  "workspace": cublas_workspace_bytes(torch.cuda.get_device_capability(0))}))
"""


@one_gpu
def test_a_linear_layers_step_takes_the_two_cublas_workspaces_the_estimate_counts():
    """A fresh process: what a step of a linear layer leaves allocated is its gradients and one workspace
    for each of the two threads that ran a product, as ``cublas_workspace_bytes`` sizes them; cuBLASLt's
    own 1 MiB per handle, which the estimate leaves out, may come on top."""
    import subprocess
    import sys

    from tests.support import ROOT

    done = subprocess.run([sys.executable, "-c", WORKSPACE_PROBE], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    probe = json.loads(done.stdout)
    workspaces = probe["added"] - probe["gradients"]
    assert 2 * probe["workspace"] <= workspaces <= 2 * probe["workspace"] + 2 * 2**20 + 64 * 1024, probe


# --- JPEGs decoded on the GPU (decode workers) ---

@one_gpu
@pytest.mark.usefixtures("own_data_dir")
def test_a_jpeg_folder_trains_decoded_on_the_gpu_as_the_cpu_decodes_it(parallax_home, tmp_path):
    from tests.trainer_backend.datasets.test_streaming_decode import make_jpeg_folder

    from trainer_backend.datasets import prepare_data
    from trainer_backend.datasets.streaming import place_decoding

    folder = tmp_path / "jpegs"
    make_jpeg_folder(folder, 40, 40)
    result = run_cli("run", "--dataset", str(folder), "--model", "test_resnet", "--image-size", "32", "--epochs", "1",
                     "--batch-size", "16", "--decode", "workers", "--num-workers", "1", "--strategy", "single",
                     "--devices", "0", "--bn-stats-images", "0", home=parallax_home)
    assert result.returncode == 0, result.stdout + result.stderr
    run = run_of(parallax_home, result)
    assert run["status"] == "completed" and math.isfinite(run["epochs"][0]["train_loss"])
    assert any(note.startswith("JPEGs are decoded on cuda:0") for note in run["notes"]), run["notes"]

    data = prepare_data(str(folder), image_size=32, decode="workers")
    placed, note = place_decoding(data, torch.device("cuda:0"), workers=1)
    assert placed.train.output == "encoded", note
    picked = list(range(len(data.train)))
    encoded, _ = placed.train.__getitems__(picked)
    on_gpu = placed.train.normalise.stored_pixels(encoded.pin_memory().to("cuda:0"))
    assert on_gpu.device.type == "cuda" and on_gpu.dtype == torch.uint8
    stored, _ = data.train.__getitems__(picked)
    # nvJPEG and libjpeg round their transforms and upsample chroma differently: a level or so on
    # average, more only along hard colour edges.
    levels = (on_gpu.cpu().float() - stored.float()).abs()
    quantiles = torch.quantile(levels.flatten(), torch.tensor([0.5, 0.9, 0.99, 0.999])).tolist()
    spread = (levels.mean().item(), quantiles, levels.max().item())
    # On an H100 the mean was 0.87 of a level and the largest difference 84 levels.
    assert levels.mean() < 1.5 and (levels > 16).float().mean() < 0.02, spread
    images = placed.train.normalise(encoded.to("cuda:0"))
    # ... and the GPU normalises the pixels it decoded as the CPU normalises the same pixels.
    assert torch.allclose(images.cpu(), data.train.normalise(on_gpu.cpu()), atol=1e-4)


def jpeg_bytes(folder) -> list[torch.Tensor]:
    return [torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8) for path in sorted(folder.rglob("*.jpg"))]


@one_gpu
def test_a_gpu_decode_leaves_the_gradients_of_the_step_queued_before_it_intact(tmp_path):
    """Step k's backward is queued behind a long kernel when batch k+1 is decoded, as when the host runs
    ahead. Its activations and gradient buffers are freed on the host as backward is queued, while the
    queued kernels still read them: decoded on the training stream, nvJPEG could be handed those blocks
    and write pixels into them before backward has read them (pytorch/vision#9606). The blocks here are
    the decoded images' size (12 x 4096 float32 = 3 x 256 x 256 bytes), which makes that likely; the
    step's gradients must be those of the same step run with nothing decoded behind it."""
    from torch import nn

    from tests.trainer_backend.datasets.test_streaming_decode import make_jpeg_folder
    from trainer_backend.datasets.device_decode import DeviceJpegDecode

    device = torch.device("cuda:0")
    make_jpeg_folder(tmp_path / "jpegs", 8, 256)  # baseline JPEGs: nvJPEG's hardware decoder where there is one
    files = jpeg_bytes(tmp_path / "jpegs")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                          nn.Linear(4096, 1)).to(device)
    inputs = torch.randn(12, 4096, device=device)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(inputs).square().mean().backward()

    decode = DeviceJpegDecode(256, lambda pixels: pixels)
    decode.decoded(files, device)  # the decoder's one-off set-up, outside the window below
    step()
    torch.cuda.synchronize()
    reference = [parameter.grad.clone() for parameter in model.parameters()]
    wrong = 0
    for _ in range(30):
        torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time ahead of the step's kernels
        step()
        images = decode.decoded(files, device)
        torch.cuda.synchronize()
        wrong += not all(torch.allclose(parameter.grad, expected, rtol=1e-4, atol=1e-6)
                         for parameter, expected in zip(model.parameters(), reference))
        assert len(images) == len(files) and images[0].shape == (3, 256, 256)
    assert wrong == 0, f"{wrong} of 30 steps had their gradients overwritten by the decode behind them"


def one_epoch_under_sync_debug(data, config, folder) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """One epoch of ``data`` (a PreparedData) on the config's GPU as Parallax builds it, with what a run adds
    to each step (the NaN guard, the step hooks writing step points to a run, the stop check: bench/gpu.py's
    StepExtras, in ``folder``), then its validation, with CUDA's sync debug mode at "error" from the first
    training step to the last and through validation: any blocking copy or read of the device raises. (The
    epoch's own synchronising reads of the clock, before the first step and after the last, are outside it.)"""
    from unittest import mock

    from bench.gpu import StepExtras

    from trainer_backend.rank import loop
    from trainer_backend.rank.inputs import DeviceInputs
    from trainer_backend.rank.loop import synchronize, train_one_epoch, validate
    from trainer_backend.rank.models import create_model
    from trainer_backend.rank.schedule import build_optimizer
    from trainer_backend.rank.strategies import Strategy
    from trainer_backend.rank.trainer import build_loaders

    strategy = Strategy(config)
    strategy.setup()
    model = strategy.wrap(create_model(config.model, num_classes=data.info.num_classes, in_chans=data.info.in_chans))
    strategy.inputs = DeviceInputs.for_run(config, data.train.normalise, strategy.input_device)
    train_loader, val_loader = build_loaders(data, config, strategy)
    optimizer = build_optimizer(config, model.parameters())
    steps: list[int] = []

    def clock_read(devices) -> None:  # the epoch's own: the mode goes back to default for it
        torch.cuda.set_sync_debug_mode(0)
        synchronize(devices)

    extras = StepExtras(strategy, folder)
    wired = extras.for_epoch(1, train_loader, optimizer)
    hooks, begin = wired.pop("on_step"), wired.pop("on_start")

    def on_step(step: int, total_steps: int) -> None:
        steps.append(step)
        hooks(step, total_steps)

    def on_start() -> None:
        begin()
        torch.cuda.set_sync_debug_mode("error")

    try:
        with mock.patch.object(loop, "synchronize", clock_read):
            totals, _ = train_one_epoch(model, train_loader, optimizer, strategy, on_step=on_step, on_start=on_start,
                                        **wired)
        torch.cuda.set_sync_debug_mode("error")
        val_totals = validate(model, val_loader, strategy)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    extras.close()
    return steps, totals.cpu(), val_totals.cpu()


@one_gpu
@pytest.mark.usefixtures("own_data_dir")
def test_a_dataset_kept_on_the_gpu_trains_and_validates_without_a_sync(parallax_home):
    """digits, kept whole on the GPU: 23 training steps and 6 validation batches, each gathered on the
    device from positions copied without a wait, with no blocking read (the confusion counts included)."""
    from contract.config import RunConfig
    from trainer_backend.datasets import PreparedData
    from trainer_backend.rank.trainer import load_data

    config = RunConfig(dataset="digits", model="test_resnet", image_size=32, batch_size=64, devices="0",
                       bn_stats_images=0)
    host = load_data(config)
    device = torch.device("cuda:0")
    data = PreparedData(host.train.to_device(device), host.val.to_device(device), host.info)
    steps, totals, val_totals = one_epoch_under_sync_debug(data, config, parallax_home)
    assert len(steps) >= 20 and totals[2].item() == len(data.train)
    assert val_totals[2].item() == len(data.val) and val_totals[3:].sum().item() == len(data.val)


@one_gpu
@pytest.mark.processes  # a loader worker reads the files
@pytest.mark.usefixtures("own_data_dir")
def test_jpegs_of_mixed_sizes_decoded_on_the_gpu_train_and_validate_without_a_sync(parallax_home, tmp_path):
    """A folder of JPEGs of five sizes, decoded on the GPU from the bytes a loader worker read: 20
    training steps and the validation, none waiting for the device (the resize of each size and the
    batch put back in order included)."""
    import numpy as np
    from PIL import Image

    from contract.config import RunConfig
    from trainer_backend.datasets import prepare_data
    from trainer_backend.datasets.streaming import place_decoding

    folder, rng = tmp_path / "jpegs", np.random.default_rng(0)
    for i in range(200):
        size = 36 + 4 * (i % 5)
        (folder / "ab"[i % 2]).mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        Image.fromarray(pixels, "RGB").save(folder / "ab"[i % 2] / f"{i}.jpg", quality=90)
    config = RunConfig(dataset=str(folder), model="test_resnet", image_size=32, batch_size=8, devices="0",
                       decode="workers", num_workers=1, bn_stats_images=0, val_fraction=0.2)
    data, note = place_decoding(prepare_data(str(folder), image_size=32, decode="workers"), torch.device("cuda:0"),
                                workers=1)
    assert data.train.output == "encoded", note
    steps, totals, val_totals = one_epoch_under_sync_debug(data, config, parallax_home)
    assert len(steps) == 20 and totals[2].item() == len(data.train) == 160
    assert val_totals[2].item() == len(data.val) == 40


@one_gpu
def test_the_nan_check_reads_nothing_on_the_host_between_its_check_points():
    """--on-nonfinite stop on a GPU: 40 steps' observe and check under sync debug mode "error" (any implicit
    host-device sync raises), a NaN at step 20 stopping the epoch by step 20 + 2 checks, naming step 20."""
    from contract.config import RunConfig
    from trainer_backend.rank.divergence import CUDA_CHECK_EVERY, NonfiniteGuard, TrainingDiverged
    from trainer_backend.rank.strategies import Strategy

    strategy = Strategy(RunConfig(strategy="single", devices="0"))
    model = torch.nn.Linear(4, 1).cuda()
    watch = NonfiniteGuard("stop", strategy)
    watch.start_epoch(1, 100, torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.randn(8, 4, device="cuda")
    stopped_at = None
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(1, 61):
            loss = model(x).pow(2).mean() * (float("nan") if step == 20 else 1.0)
            watch.observe(step, loss, 8)
            try:
                watch.check(step)
            except TrainingDiverged as exc:
                stopped_at, reason = step, str(exc)
                break
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert stopped_at is not None and 20 < stopped_at <= 20 + 2 * CUDA_CHECK_EVERY
    assert reason.startswith("loss became NaN at epoch 1 step 20 (lr 0.1)")


@one_gpu
def test_the_batchnorm_re_estimate_reads_nothing_on_the_host():
    """The statistics re-estimated before validation, on a GPU, under sync debug mode "error": BatchNorm's
    own cumulative mode would read its batch count on the host in every layer and batch."""
    from trainer_backend.rank.batchnorm import reestimate

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3), torch.nn.BatchNorm2d(8)).cuda()
    batches = [(torch.randn(16, 3, 32, 32, device="cuda"), None) for _ in range(5)]
    torch.cuda.set_sync_debug_mode("error")
    try:
        assert reestimate(model, batches, lambda images, labels: model(images)) is True
    finally:
        torch.cuda.set_sync_debug_mode(0)
    expected = torch.stack([model[0](images).mean(dim=(0, 2, 3)) for images, _ in batches]).mean(dim=0)
    assert torch.allclose(model[1].running_mean, expected, atol=1e-4)


# --- the stop check, SIGTERM's grace, resume, the SDK and the NaN guard as GPUs run them ---

def nccl_world_of_one(tmp_path):
    """This process as a world of one on cuda:0 over NCCL, torn down by the caller."""
    import torch.distributed as dist

    torch.cuda.set_device(0)
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda:0"))
    return dist


@one_gpu
def test_the_stop_check_reads_nothing_on_the_host_on_the_steps_path(tmp_path, signals):
    """60 optimizer steps with a look after each, its all-reduce over NCCL, under sync debug mode "error" (any
    blocking copy or read raises): the request is taken two looks after it was made, on the step after."""
    from types import SimpleNamespace

    from trainer_backend.rank.stopping import STOP_FILE, StopRequest

    dist = nccl_world_of_one(tmp_path)
    try:
        stop = StopRequest(tmp_path, SimpleNamespace(output_device=torch.device("cuda:0"), is_main=True), every_s=0.0)
        model = torch.nn.Linear(64, 64).cuda()
        x = torch.randn(256, 64, device="cuda")
        stopped = None
        torch.cuda.set_sync_debug_mode("error")
        try:
            for step in range(1, 61):
                model(x).square().mean().backward()
                if step == 30:
                    (tmp_path / STOP_FILE).touch()
                if stop(step, 100):
                    stopped = step
                    break
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert stopped == 31
    finally:
        dist.destroy_process_group()


SIGTERM_IN_A_KERNEL = """
import os, signal, sys, time, torch
from trainer_backend.rank import stopping
recorded = sys.argv[1]
escalate = (lambda signum, frame: None) if sys.argv[2] == "rank0" else None
stopping.stop_on_sigterm(escalate, grace_s=float(sys.argv[3]))
stopping.when_blocked(lambda grace_s: open(recorded, "w").write(f"blocked {grace_s}"))
torch.cuda._sleep(10)  # the context, before the clock
print("in the kernel", flush=True)
torch.cuda._sleep(int(60 * 1.5e9))  # about a minute of one kernel
torch.cuda.synchronize()  # the main thread waits in C for it
"""


def sigterm_during_a_kernel(tmp_path, role: str, grace_s: float = 2.0) -> tuple[int, float, str]:
    """A process in a minute-long CUDA kernel gets SIGTERM: (its exit status, seconds to its end, what it
    recorded from the grace's thread)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.support import ROOT

    recorded = tmp_path / f"{role}.txt"
    child = subprocess.Popen([sys.executable, "-c", SIGTERM_IN_A_KERNEL, str(recorded), role, str(grace_s)],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "in the kernel", child.stderr.read()
        time.sleep(0.5)
        signalled = time.monotonic()
        os.kill(child.pid, signal.SIGTERM)
        code = child.wait(timeout=60)
        return code, time.monotonic() - signalled, recorded.read_text() if recorded.exists() else ""
    finally:
        if child.poll() is None:
            child.kill()


@one_gpu
@pytest.mark.processes
@pytest.mark.parametrize("role", ["rank0", "other"])
def test_a_sigterm_during_a_long_cuda_kernel_ends_the_process_within_the_grace(tmp_path, role):
    """Python's SIGTERM handler waits for the kernel (a minute); the grace's thread does not: rank 0 records
    from it and ends with 128 + SIGTERM, any other rank by SIGALRM, each within the grace and 2 s."""
    import signal

    code, took_s, recorded = sigterm_during_a_kernel(tmp_path, role)
    assert took_s <= 2.0 + 2.0, took_s
    if role == "rank0":
        assert code == 128 + signal.SIGTERM and recorded == "blocked 2.0", (code, recorded)
    else:
        assert code == -signal.SIGALRM and recorded == "", (code, recorded)


@two_gpus
@pytest.mark.processes
def test_two_nccl_ranks_restore_a_point_each_can_read_without_sending_it_through_the_gpus(tmp_path):
    from tests.support import run_world
    from tests.trainer_backend.rank.test_resume_ranks import WORLD_TIMEOUT_S, _points_world

    out = tmp_path / "rank0.json"
    run_world(_points_world, 2, str(tmp_path), str(out), "cuda", timeout_s=WORLD_TIMEOUT_S)
    for rank in json.loads(out.read_text())["ranks"]:
        shared = rank["shared"]
        assert shared["carried"] == [] and shared["start_epoch"] == 3 and shared["weights"] and shared["draws"], rank
        assert rank["rank 1 lacks it"]["weights"] and rank["rank 1 lacks it"]["draws"], rank


PROFILED_SCRIPT = """
import json, sys, torch, parallax
run = parallax.init(project="gpu", name="one visible GPU")
model = torch.nn.Linear(256, 256).cuda()
x = torch.randn(512, 256, device="cuda")
with parallax.profile(wait=0, warmup=0, active=2) as prof:
    for step in range(2):
        with prof.range("forward"):
            loss = model(x).square().mean()
        loss.backward()
        prof.step()
torch.cuda.synchronize()
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    for step in range(5):
        parallax.log({"loss": loss * step})
    torch.cuda.set_sync_debug_mode(0)
print(json.dumps({"run_id": run.run_id, "expected": [float(loss) * step for step in range(5)],
                  "syncs": sum("synchroniz" in str(w.message) for w in caught)}))
parallax.finish()
"""


@one_gpu
@pytest.mark.processes
def test_the_sdk_profiles_the_one_gpu_a_task_sees_and_reads_a_cuda_tensor_once_per_log(parallax_home, tmp_path):
    """As under srun --gpus-per-task: one visible GPU, LOCAL_RANK=3. The profile's phases wait for cuda:0 (the
    current device), and the window is stored; log reads a CUDA tensor once per call, on the calling thread
    (docs/OWN_SCRIPT.md), and stores its value."""
    import os
    import subprocess
    import sys

    from db import make_engine, profiles, script_metrics
    from tests.support import ROOT

    script = tmp_path / "train.py"
    script.write_text(PROFILED_SCRIPT)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    env = {**os.environ, "PARALLAX_HOME": str(parallax_home), "CUDA_VISIBLE_DEVICES": visible, "LOCAL_RANK": "3",
           "PYTHONPATH": str(ROOT)}
    env.pop("PARALLAX_DB_URL", None)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    engine = make_engine(f"sqlite:///{parallax_home / 'parallax.db'}")
    assert profiles.profiled_runs(engine, [result["run_id"]]) == {result["run_id"]}
    assert result["syncs"] == 5  # one read a call, on the training thread
    values = [p["value"] for p in script_metrics.read_points(engine, [result["run_id"]], max_points=None)]
    assert values == pytest.approx(result["expected"], rel=1e-6)


@two_gpus
@pytest.mark.parametrize("nan_step", [0, 30])
def test_the_nan_guard_under_model_parallel_reads_its_check_after_the_copy_on_the_last_gpu(parallax_home, nan_step):
    """mp over two GPUs, the last stage sleeping on its GPU each step (tests/plugins/slow_last_stage.py): a
    finite run is never stopped (a read before the copy lands would see pinned memory's stale bytes), and a NaN
    at step 30 (epoch 2, step 7) stops the run naming that step."""
    flags = ("run", "--dataset", "digits", "--model", "parallax_slow_last_stage", "--image-size", "16",
             "--batch-size", "64", "--epochs", "3", "--strategy", "mp", "--devices", "0,1", "--bn-stats-images", "0",
             "--on-nonfinite", "stop")
    result = run_cli(*flags, home=parallax_home, env_extra={"PARALLAX_PLUGINS": "tests.plugins.slow_last_stage",
                                                           "PARALLAX_TEST_NAN_STEP": str(nan_step)})
    run = run_of(parallax_home, result)
    if nan_step == 0:
        assert run["status"] == "completed" and [e["epoch"] for e in run["epochs"]] == [1, 2, 3], run["error"]
    else:
        assert run["status"] == "failed" and run["error"].startswith("loss became NaN at epoch 2 step 7"), run["error"]
        assert [e["epoch"] for e in run["epochs"]] == [1]


@one_gpu
def test_a_job_stopped_at_a_step_on_a_gpu_resumes_as_an_uninterrupted_twin_trains(parallax_home):
    """torchrun on one GPU (NCCL) with --max-restarts 1, told to stop in epoch 2 (the file Slurm's warning
    touches): the next attempt continues at the next step with every rank's augmentation generators where they
    were, each epoch is recorded once and matches a twin never stopped (to GPU round-off), and the resumed
    epoch's energy is divided by the images trained since the resume."""
    import os
    import subprocess
    import sys

    from tests.support import ROOT
    from tests.trainer_backend.supervisor.test_torchrun import runs_of
    from trainer_backend.rank.stopping import STOP_CHECK_ENV

    flags = ["--dataset", "digits", "--model", "parallax_asks_to_stop", "--image-size", "32", "--epochs", "3",
             "--strategy", "ddp", "--batch-size", "32", "--augment", "flip,crop", "--bn-stats-images", "0"]
    env = {**os.environ, "PARALLAX_HOME": str(parallax_home), "PARALLAX_PLUGINS": "tests.plugins.stop_asking_model",
           "PARALLAX_TEST_ASK_AT": str(45 + 7), STOP_CHECK_ENV: "1e-6"}
    env.pop("PARALLAX_DB_URL", None)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                           "--max-restarts", "1", "-m", "trainer_backend", "run", *flags, "--devices", "cuda"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    (run,) = runs_of(parallax_home)
    assert run["status"] == "completed" and [e["epoch"] for e in run["epochs"]] == [1, 2, 3], run["error"]
    assert any(n.startswith("The job was told to stop and stopped after step") for n in run["notes"]), run["notes"]
    twin = run_cli("run", *flags, "--devices", "0", home=parallax_home, env_extra={
        "PARALLAX_PLUGINS": "tests.plugins.stop_asking_model", "PARALLAX_TEST_ASK_AT": "0"})
    assert twin.returncode == 0, twin.stderr
    straight = run_of(parallax_home, twin)
    for resumed, uninterrupted in zip(run["epochs"], straight["epochs"], strict=True):
        for field in ("train_loss", "val_loss"):  # redrawn augmentations would move them by percents
            assert resumed[field] == pytest.approx(uninterrupted[field], rel=2e-3), (resumed["epoch"], field)
        for field in ("train_acc", "val_acc"):  # a few images either way at most
            assert resumed[field] == pytest.approx(uninterrupted[field], abs=3e-3), (resumed["epoch"], field)
    second = run["epochs"][1]
    joules = sum((second["extra"].get("energy_j") or {}).values())
    if joules:  # NVML's energy counter
        step = int(next(n for n in run["notes"] if n.startswith("Resumed at step")).split()[3]) - 1
        images = round(second["images_per_s"] * second["train_time_s"]) - step * 32
        assert second["extra"]["energy_j_per_image"] == pytest.approx(joules / images, rel=1e-6)
