"""The CUDA paths' decisions, exercised on CPU: what only a GPU can provide (its compute capability,
its count, CUDA streams for DataParallel's threads) is faked at that edge and nowhere else."""

from __future__ import annotations

import copy
import json
import importlib
import threading
import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn

import contract.config as config_module
from trainer_backend.rank import resume
from contract.config import RunConfig
from trainer_backend.rank.loop import resolve_amp
from trainer_backend.supervisor.preflight import OOM_HINT, with_oom_hint
from trainer_backend.rank.strategies import DataParallelStrategy, DistributedStrategy, Strategy
from trainer_backend.rank.trainer import build_loaders, load_data

CUDA0 = torch.device("cuda:0")


@pytest.fixture
def two_gpus(monkeypatch):
    """Configs naming cuda:0 and cuda:1 validate as on a two-GPU machine."""
    monkeypatch.setattr(config_module, "cuda_device_count", lambda: 2)


# --- AMP auto ---

@pytest.mark.parametrize("capability, expected", [((7, 5), torch.float16), ((6, 1), torch.float16),
                                                  ((8, 0), torch.bfloat16), ((9, 0), torch.bfloat16)])
def test_amp_auto_takes_bf16_only_from_ampere_on(monkeypatch, capability, expected):
    # torch.cuda.is_bf16_supported() says yes on a T4 too (emulated bf16): it must not decide.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert resolve_amp("auto", CUDA0) == expected


def test_amp_modes_asked_for_by_name_are_kept(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert resolve_amp("bf16", CUDA0) == torch.bfloat16
    assert resolve_amp("fp16", CUDA0) == torch.float16
    assert resolve_amp("off", CUDA0) is None and resolve_amp("auto", torch.device("cpu")) is None


@pytest.fixture
def ampere_beside_turing(two_gpus, monkeypatch, request):
    """cuda:0 has bf16 tensor cores (8.0), cuda:1 not (7.5): as NVML reports them, or (NVML absent)
    as torch does. Where NVML answers, torch must not be asked: that would start a CUDA context."""
    from contract import devices as devices_module

    capabilities = {0: (8, 0), 1: (7, 5)}
    if request.param == "nvml":
        monkeypatch.setattr(devices_module, "gpu_statuses", lambda: [
            devices_module.GpuStatus(index, "GPU", 16000.0, 0.0, None, compute_capability=capability)
            for index, capability in capabilities.items()])

        def not_asked(device=None):
            raise AssertionError("torch asked for a capability NVML gave")

        monkeypatch.setattr(torch.cuda, "get_device_capability", not_asked)
    else:
        monkeypatch.setattr(devices_module, "gpu_statuses", lambda: [])
        monkeypatch.setattr(torch.cuda, "get_device_capability",
                            lambda device=None: capabilities[torch.device(device).index if not isinstance(device, int)
                                                             else device])
    return capabilities


@pytest.mark.parametrize("ampere_beside_turing", ["nvml", "torch"], indirect=True)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "dp"])
def test_amp_auto_is_one_dtype_for_every_rank_from_the_weakest_listed_gpu(ampere_beside_turing, strategy):
    """A DDP rank in fp16 with a gradient scaler beside one in bf16 without: the averaged gradients
    mix scaled and unscaled ones and the replicas diverge. Every rank takes the weakest GPU's dtype."""
    from trainer_backend.rank.loop import rank_amp_dtype, with_resolved_amp

    config = RunConfig(strategy=strategy, devices=("cuda:0", "cuda:1"), batch_size=64, amp="auto")
    dtypes = [rank_amp_dtype(config, torch.device(device)) for device in config.devices]
    assert dtypes == [torch.float16, torch.float16]
    assert with_resolved_amp(config).amp == "fp16"  # what the launcher stores for the run
    # The same order of devices the other way round, and a world of Ampere GPUs alone.
    assert with_resolved_amp(config.replace(devices=("cuda:1", "cuda:0"))).amp == "fp16"
    assert with_resolved_amp(config.replace(strategy="single", devices=("cuda:0",))).amp == "bf16"
    assert with_resolved_amp(config.replace(amp="bf16")).amp == "bf16"  # asked for by name: kept


@pytest.mark.parametrize("ampere_beside_turing", ["torch"], indirect=True)
def test_a_pipeline_that_cannot_scale_fp16_resolves_amp_auto_to_fp32_on_every_stage(ampere_beside_turing):
    from trainer_backend.rank.loop import rank_amp_dtype, with_resolved_amp

    config = RunConfig(strategy="pp", devices=("cuda:0", "cuda:1"), batch_size=64, amp="auto")
    assert with_resolved_amp(config).amp == "off"
    assert [rank_amp_dtype(config, torch.device(d)) for d in config.devices] == [None, None]


def test_torchrun_resolves_amp_auto_from_every_machines_gpus():
    """Each process of a torchrun job tells the others its GPU's capability when it joins; every
    process resolves the same dtype from all of them (another machine's GPUs cannot be asked)."""
    from trainer_backend.rank.loop import with_resolved_amp

    joined = RunConfig(strategy="ddp", devices=("cuda:0", "cuda:0"), nodes=2, batch_size=64, amp="auto")
    assert with_resolved_amp(joined, [(9, 0), (7, 0)]).amp == "fp16"
    assert with_resolved_amp(joined, [(9, 0), (8, 6)]).amp == "bf16"
    assert with_resolved_amp(joined).amp == "auto"  # not guessed from this machine's GPUs alone


@pytest.mark.parametrize("ampere_beside_turing", ["nvml"], indirect=True)
def test_the_run_row_shows_the_dtype_resolved_before_the_ranks_start(ampere_beside_turing, engine):
    from db import store
    from trainer_backend.supervisor.runner import resolve_stored_amp

    config = RunConfig(strategy="ddp", devices=("cuda:0", "cuda:1"), batch_size=64, amp="auto")
    run_id = store.create_run(engine, config.to_dict(), status="queued", world_size=2)
    resolved = resolve_stored_amp(engine, run_id, config)
    assert resolved.amp == "fp16" and store.get_run(engine, run_id).config == resolved.to_dict()
    assert RunConfig.from_dict(store.get_run(engine, run_id).config).replace(amp="auto") == config


# --- DataParallel ---

def test_dataparallel_loader_takes_the_whole_global_batch(two_gpus, parallax_home):
    """DataParallel splits each batch over its GPUs itself: its loader must yield the global batch,
    taking as many steps per epoch as single does at the same --batch-size."""
    single = RunConfig(strategy="single", devices="cpu", image_size=8, batch_size=128)
    dp = single.replace(strategy="dp", devices=("cuda:0", "cuda:1"))
    data = load_data(single)
    single_train, _ = build_loaders(data, single, Strategy(single))
    dp_train, dp_val = build_loaders(data, dp, DataParallelStrategy(dp))
    assert dp_train.batch_size == dp_val.batch_size == 128
    assert len(dp_train) == len(single_train) == 12  # 1437 images
    assert dp.per_device_batch == 64  # what each GPU's replica sees


def _threaded_parallel_apply(modules, inputs, kwargs_tup=None, devices=None):
    """torch.nn.parallel.parallel_apply without CUDA streams: one thread per replica, each re-entering
    autocast with only ``enabled``, as the real one does."""
    autocast_enabled = torch.is_autocast_enabled("cpu")
    results = [None] * len(modules)

    def worker(i):
        with torch.amp.autocast("cpu", enabled=autocast_enabled):
            results[i] = modules[i](*inputs[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(modules))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_dataparallel_replicas_run_in_the_runs_autocast_dtype(monkeypatch):
    """A supervisor thread starts with autocast's default dtype (bf16 on CPU, fp16 on CUDA); the
    replicas must still compute in the dtype the training loop chose (fp16 here, to differ)."""
    # The module, not the function torch.nn.parallel re-exports under the same name.
    monkeypatch.setattr(importlib.import_module("torch.nn.parallel.data_parallel"), "parallel_apply",
                        _threaded_parallel_apply)
    config = RunConfig(strategy="dp", devices="cpu")
    model = DataParallelStrategy(config).wrap(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)))
    replicas = [copy.deepcopy(model.module) for _ in range(2)]
    x = torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.float16):
        outputs = model.parallel_apply(replicas, [(x,), (x,)], [{}, {}])
    assert [out.dtype for out in outputs] == [torch.float16, torch.float16]
    with torch.autocast("cpu", enabled=False):
        outputs = model.parallel_apply(replicas, [(x,), (x,)], [{}, {}])
    assert [out.dtype for out in outputs] == [torch.float32, torch.float32]
    # Replicas are wrapped only while they run: the model keeps timm's parameter names.
    assert list(model.module.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]


# --- GPU ranks: threads, cuDNN ---

def test_a_gpu_rank_gets_its_share_of_cores_and_cudnn_autotuning(two_gpus, monkeypatch):
    calls = {}
    monkeypatch.setattr(config_module, "cpu_cores", lambda: 16)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.setdefault("threads", n))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.setdefault("device", str(device)))
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)  # joined torchrun's world: no store here
    config = RunConfig(strategy="ddp", devices="0,1")
    DistributedStrategy(config, rank=1, store_host="127.0.0.1", store_port=1).setup()
    assert calls == {"device": "cuda:1", "threads": 8}
    assert torch.backends.cudnn.benchmark is True


# --- Resume files ---

def test_resume_point_is_read_onto_the_cpu(parallax_home, monkeypatch):
    """Every rank is sent the point and loads it onto its own device; read without map_location,
    a GPU-saved point would come back on the GPU of the rank that saved it."""
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    strategy = DistributedStrategy(RunConfig(strategy="ddp", devices="cpu"), rank=0)
    strategy.setup()  # a world of one, on its own store
    try:
        torch.manual_seed(0)
        model = strategy.wrap(nn.Linear(4, 2))  # DDP over the world of one
        optimizer = torch.optim.Adam(model.parameters())
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
        loader = SimpleNamespace(generator=None)
        folder = parallax_home / "runs" / "run-7"
        folder.mkdir(parents=True)
        resume.save_resume_point(folder, strategy, model, optimizer, loader, epoch=2, best_acc=0.5)
        saved = torch.load(folder / resume.RESUME_FILE, weights_only=True)
        tensors = [*saved["state"]["model"].values(), *saved["state"]["optimizer"]["state"][0].values()]
        assert tensors and all(t.device.type == "cpu" for t in tensors)

        seen = []
        real_load = torch.load
        monkeypatch.setattr(torch, "load", lambda *a, **k: seen.append(k.get("map_location")) or real_load(*a, **k))
        fresh = strategy.wrap(nn.Linear(4, 2))
        fresh_optimizer = torch.optim.Adam(fresh.parameters())
        resumed = resume.restore(folder, strategy, fresh, fresh_optimizer, loader)
        assert (resumed.start_epoch, resumed.best_acc) == (3, 0.5)
        assert seen == ["cpu"]
        assert torch.equal(fresh.module.weight, model.module.weight)
        assert fresh_optimizer.state_dict()["state"][0]["step"] == 1
    finally:
        strategy.teardown()


# --- Out of memory ---

NCCL_HEADER = ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
               "NCCLUtils.cpp:77, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version "
               "2.27.5\nncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n")


@pytest.mark.parametrize("error", [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 1.05 GiB is free.",
    "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED",  # cuDNN 8
    "RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",  # cuDNN 9
    "RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
    NCCL_HEADER + "Cuda failure 2 'out of memory'",
    NCCL_HEADER + "Cuda failure 'out of memory'",
    NCCL_HEADER + "Failed to CUDA calloc 6291456 bytes",
    NCCL_HEADER + "Failed to CUDA malloc 33554432 bytes",
])
def test_out_of_memory_in_any_cuda_library_gets_the_hint(error):
    assert with_oom_hint(error) == f"{OOM_HINT}\n\n{error}"


@pytest.mark.parametrize("error", [
    NCCL_HEADER + "Cuda failure 1 'invalid argument'",
    "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, m, n, k)`",
    "RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR",
    "ValueError: memory_format out of range",
])
def test_other_cuda_failures_get_no_hint(error):
    assert with_oom_hint(error) == error


# --- FSDP: one checkpoint verdict for every rank ---

def test_fsdp_ranks_that_count_validation_differently_take_rank_0s_verdict(parallax_home):
    """Each FSDP rank evaluates the whole validation set; with cudnn.benchmark each may run other
    kernels and count a near-tie differently. Here rank 1 counts one more correct image from epoch 2
    on (a patched validate): deciding on its own numbers it would gather the full state dict alone
    and the run would hang until the collective timeout."""
    from tests.support import run_cli

    result = run_cli("run", "--dataset", "digits", "--model", "test_resnet", "--image-size", "16", "--strategy", "fsdp",
                     "--devices", "cpu,cpu", "--epochs", "2", home=parallax_home, timeout=300,
                     env_extra={"PARALLAX_PLUGINS": "tests.plugins.rank1_counts_more",
                                "PARALLAX_COLLECTIVE_TIMEOUT_S": "20"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    run_id = result.stdout.strip().splitlines()[-1].split()[0].split("=")[1]
    run = json.loads(run_cli("export", run_id, home=parallax_home).stdout)
    assert run["status"] == "completed"
    assert [round(e["val_acc"] * 360) for e in run["epochs"]] == [100, 100]  # rank 0's count, on every rank


# --- step points timed by CUDA events (torch.cuda.Event faked at the edge) ---

class StreamEvent:
    """A CUDA event on a fake GPU whose queued work has reached ``now_ms``; it keeps the stream it
    was recorded on (``torch.cuda.current_stream`` is faked to name its device's stream)."""

    now_ms = 0.0

    def __init__(self, enable_timing: bool = False):
        self.at_ms, self.stream = None, None

    def record(self, stream=None):
        self.at_ms, self.stream = StreamEvent.now_ms, stream

    def synchronize(self):
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: StreamEvent) -> float:
        return end.at_ms - self.at_ms


class QueuesGpuWork(nn.Linear):
    """Each training forward queues ``step_ms`` of GPU work (cuDNN's search makes step 1 longer) and,
    from step 2 on, holds the host long enough to close a step point's window."""

    def __init__(self, first_ms: float, step_ms: float, host_s: float):
        super().__init__(4, 3)
        self.first_ms, self.step_ms, self.host_s, self.steps = first_ms, step_ms, host_s, 0

    def forward(self, x):
        if self.training:
            self.steps += 1
            StreamEvent.now_ms += self.first_ms if self.steps == 1 else self.step_ms
            if self.steps > 1:
                time.sleep(self.host_s)
        return super().forward(x)


@pytest.fixture
def fake_streams(monkeypatch):
    recorded: list = []

    class Recorded(StreamEvent):
        def record(self, stream=None):
            super().record(stream)
            recorded.append(stream)

    monkeypatch.setattr(torch.cuda, "Event", Recorded)
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: f"stream of {torch.device(device)}" if device is not None else None)
    return recorded


def test_no_cuda_step_point_outruns_its_epoch_and_every_event_is_on_the_losses_device(db_url, fake_streams):
    """Step 1 (30 ms on the GPU) must be inside the first point's window: begun when the first loss is
    seen, after step 1 is queued, the window held step 1's images without its time. Under mp the losses
    live on the last stage's GPU (cuda:1 here, the process's current device being cuda:0): the events
    that time the points and guard the losses' host copy must be on that GPU's stream."""
    from sqlalchemy import select

    from db import make_engine, store
    from db.tables import StepMetric
    from trainer_backend.rank.loop import train_one_epoch
    from trainer_backend.telemetry.recorder import Recorder
    from trainer_backend.telemetry.steps import StepHooks, StepRecorder

    engine = make_engine(db_url)
    run_id = store.create_run(engine, RunConfig().to_dict(), status="running")
    steps, batch, first_ms, step_ms = 6, 4, 30.0, 10.0
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(steps * batch, 4),
                                                                        torch.randint(0, 3, (steps * batch,))),
                                         batch_size=batch)
    strategy = Strategy(RunConfig(strategy="single", devices="cpu"))
    model = QueuesGpuWork(first_ms, step_ms, host_s=0.06)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder = StepRecorder(Recorder(engine, run_id), time.time(), min_interval_s=0.05, device=torch.device("cuda:1"))
    hooks = StepHooks(recorder=recorder)
    hooks.start_epoch(1, loader, optimizer)
    train_one_epoch(model, loader, optimizer, strategy, on_start=hooks.begin_training, on_step=hooks,
                    on_loss=hooks.loss)
    hooks.end_epoch(images=steps * batch)
    with engine.connect() as connection:
        rows = connection.execute(select(StepMetric).where(StepMetric.run_id == run_id)
                                  .order_by(StepMetric.step)).mappings().all()
    epoch_images_per_s = steps * batch / ((first_ms + (steps - 1) * step_ms) / 1000)  # 300
    assert rows and rows[-1]["step"] == steps
    assert all(0 < row["images_per_s"] <= 2 * epoch_images_per_s for row in rows), [dict(r) for r in rows]
    first_window_s = (first_ms + (rows[0]["step"] - 1) * step_ms) / 1000  # step 1 is in it
    assert rows[0]["images_per_s"] == pytest.approx(rows[0]["step"] * batch / first_window_s)
    assert fake_streams and set(fake_streams) == {"stream of cuda:1"}


def test_the_energy_meter_stops_after_the_processs_gpus_finish_their_queued_work(monkeypatch):
    """A pipeline's first stage meters energy but records no step points, whose last read waits for the
    GPU elsewhere: without a sync its meter stopped with the epoch's work still queued."""
    from trainer_backend.telemetry.steps import StepHooks

    order = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: order.append(f"synchronize {device}"))
    meter = SimpleNamespace(start=lambda: None, tick=lambda: None, stop=lambda: order.append("stop") or {},
                            epoch_fields=lambda joules, images: {})
    hooks = StepHooks(energy=meter, devices=[torch.device("cuda:1")])
    hooks.start_epoch(1, None, None)
    hooks(1, 2)
    assert order == []
    hooks(2, 2)
    assert order == ["synchronize cuda:1", "stop"]


# --- process groups bound to each rank's GPU ---

@pytest.mark.parametrize("strategy_name, devices, rank, expected", [
    ("fsdp", "1", 0, 1), ("fsdp", "1,0", 0, 1), ("pp", "1,0", 0, 1), ("pp", "2,3", 1, 3), ("ddp", "3,2", 1, 2)])
def test_every_process_group_is_bound_to_its_ranks_gpu(monkeypatch, strategy_name, devices, rank, expected):
    """Unbound, NCCL's first collective that names no device (the loop's barrier: FSDP and the pipeline
    run no collective before it) runs on GPU rank % count: another rank's GPU, or one not given to the run."""
    from trainer_backend.rank.trainer import make_strategy

    monkeypatch.setattr(config_module, "cuda_device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    calls = {}
    monkeypatch.setattr(dist, "init_process_group", lambda *args, **kwargs: calls.setdefault("init", kwargs))
    monkeypatch.setattr(dist, "barrier", lambda *args, **kwargs: calls.setdefault("barrier", kwargs))
    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)  # what the runner serves
    config = RunConfig(strategy=strategy_name, devices=devices)
    strategy = make_strategy(config, rank, store_host="127.0.0.1", store_port=store.port if "," in devices else 0)
    strategy.setup()
    strategy.barrier()
    assert calls["init"]["device_id"] == torch.device("cuda", expected)
    assert calls["barrier"].get("device_ids") == [expected]


@pytest.mark.parametrize("devices, batch, dropped", [
    (("cuda:0", "cuda:1"), 6, True),  # 1437 = 239 x 6 + 3: DataParallel's chunks of the last batch are 2 and 1
    (("cuda:0", "cuda:1"), 8, False),  # ... + 5: 3 and 2
    (("cuda:0", "cuda:1"), 4, True),  # ... + 1
    (("cuda:1", "cuda:0", "cuda:2", "cuda:3"), 8, True),  # ... + 5: 2, 2 and 1
    (("cuda:0", "cuda:1", "cuda:2"), 8, True),  # ... + 5: 2, 2 and 1
    (("cuda:0", "cuda:1", "cuda:2"), 12, False),  # 1437 = 119 x 12 + 9: 3, 3 and 3
])
def test_dataparallel_drops_a_last_batch_that_would_give_a_replica_one_image(monkeypatch, parallax_home, devices, batch,
                                                                             dropped):
    """Train-mode BatchNorm raises on one value per channel ("Expected more than 1 value per channel")."""
    monkeypatch.setattr(config_module, "cuda_device_count", lambda: 4)
    config = RunConfig(strategy="dp", devices=devices, image_size=8, batch_size=batch)
    strategy = DataParallelStrategy(config)
    last = 1437 % batch
    sizes = [len(part) for part in torch.arange(last).chunk(len(devices))]  # what DataParallel's scatter makes
    assert (1 in sizes) == dropped
    train, _ = build_loaders(load_data(config), config, strategy)
    assert train.drop_last is dropped
    # On CPU DataParallel is a pass-through: one replica, so only a last batch of one is dropped.
    cpu = RunConfig(strategy="dp", devices="cpu", image_size=8, batch_size=batch)
    assert build_loaders(load_data(cpu), cpu, DataParallelStrategy(cpu))[0].drop_last is (last == 1)


# --- the pipeline under autocast ---

def _pipeline_under_autocast(rank: int, port: int, out_path: str) -> None:
    """Two CPU stages train one epoch in bf16 (CPU autocast: what a GPU run does in its dtype), noting
    whether autocast was on in each forward of the stage's module and in each microbatch's backward."""
    from torch.distributed.pipelining.stage import _PipelineStageBase

    from tests.support import leave_as_a_rank
    from trainer_backend.rank.loop import train_one_epoch
    from trainer_backend.rank.models import create_model
    from trainer_backend.rank.trainer import build_optimizer, make_strategy

    seen = {"forward": [], "backward": []}
    backward_one_chunk = _PipelineStageBase.backward_one_chunk

    def noting(self, *args, **kwargs):
        seen["backward"].append(torch.is_autocast_enabled("cpu"))
        return backward_one_chunk(self, *args, **kwargs)

    _PipelineStageBase.backward_one_chunk = noting
    torch.set_num_threads(1)
    config = RunConfig(model="test_resnet", strategy="pp", devices=("cpu", "cpu"), image_size=8, batch_size=8,
                       microbatches=2)
    strategy = make_strategy(config, rank, in_chans=3, store_host="127.0.0.1", store_port=port)
    strategy.setup()
    try:
        torch.manual_seed(0)
        model = strategy.wrap(create_model("test_resnet", num_classes=10, in_chans=3))
        model.register_forward_pre_hook(lambda module, args: seen["forward"].append(torch.is_autocast_enabled("cpu")))
        optimizer = build_optimizer(config, model.parameters())
        generator = torch.Generator().manual_seed(1)
        data = torch.utils.data.TensorDataset(torch.randn(16, 3, 8, 8, generator=generator),
                                              torch.randint(0, 10, (16,), generator=generator))
        loader = torch.utils.data.DataLoader(data, batch_size=8)
        totals, _ = train_one_epoch(model, loader, optimizer, strategy, amp_dtype=torch.bfloat16)
        val = strategy.evaluate(model, loader, amp_dtype=torch.bfloat16)
        with open(f"{out_path}.{rank}", "w") as handle:
            json.dump({**seen, "totals": totals.tolist(), "val": val[:3].tolist()}, handle)
    finally:
        strategy.teardown()
    leave_as_a_rank()


def test_a_pipeline_runs_its_forwards_under_autocast_and_its_backwards_outside(tmp_path):
    """PyTorch's AMP notes: backward passes under autocast are not recommended (its ops run in the
    dtypes the forward chose). The schedule's step runs both: autocast must cover the forwards only."""
    from tests.support import run_world

    run_world(_pipeline_under_autocast, 2, str(tmp_path / "seen"), timeout_s=120)
    first, last = (json.loads((tmp_path / f"seen.{rank}").read_text()) for rank in (0, 1))
    for stage in (first, last):
        assert stage["forward"] and all(stage["forward"]), stage
        assert stage["backward"] and not any(stage["backward"]), stage
    # The last stage counted the loss of all 16 images. Its value is not checked: two gloo stages under CPU bf16
    # autocast (a test construct: a run on CPU trains in fp32) intermittently leave NaN in the first stage's
    # gradients, with the autocast placed either way, so it says nothing of where autocast runs.
    assert last["totals"][2] == 16 and last["val"][2] == 16
