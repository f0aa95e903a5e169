"""Where the time and memory go: FLOPs and MFU, per-rank times and stragglers, the memory breakdown.

Real counts, real gloo worlds: the two-process tests run the project's own strategies and training
loop for a few steps at 8 px; the GPU peak table is looked up with ``torch.cuda``'s name and
capability faked at the edge (the GPU runs are in tests/system/test_gpu.py).
"""

from __future__ import annotations

import json
import math
import time
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from tests.support import leave_with_results, world_results
from trainer_backend.telemetry import flops
from contract.config import RunConfig
from trainer_backend.telemetry.flops import cpu_peak_tflops, device_peak, flops_per_image, gpu_peak
from trainer_backend.telemetry.memory_breakdown import MB
from trainer_backend.rank.models import create_model
from trainer_backend.telemetry.rank_times import find_stragglers, slow_ranks, straggler_note

SPAWN_TIMEOUT_S = 120


# --- FLOPs ---

def resnet18_hand_count(image_size: int, in_chans: int, num_classes: int) -> float:
    """One training image of timm's resnet18, by hand. Convention (FlopCounterMode's): a
    multiply-add is 2 FLOPs, so a convolution costs 2·Cin·Cout·k·k·Hout·Wout and a linear layer
    2·in·out; batch norm, ReLU and pooling are not counted. Backward computes the gradient of
    each layer's input and of its weights, each as costly as the forward: training = 3 × forward
    (the first convolution's input needs no gradient, so the true count is a little lower)."""
    def conv(cin, cout, k, out):
        return 2 * cin * cout * k * k * out * out

    size = image_size // 2  # the 7x7 stem, stride 2
    forward = conv(in_chans, 64, 7, size)
    size //= 2  # max pool
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        size = max(1, size // stride)
        forward += conv(cin, cout, 3, size) + conv(cout, cout, 3, size)  # first block
        if stride != 1:
            forward += conv(cin, cout, 1, size)  # its downsampling shortcut
        forward += 2 * conv(cout, cout, 3, size)  # second block
        cin = cout
    forward += 2 * 512 * num_classes
    return 3 * forward


def test_flops_per_image_of_resnet18_at_32px_is_within_10_percent_of_the_hand_count():
    model = create_model("resnet18", num_classes=10, in_chans=3)
    counted = flops_per_image(model, in_chans=3, image_size=32)
    by_hand = resnet18_hand_count(32, 3, 10)
    assert by_hand == pytest.approx(222e6, rel=0.01)
    assert counted == pytest.approx(by_hand, rel=0.10), (counted, by_hand)
    assert next(model.parameters()).device.type == "cpu"  # counted on a copy: the model is untouched


def test_a_model_the_meta_device_cannot_run_goes_on_without_flops(capsys):
    class ReadsAValue(torch.nn.Module):
        def forward(self, x):
            return x * x.mean().item()  # a meta tensor has no value to read

    assert flops.count_flops_per_image(ReadsAValue(), in_chans=3, image_size=8) is None
    assert "FLOPs not counted" in capsys.readouterr().err


# --- peaks ---

def fake_gpus(monkeypatch, names: list[str], capability=(9, 0)):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: names[torch.device(device).index])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)


def test_gpu_peak_comes_from_the_datasheet_table_by_name_and_dtype(monkeypatch):
    fake_gpus(monkeypatch, ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"])
    one, two = [torch.device("cuda:0")], [torch.device("cuda:0"), torch.device("cuda:1")]
    peak = device_peak(one, torch.bfloat16)
    assert peak.tflops == 989.5 and "H100 bf16" in peak.source
    assert device_peak(two, torch.float16).tflops == 2 * 989.5  # peak per device × devices
    assert device_peak(one, torch.bfloat16, processes=4).tflops == 4 * 989.5  # one device per process

    fake_gpus(monkeypatch, ["Tesla V100-SXM2-16GB"], capability=(7, 0))
    assert device_peak(one, None).tflops == 15.7  # no TF32 before Ampere, whatever the flags say


@pytest.fixture
def tf32_flags():
    """PyTorch's TF32 switches (process-wide C++ state, not for monkeypatch), restored afterwards."""
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    yield
    torch.backends.cudnn.conv.fp32_precision = "tf32"  # the new API's switches back to their defaults first
    torch.backends.cuda.matmul.fp32_precision = "none"
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_amp_off_takes_the_peak_of_the_arithmetic_convolutions_and_matmuls_run_in(monkeypatch, tf32_flags):
    """PyTorch's defaults: cuDNN convolutions in TF32, matrix multiplies in fp32. A vision model's
    FLOPs are mostly convolutions: dividing by the fp32 peak would make an H100's MFU seven times too high."""
    fake_gpus(monkeypatch, ["NVIDIA H100 80GB HBM3"])
    one = [torch.device("cuda:0")]
    assert torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32  # the defaults
    peak = device_peak(one, None)
    assert peak.tflops == 494.5 and peak.source == ("H100 tf32 (NVIDIA datasheet): convolutions in TF32, "
                                                    "matrix multiplies in fp32")
    torch.backends.cuda.matmul.allow_tf32 = True
    assert device_peak(one, None).source.endswith("convolutions and matrix multiplies in TF32")
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    peak = device_peak(one, None)
    assert peak.tflops == 67.0 and peak.source.endswith("convolutions and matrix multiplies in fp32")
    # The per-operator API (PyTorch 2.9 on), where reading the legacy flag raises once the two are mixed.
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    assert device_peak(one, None).source.endswith("matrix multiplies in TF32, convolutions in fp32")
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    assert device_peak(one, None).tflops == 67.0
    # Under autocast both run in its dtype, whatever the fp32 switches say.
    peak = device_peak(one, torch.float16)
    assert peak.tflops == 989.5 and peak.source == "H100 fp16 (NVIDIA datasheet): autocast fp16"


@pytest.mark.parametrize("name", ["NVIDIA T400", "NVIDIA T400 4GB", "NVIDIA RTX A1000",
                                  "NVIDIA RTX A1000 6GB Laptop GPU",
                                  "NVIDIA RTX A4000", "NVIDIA RTX A4000H", "NVIDIA A10G", "NVIDIA L40G",
                                  "NVIDIA GeForce RTX 3090 Ti", "NVIDIA GeForce RTX 4090 D",
                                  "NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA GH200 480GB", "NVIDIA T4000"])
def test_a_gpu_whose_name_holds_a_table_rows_name_inside_another_model_gets_no_peak(name):
    """"T4" is inside "T400", "A100" inside "A1000", "A40" inside "A4000": whole model tokens only."""
    assert all(gpu_peak(name, dtype) is None for dtype in ("fp32", "tf32", "bf16", "fp16")), name


@pytest.mark.parametrize("name, dtype, expected", [
    ("NVIDIA A100-SXM4-80GB", "bf16", 312.0), ("NVIDIA A100-PCIE-40GB", "tf32", 156.0),
    ("NVIDIA H100 PCIe", "bf16", 756.5), ("NVIDIA H200", "fp16", 989.5), ("NVIDIA L4", "fp16", 121.0),
    ("NVIDIA L40S", "bf16", 362.05), ("NVIDIA A10", "fp32", 31.2), ("Tesla T4", "fp16", 65.0),
    ("NVIDIA GeForce RTX 4090", "bf16", 165.2), ("Tesla V100-PCIE-32GB", "fp16", 112.0),
    ("NVIDIA H100 NVL", "bf16", 835.5), ("Tesla V100-SXM2-32GB", "fp16", 125.0), ("NVIDIA L40", "tf32", 90.5),
    ("NVIDIA A100 80GB PCIe", "tf32", 156.0), ("NVIDIA GeForce RTX 3090", "fp16", 71.0),
])
def test_peak_table_rows(name, dtype, expected):
    assert gpu_peak(name, dtype)[0] == expected


def test_an_unknown_gpu_or_dtype_has_no_peak_and_says_why(monkeypatch):
    fake_gpus(monkeypatch, ["NVIDIA Quantum Z9"])
    peak = device_peak([torch.device("cuda:0")], torch.bfloat16)
    assert peak.tflops is None and "NVIDIA Quantum Z9" in peak.source
    fake_gpus(monkeypatch, ["Tesla T4"], capability=(7, 5))
    assert device_peak([torch.device("cuda:0")], torch.bfloat16).tflops is None  # T4 has no bf16 units
    assert flops.mfu(1.0, None) is None


def test_cpu_peak_is_measured_once_per_cpu_and_thread_count_and_cached(tmp_path):
    first = cpu_peak_tflops(1, cache_dir=tmp_path)
    assert 0 < first < 10  # two cores do not reach 10 TFLOPS
    cache = json.loads((tmp_path / flops.CPU_PEAK_FILE).read_text())
    (key, value), = cache.items()
    assert key.endswith("| 1 threads") and value == first
    cache[key] = 0.123  # a cached figure is used as it is, without measuring again
    (tmp_path / flops.CPU_PEAK_FILE).write_text(json.dumps(cache))
    start = time.perf_counter()
    assert cpu_peak_tflops(1, cache_dir=tmp_path) == 0.123
    assert time.perf_counter() - start < flops.CPU_MATMUL_SECONDS


# --- stragglers (pure) ---

def ranks(*own_work_s: float, comm=None) -> list[dict]:
    comm = comm or [0.0] * len(own_work_s)
    return [{"rank": r, "train_time_s": w + c, "data_time_s": 0.0, "compute_time_s": w, "comm_wait_s": c}
            for r, (w, c) in enumerate(zip(own_work_s, comm))]


def test_a_rank_10_percent_slower_than_the_median_two_epochs_running_is_a_straggler():
    slow = ranks(1.0, 1.0, 1.10)
    assert slow_ranks(slow) == {2}
    assert slow_ranks(ranks(1.0, 1.0, 1.09)) == set()
    assert find_stragglers([slow]) == []  # one epoch is not enough
    assert find_stragglers([slow, slow]) == [2]
    assert find_stragglers([slow, ranks(1.0, 1.0, 1.0)]) == []  # it recovered
    assert find_stragglers([ranks(1.0, 1.0, 1.0), slow, slow]) == [2]
    assert find_stragglers([ranks(2.0)] * 3) == []  # one rank has no median to lag
    # Synchronous collectives: every rank's wall time is the slowest's, the fast ones wait.
    synced = ranks(1.0, 1.5, 1.0, comm=[0.5, 0.0, 0.5])
    assert {r["train_time_s"] for r in synced} == {1.5}
    assert find_stragglers([synced, synced]) == [1]
    note = straggler_note(1, synced, epoch=4)
    assert note.startswith("Rank 1 is a straggler") and "epoch 4" in note and "50%" in note


# --- the shared DDP run: every rank's times, MFU, memory breakdown ---

def test_ddp_run_records_mfu_every_ranks_times_and_its_memory_breakdown(shared_runs):
    run = shared_runs["ddp_tiny"]
    measured = run["measurements"]
    assert measured["peak_source"] == flops.MEASURED_ON_CPU and measured["peak_tflops"] > 0
    tiny = create_model("test_resnet", num_classes=10, in_chans=1)  # digits: one channel
    assert measured["flops_per_image"] == flops_per_image(tiny, in_chans=1, image_size=16)
    param_mb = sum(p.numel() * p.element_size() for p in tiny.parameters()) / MB
    assert any("no activations figure" in note for note in run["notes"])
    for epoch in run["epochs"]:
        extra = epoch["extra"]
        assert extra["achieved_tflops"] == pytest.approx(
            measured["flops_per_image"] * epoch["images_per_s"] / 1e12, rel=1e-3)
        assert 0 < extra["mfu"] <= 1
        assert extra["mfu"] == pytest.approx(extra["achieved_tflops"] / measured["peak_tflops"], rel=1e-3)
        assert [r["rank"] for r in extra["ranks"]] == [0, 1]
        for rank in extra["ranks"]:
            parts = rank["data_time_s"] + rank["compute_time_s"] + rank["comm_wait_s"]
            assert parts == pytest.approx(rank["train_time_s"], abs=1e-3)
            assert rank["compute_time_s"] > 0 and rank["comm_wait_s"] > 0 and rank["data_time_s"] >= 0
        assert max(r["train_time_s"] for r in extra["ranks"]) == pytest.approx(epoch["train_time_s"], abs=1e-3)
        assert extra["stragglers"] == []
        breakdown = extra["memory_breakdown"]
        assert set(breakdown) == set(epoch["peak_memory_mb"]) == {"rank0:cpu", "rank1:cpu"}
        for entry in breakdown.values():
            assert entry["parameters_mb"] == pytest.approx(param_mb, abs=1e-3)
            assert entry["gradients_mb"] == pytest.approx(param_mb, abs=1e-3)
            assert entry["optimizer_mb"] == pytest.approx(2 * param_mb, rel=0.01)  # Adam: two moments
            assert entry["activations_other_mb"] is None


# --- two real gloo processes: resnet18 under DDP and FSDP, a slow rank ---

class DigitsLike(Dataset):
    """Random 8 px images; on the slow rank each batch's first item takes ``delay_s`` to load."""

    def __init__(self, n: int, batch: int, delay_s: float):
        self.n, self.batch, self.delay_s = n, batch, delay_s

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        if self.delay_s and index % self.batch == 0:
            time.sleep(self.delay_s)
        generator = torch.Generator().manual_seed(index)
        return torch.randn(3, 8, 8, generator=generator), index % 10


SLOW_RANK, DELAY_S, STEPS = 1, 0.5, 2


def _world_of_two(rank: int, port: int, out_path: str) -> None:
    """Both strategies in one world (a process group is made once): DDP for two epochs with rank 1
    slow at loading data, then FSDP for three, rank 1 slow in the third only (the first warms up:
    FSDP's first step sets itself up inside its hooks)."""
    from trainer_backend.rank.loop import train_one_epoch
    from trainer_backend.telemetry.measures import RunMeasures
    from trainer_backend.rank.trainer import build_optimizer, make_strategy

    results = {}
    strategies = []
    try:
        for name, epochs in (("ddp", 2), ("fsdp", 3)):
            config = RunConfig(model="resnet18", strategy=name, devices=("cpu", "cpu"), image_size=8,
                               batch_size=8, epochs=1)
            strategy = make_strategy(config, rank, store_host="127.0.0.1", store_port=port)
            strategy.setup()
            strategies.append(strategy)
            torch.manual_seed(0)
            model = create_model("resnet18", num_classes=10, in_chans=3)
            count = flops_per_image(model, in_chans=3, image_size=8) if rank == 0 else None
            model = strategy.wrap(model)
            optimizer = build_optimizer(config, model.parameters())
            measures = RunMeasures(strategy, model, optimizer, None, count)
            for epoch in range(1, epochs + 1):
                slow = rank == SLOW_RANK and (name == "ddp" or epoch == 3)
                loader = DataLoader(DigitsLike(4 * STEPS, 4, DELAY_S if slow else 0.0), batch_size=4)
                totals, train_time_s = train_one_epoch(model, loader, optimizer, strategy)
                slowest = strategy.all_reduce(torch.tensor([train_time_s], dtype=torch.float64), "max").item()
                images = strategy.all_reduce(totals)[2].item()
                results[f"{name}{epoch}"] = measures.epoch_extra(epoch, train_time_s, images, slowest)
            results[f"{name}_notes"] = measures.take_notes()
    finally:
        if strategies:
            strategies[0].teardown()
    leave_with_results(rank, results, out_path)


@pytest.fixture(scope="module")
def world_of_two(tmp_path_factory) -> dict:
    return world_results(tmp_path_factory, _world_of_two, 2, timeout_s=SPAWN_TIMEOUT_S)


def test_memory_breakdown_of_resnet18_on_two_cpu_processes_ddp_and_fsdp(world_of_two):
    full_mb = 42.7  # resnet18, 10 classes: 11.2 M fp32 parameters
    for name, target, tolerance in (("ddp", full_mb, 0.08), ("fsdp", full_mb / 2, 0.15)):
        breakdown = world_of_two[f"{name}1"]["memory_breakdown"]
        assert set(breakdown) == {"rank0:cpu", "rank1:cpu"}
        for entry in breakdown.values():
            assert entry["parameters_mb"] == pytest.approx(target, rel=tolerance), (name, entry)
            assert entry["gradients_mb"] == pytest.approx(entry["parameters_mb"], rel=0.01)
            assert entry["optimizer_mb"] == pytest.approx(2 * entry["parameters_mb"], rel=0.01)


def test_comm_wait_is_the_fast_rank_waiting_for_the_slow_one_who_is_named_a_straggler(world_of_two):
    for epoch in ("ddp1", "ddp2"):
        fast, slow = world_of_two[epoch]["ranks"]
        # The fast rank waits in the all-reduce about as long as its peer loads data.
        assert fast["comm_wait_s"] >= 0.7 * STEPS * DELAY_S, world_of_two[epoch]
        assert slow["data_time_s"] >= STEPS * DELAY_S
        assert 0 < world_of_two[epoch]["mfu"] <= 1
    assert world_of_two["ddp1"]["stragglers"] == []  # one slow epoch is not enough
    assert world_of_two["ddp2"]["stragglers"] == [SLOW_RANK]
    assert [n for n in world_of_two["ddp_notes"] if n.startswith(f"Rank {SLOW_RANK} is a straggler")]


def test_fsdp_records_every_ranks_comm_wait_and_the_fast_rank_waits_for_the_slow_one(world_of_two):
    for epoch in ("fsdp1", "fsdp2", "fsdp3"):
        fsdp_ranks = world_of_two[epoch]["ranks"]
        assert [r["rank"] for r in fsdp_ranks] == [0, 1]
        for entry in fsdp_ranks:
            assert entry["comm_wait_s"] >= 0 and entry["compute_time_s"] > 0, fsdp_ranks
            parts = entry["data_time_s"] + entry["compute_time_s"] + entry["comm_wait_s"]
            assert parts == pytest.approx(entry["train_time_s"], abs=1e-3)
    fast, slow = world_of_two["fsdp3"]["ranks"]
    assert slow["data_time_s"] >= STEPS * DELAY_S
    # Its first all-gather of each step waits about as long as its peer loads data; the peer does not.
    # The two ranks are compared within the one epoch: across epochs, on two busy shared cores, the
    # even epoch's waits alone have measured 1.9 s, more than the delay being looked for.
    assert fast["comm_wait_s"] >= slow["comm_wait_s"] + 0.7 * STEPS * DELAY_S, world_of_two


# --- one process: a single entry ---

def test_a_single_process_run_has_one_rank_entry_without_collectives(tmp_path, monkeypatch):
    from trainer_backend.rank.loop import train_one_epoch
    from trainer_backend.telemetry.measures import RunMeasures
    from trainer_backend.rank.trainer import build_optimizer, make_strategy

    monkeypatch.setenv("PARALLAX_HOME", str(tmp_path))
    config = RunConfig(model="test_resnet", strategy="single", devices=("cpu",), image_size=8, batch_size=4)
    strategy = make_strategy(config)
    model = create_model("test_resnet", num_classes=10, in_chans=3)
    count = flops_per_image(model, in_chans=3, image_size=8)
    model = strategy.wrap(model)
    optimizer = build_optimizer(config, model.parameters())
    measures = RunMeasures(strategy, model, optimizer, None, count)
    totals, train_time_s = train_one_epoch(model, DataLoader(DigitsLike(8, 4, 0.0), batch_size=4), optimizer, strategy)
    extra = measures.epoch_extra(1, train_time_s, totals[2].item(), train_time_s)
    (entry,) = extra["ranks"]
    assert entry["rank"] == 0 and entry["comm_wait_s"] == 0.0
    assert entry["data_time_s"] + entry["compute_time_s"] == pytest.approx(train_time_s, abs=1e-3)
    assert set(extra["memory_breakdown"]) == {"cpu"} and extra["stragglers"] == []
    assert measures.once_per_run()["peak_source"] == flops.MEASURED_ON_CPU
    assert 0 < extra["mfu"] and math.isfinite(extra["mfu"])


# --- comm wait on CUDA, from events (torch.cuda.Event faked at the edge) ---

class FakeCudaEvent:
    """A CUDA event on a 'GPU' whose stream time is ``now_ms``; the host spends no time at all,
    so host clocks around the calls would read about zero."""

    now_ms = 0.0

    def __init__(self, enable_timing: bool = False):
        self.at_ms = None

    def record(self, stream=None):
        self.at_ms = FakeCudaEvent.now_ms

    def synchronize(self):
        pass

    def query(self) -> bool:
        return self.at_ms <= FakeCudaEvent.now_ms  # the stream has passed it

    def elapsed_time(self, end: FakeCudaEvent) -> float:
        return end.at_ms - self.at_ms


def test_on_cuda_comm_wait_is_read_from_events_on_the_compute_stream(monkeypatch):
    from torch import nn

    from trainer_backend.telemetry.rank_times import RankClock

    monkeypatch.setattr(torch.cuda, "Event", FakeCudaEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    clock = RankClock(torch.device("cuda:0"), "hook")

    class Wrapper(nn.Module):  # DDP's shape: its forward syncs buffers, then calls .module
        def __init__(self):
            super().__init__()
            self.module = nn.Identity()

        def forward(self, x):
            FakeCudaEvent.now_ms += 3  # the buffer broadcast stalls the stream
            return self.module(x)

    wrapper = Wrapper()
    clock.watch_forward_sync(wrapper)
    for _ in range(2):
        wrapper(torch.zeros(1))
        FakeCudaEvent.now_ms += 40  # forward
        with clock.backward():
            FakeCudaEvent.now_ms += 50  # backward's compute
            clock.bucket_ready()
            FakeCudaEvent.now_ms += 7  # the stream waits for the last bucket's all-reduce
    with clock.backward():  # accumulating under no_sync: no bucket, no wait
        FakeCudaEvent.now_ms += 50
    times = clock.epoch_times(train_time_s=1.0)
    assert times["comm_wait_s"] == pytest.approx(2 * (3 + 7) / 1000)
    assert times["compute_time_s"] == pytest.approx(1.0 - times["comm_wait_s"] - times["data_time_s"])


def test_training_above_the_cached_cpu_peak_measures_it_again_and_never_shows_mfu_above_one(tmp_path, monkeypatch):
    """A peak measured while other work held the cores is too low; an epoch that beats it measures again."""
    from trainer_backend.telemetry import flops as flops_module
    from trainer_backend.telemetry.flops import MEASURED_ON_CPU, Peak
    from trainer_backend.telemetry.measures import RunMeasures

    monkeypatch.setenv("PARALLAX_DATA_DIR", str(tmp_path))
    (tmp_path / flops_module.CPU_PEAK_FILE).write_text(
        json.dumps({f"{flops_module.cpu_model()} | {torch.get_num_threads()} threads": 1e-6}))
    measures = RunMeasures.__new__(RunMeasures)
    measures.strategy, measures.peak, measures._notes, measures._remeasured = (
        SimpleNamespace(world_size=1), Peak(1e-6, MEASURED_ON_CPU), [], False)
    measures._check_cpu_peak(achieved=2e-6)
    remeasured = measures.take_remeasured()
    assert remeasured["peak_tflops"] > 1e-3 and measures.take_remeasured() == {}  # a real matmul rate, reported once
    cached = json.loads((tmp_path / flops_module.CPU_PEAK_FILE).read_text())
    assert list(cached.values()) == [remeasured["peak_tflops"]]
    measures._check_cpu_peak(achieved=remeasured["peak_tflops"] / 2)  # below the peak: nothing measured
    assert measures.take_remeasured() == {}


class _FsdpLikePostBackward(torch.autograd.Function):
    """FSDP's post-backward function on a module's inputs: the reduce-scatter starts there."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        FakeCudaEvent.now_ms += 5  # waits for the previous reduce-scatter's buffer
        return grad


def test_on_cuda_fsdp_waits_are_read_from_events_around_fsdps_hooks(monkeypatch):
    """FSDP's hooks in the shape ``fully_shard`` registers them (a pre-forward hook first in line that
    wraps the inputs, a forward hook that hooks the outputs' gradients, a final callback queued by the
    first pre-backward), each stalling the fake stream; the compute between them does not count."""
    from torch import nn
    from torch.autograd import Variable

    from trainer_backend.telemetry.rank_times import RankClock

    monkeypatch.setattr(torch.cuda, "Event", FakeCudaEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    clock = RankClock(torch.device("cuda:0"), "hook")

    def final_callback():
        FakeCudaEvent.now_ms += 11  # waits for the last reduce-scatters

    def pre_backward(grad):
        FakeCudaEvent.now_ms += 3  # waits for the backward all-gather
        if not state["queued"]:
            state["queued"] = True
            Variable._execution_engine.queue_callback(final_callback)

    def pre_forward(module, args):
        FakeCudaEvent.now_ms += 2  # waits for the forward all-gather
        return (_FsdpLikePostBackward.apply(args[0]),)

    class Computes(nn.Linear):
        def forward(self, x):
            FakeCudaEvent.now_ms += 100  # compute, forward or backward: never counted
            return super().forward(x)

    state = {"queued": False}
    layer = Computes(4, 4)
    layer.register_forward_pre_hook(pre_forward, prepend=True)
    layer.register_forward_hook(lambda module, args, output: output.requires_grad and output.register_hook(pre_backward)
                                and None)
    clock.watch_fsdp(layer, [layer])
    with clock.backward():
        layer(torch.ones(2, 4, requires_grad=True)).sum().backward()
    with torch.no_grad():
        layer.eval()(torch.ones(2, 4))  # evaluation: not training time
    assert clock.epoch_times(train_time_s=1.0)["comm_wait_s"] == pytest.approx((2 + 3 + 5 + 11) / 1000)


def test_an_mfu_above_one_against_a_gpu_peak_is_not_blamed_on_a_cpu_peak(tmp_path, monkeypatch):
    """A datasheet peak cannot be measured again: the note names that peak and its source, never a CPU's."""
    from trainer_backend.telemetry.flops import Peak
    from trainer_backend.telemetry.measures import RunMeasures
    from trainer_backend.rank.trainer import make_strategy

    monkeypatch.setenv("PARALLAX_HOME", str(tmp_path))
    config = RunConfig(model="test_resnet", strategy="single", devices=("cpu",), image_size=8, batch_size=4)
    strategy = make_strategy(config)
    model = strategy.wrap(create_model("test_resnet", num_classes=10, in_chans=3))
    measures = RunMeasures(strategy, model, torch.optim.SGD(model.parameters(), lr=0.1), None, 1e9)
    measures.take_notes()
    source = "H100 fp32 (NVIDIA datasheet): convolutions and matrix multiplies in fp32"
    measures.peak = Peak(67.0, source)  # as on a GPU whose convolutions really ran in TF32
    extra = measures.epoch_extra(1, 1.0, images=100_000, slowest_train_time_s=1.0)  # 100 TFLOPS achieved
    assert extra["achieved_tflops"] == 100.0 and extra["mfu"] is None
    (note,) = measures.take_notes()
    assert "CPU" not in note and "datasheet peak" in note and source in note, note
    assert measures.take_remeasured() == {}
