"""The memory estimate: its trace against a hand count, and its parameters, gradients and
optimizer state against what every strategy really holds after a step on CPU (real gloo ranks).

    .venv/bin/python -m pytest tests/trainer_backend/rank/forecast/test_memory_estimate.py -q
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from tests.nvml_machines import TWO_GPUS, fake_nvml, two_gpu_machine  # noqa: F401
from tests.support import leave_with_results, world_results
from contract.config import RunConfig
from trainer_backend.telemetry.memory_breakdown import HeldMemory, local_breakdown, memory_breakdown
from trainer_backend.rank.forecast.memory_estimate import DeviceMemory, EstimateError, MemoryEstimate, estimate_memory
from trainer_backend.rank.forecast.free_memory import fits, verdict
from trainer_backend.rank.forecast.memory_fit import format_table, suggestions
from trainer_backend.rank.forecast.memory_trace import trace_step
from trainer_backend.rank.models import create_model

MB = 2**20
SPAWN_TIMEOUT_S = 240
MODEL, SIZE, CLASSES, CHANNELS = "resnet18", 16, 10, 3


def test_a_small_nets_step_is_counted_as_counted_by_hand():
    """Linear(8,16) -> ReLU -> Linear(16,4), cross-entropy, SGD with momentum, b images, fp32.
    Forward keeps the input (8 floats an image), ReLU's output (16, which the second Linear also
    saves), the logits (4), log-softmax's output (4) and the labels (one int64), and the loss with
    nll's total weight (two scalars). The first Linear's output (16) is freed once ReLU has run.
    Backward peaks in ReLU's backward: on top of that, minus log-softmax's output and its own
    gradients, which are freed by then, the gradient of ReLU's output (16) and ReLU's own gradient
    (16), with the second Linear's weight and bias gradients already made."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    b = 1024
    with FakeTensorMode():
        net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        trace = trace_step(net, optimizer, (b, 8))
    floats, int64 = 4, 8
    assert trace.input_bytes == 8 * floats * b
    assert trace.forward_kept == (8 + 16 + 4 + 4) * floats * b + int64 * b + 2 * floats
    second_linear_grads = (16 * 4 + 4) * floats
    assert trace.grads_at_peak == second_linear_grads
    assert trace.backward_peak == (8 + 16 + 4 + 16 + 16) * floats * b + int64 * b + second_linear_grads + 2 * floats
    all_grads = (8 * 16 + 16 + 16 * 4 + 4) * floats
    assert trace.optimizer_peak == 2 * all_grads  # the gradients and SGD's momentum, made from them


@pytest.mark.parametrize("model", ["test_vit", "test_convnext"])
def test_a_model_that_reads_values_off_tensors_as_it_is_built_is_traced_as_the_real_model_steps(model):
    """ViT, DeiT, BEiT, Swin and ConvNeXt take their drop-path rates from torch.linspace(...).item()
    in __init__, which no fake tensor can answer. They are built with parameters and buffers on the
    meta device and the rest real, then faked: the step counted is byte for byte a real model's."""
    from trainer_backend.rank.forecast.memory_estimate import MemoryPlan

    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

    with pytest.raises(DataDependentOutputException), FakeTensorMode():  # what the meta build is for
        create_model(model, num_classes=CLASSES, in_chans=CHANNELS)
    config = RunConfig(model=model, image_size=32, batch_size=8, optimizer="adam")  # ConvNeXt halves it 5 times
    plan = MemoryPlan(config, CLASSES, CHANNELS, None)
    real = create_model(model, num_classes=CLASSES, in_chans=CHANNELS).train()
    assert [(p.shape, p.requires_grad) for p in plan.model.parameters()] == [
        (p.shape, p.requires_grad) for p in real.parameters()]
    assert [b.shape for b in plan.model.buffers()] == [b.shape for b in real.buffers()]
    assert plan.trace(8) == trace_step(real, torch.optim.Adam(real.parameters()), (8, CHANNELS, 32, 32))
    (device,) = estimate_memory(config, num_classes=CLASSES, in_chans=CHANNELS).devices
    assert device.parameters == sum(p.numel() * p.element_size() for p in real.parameters())


def test_only_the_thread_building_for_an_estimate_puts_parameters_on_meta():
    """The dashboard estimates in one session's thread while another may build a real model."""
    import threading

    from trainer_backend.rank.forecast.memory_trace import parameters_on_meta

    built = {}
    with parameters_on_meta():
        built["estimating"] = nn.Linear(2, 2)
        head = nn.Linear(2, 2)
        head.weight = built["estimating"].weight  # tied, as a head sharing an embedding
        assert head.weight is built["estimating"].weight
        with parameters_on_meta():  # a build inside a build: the outer one goes on on meta
            pass
        built["after the inner build"] = nn.Linear(2, 2)
        other = threading.Thread(target=lambda: built.setdefault("other thread", nn.Linear(2, 2)))
        other.start()
        other.join()
    built["after"] = nn.Linear(2, 2)
    assert {name: m.weight.device.type for name, m in built.items()} == {
        "estimating": "meta", "after the inner build": "meta", "other thread": "cpu", "after": "cpu"}
    assert nn.Module.register_parameter.__module__ == "torch.nn.modules.module"


def register(monkeypatch, name: str, build) -> None:
    """``build`` as the timm model ``name`` for this test only (timm's registry is restored after)."""
    from timm.models import _registry

    monkeypatch.setitem(_registry._model_entrypoints, name, lambda pretrained=False, **kwargs: build(**kwargs))


class RatesFromTensors(nn.Module):
    """As a ViT: a rate read off torch.linspace(...).item() in __init__ (so the estimate must take the
    meta build), one parameter object and one buffer shared by two layers, and a real tensor kept as a plain attribute."""

    def __init__(self, num_classes: int = 10, in_chans: int = 3, **_):
        super().__init__()
        self.rate = torch.linspace(0, 0.1, 4)[-1].item()
        self.stem = nn.Conv2d(in_chans, 8, 3, padding=1)
        shared = nn.Parameter(torch.randn(8, 8))
        self.first, self.second = nn.Linear(8, 8, bias=False), nn.Linear(8, 8, bias=False)
        self.first.weight = self.second.weight = shared
        steps = torch.zeros((), dtype=torch.long)  # one buffer in two layers, as the parameter
        self.first.register_buffer("steps", steps)
        self.second.register_buffer("steps", steps)
        self.scale = torch.full((8,), 0.5)
        self.head = nn.Linear(8, num_classes)

    def forward(self, x):
        x = self.stem(x).mean((2, 3)) * self.scale
        return self.head(self.second(self.first(x)))


def test_a_built_model_keeps_its_ties_and_its_plain_tensors_and_counts_as_the_real_one(monkeypatch):
    from trainer_backend.rank.forecast.memory_estimate import MemoryPlan

    register(monkeypatch, "parallax_rates_from_tensors", RatesFromTensors)
    config = RunConfig(model="parallax_rates_from_tensors", image_size=SIZE, batch_size=8, optimizer="adam")
    plan = MemoryPlan(config, CLASSES, CHANNELS, None)
    assert plan.model.first.weight is plan.model.second.weight and plan.model.first.steps is plan.model.second.steps
    real = RatesFromTensors(num_classes=CLASSES, in_chans=CHANNELS).train()
    assert plan.trace(8) == trace_step(real, torch.optim.Adam(real.parameters()), (8, CHANNELS, SIZE, SIZE))
    (device,) = estimate_memory(config, num_classes=CLASSES, in_chans=CHANNELS).devices
    assert device.parameters == sum(p.numel() * 4 for p in real.parameters())  # the shared weight once


class CountsItsWeights(nn.Module):
    def __init__(self, num_classes: int = 10, in_chans: int = 3, **_):
        super().__init__()
        self.head = nn.Linear(in_chans, num_classes)
        self.width = int(self.head.weight.abs().sum().item() * 0)  # a value read off a parameter


def test_a_model_that_cannot_be_built_without_its_weights_is_refused_in_one_line(monkeypatch):
    register(monkeypatch, "parallax_counts_its_weights", CountsItsWeights)
    with pytest.raises(EstimateError, match=r"^model 'parallax_counts_its_weights' cannot be built without its "
                                            r"weights to estimate its memory: DataDependentOutputException"):
        estimate_memory(RunConfig(model="parallax_counts_its_weights", image_size=SIZE, batch_size=8),
                        num_classes=CLASSES, in_chans=CHANNELS)


def test_activations_scale_with_the_batch_and_halve_under_bf16():
    from trainer_backend.rank.forecast.memory_estimate import MemoryPlan

    config = RunConfig(model=MODEL, image_size=32, batch_size=32)
    small = estimate_memory(config, num_classes=CLASSES, in_chans=CHANNELS).devices[0]
    large = estimate_memory(config.replace(batch_size=64), num_classes=CLASSES, in_chans=CHANNELS).devices[0]
    assert (small.parameters, small.gradients, small.optimizer) == (large.parameters, large.gradients, large.optimizer)
    fp32 = MemoryPlan(config, CLASSES, CHANNELS, None)
    kept = {b: fp32.trace(b).forward_kept - fp32.trace(b).input_bytes for b in (32, 64)}
    assert kept[64] == pytest.approx(2 * kept[32], rel=0.01)
    plan = MemoryPlan(config, CLASSES, CHANNELS, torch.bfloat16)
    bf16 = plan.trace(64)
    # Autocast keeps a bf16 copy of each convolution's and linear layer's weight for backward;
    # their outputs are bf16, while BatchNorm's saved statistics and the input stay fp32.
    weight_copies = 2 * sum(m.weight.numel() for m in plan.model.modules() if isinstance(m, (nn.Conv2d, nn.Linear)))
    assert 0.45 * kept[64] < bf16.forward_kept - bf16.input_bytes - weight_copies < 0.75 * kept[64]


def test_a_batch_of_one_per_device_is_refused_in_one_line():
    config = RunConfig(model=MODEL, image_size=SIZE, batch_size=2, strategy="ddp", devices=("cpu", "cpu"))
    with pytest.raises(EstimateError, match="on 1 image"):
        estimate_memory(config, num_classes=CLASSES, in_chans=CHANNELS)


def test_verdicts_say_what_is_to_spare_or_missing():
    assert verdict(10 * 1024, 41 * 1024) == "fits, 31 GB to spare"
    assert verdict(52 * 1024, 39 * 1024) == "needs about 52 GB, 39 GB free"
    assert verdict(1.5 * 1024, 1 * 1024) == "needs about 1.5 GB, 1.0 GB free"
    assert verdict(21.4 * 1024, 21.1 * 1024) == "needs about 21.4 GB, 21.1 GB free"
    estimate = MemoryEstimate("ddp", [DeviceMemory("rank0:cpu", activations=3 * MB),
                                      DeviceMemory("rank1:cpu", activations=3 * MB)], None)
    (fit,) = fits(estimate, {"cpu": 5.0})  # CPU processes share the host's memory
    assert fit.needed_mb == 6.0 and not fit.fits


def test_suggestions_are_estimated_and_fit():
    config = RunConfig(model=MODEL, image_size=64, batch_size=256)
    needed = estimate_memory(config, num_classes=CLASSES, in_chans=CHANNELS).largest.total_mb
    free = {"cpu": needed * 0.6}
    (found,) = suggestions(config, CLASSES, CHANNELS, free)
    batch = int(found.removeprefix("a global batch of "))
    assert 64 < batch < 256 and batch != 128  # not a mere halving: the step between is filled in
    smaller = estimate_memory(config.replace(batch_size=batch), num_classes=CLASSES, in_chans=CHANNELS)
    assert smaller.largest.total_mb <= free["cpu"]
    larger = estimate_memory(config.replace(batch_size=batch + batch // 16), num_classes=CLASSES, in_chans=CHANNELS)
    assert larger.largest.total_mb > free["cpu"]  # close to the largest that fits
    assert "fits, " in format_table(smaller, free)


# --- the command line ------------------------------------------------------------------------

def test_the_cli_prints_every_strategys_table_and_json(cli):
    flags = ("--model", MODEL, "--image-size", str(SIZE), "--batch-size", "8", "--devices", "cpu,cpu")
    result = cli("estimate", *flags, "--strategies", "single,ddp,fsdp,pp")
    assert result.returncode == 0, result.stderr
    for label in ("cpu ", "rank0:cpu", "rank1:cpu"):
        assert label in result.stdout
    assert result.stdout.count("strategy ") == 4 and result.stdout.count("On CPU the run measures") == 1
    result = cli("estimate", *flags, "--strategy", "fsdp", "--json")
    assert result.returncode == 0, result.stderr
    (report,) = json.loads(result.stdout)
    assert report["strategy"] == "fsdp" and set(report["devices"]) == {"rank0:cpu", "rank1:cpu"}
    expected = estimate_memory(world_config("fsdp").replace(optimizer="adam"), num_classes=10, in_chans=1)
    assert report["devices"] == {d.label: d.to_dict() for d in expected.devices}  # digits: 10 classes, 1 channel
    (fit,) = report["fits"]
    assert fit["device"] == "cpu" and fit["fits"] and fit["verdict"].startswith("fits, ")


def test_of_several_strategies_one_that_cannot_be_estimated_is_named_and_the_others_are_shown(parallax_home, capsys):
    """A ViT's layers do not run in sequence, so no pipeline can be cut from it: that strategy gets
    its line, and the others their tables (as the Launch page's table gives each its row)."""
    from trainer_backend.control.cli import main

    flags = ["estimate", "--model", "test_vit", "--image-size", "32", "--batch-size", "8", "--devices", "cpu,cpu",
             "--strategies", "single,pp,fsdp"]
    assert main(flags) == 2
    out, err = capsys.readouterr()
    assert err == "error: strategy pp: model 'test_vit' cannot be split into stages for pp: its layers do not run in sequence\n"
    assert [line.split(",")[0] for line in out.splitlines() if line.startswith("strategy ")] == [
        "strategy single", "strategy fsdp"]
    assert main([*flags, "--json"]) == 2
    out, err = capsys.readouterr()
    assert [report["strategy"] for report in json.loads(out)] == ["single", "fsdp"] and err.count("\n") == 1


def test_the_cli_refuses_what_cannot_be_estimated_in_one_line(cli):
    result = cli("estimate", "--model", MODEL, "--image-size", "16", "--batch-size", "2", "--strategy", "ddp",
                 "--devices", "cpu,cpu")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "on 1 image(s) per device fails" in result.stderr
    result = cli("estimate", "--model", "resnet5O")
    assert result.returncode == 2 and "unknown model 'resnet5O'" in result.stderr


# --- parameters, gradients and optimizer state against what the strategies hold ------------

def _one_step(strategy, model, optimizer, loader):
    from trainer_backend.rank.loop import train_one_epoch

    train_one_epoch(model, loader, optimizer, strategy)


def _loader(batch: int, steps: int) -> DataLoader:
    images = torch.randn(batch * steps, CHANNELS, SIZE, SIZE, generator=torch.Generator().manual_seed(0))
    labels = torch.arange(batch * steps) % CLASSES
    return DataLoader(list(zip(images, labels)), batch_size=batch)


def _held(config: RunConfig, rank: int = 0, port: int = 0):
    from trainer_backend.rank.trainer import build_optimizer, make_strategy

    strategy = make_strategy(config, rank, in_chans=CHANNELS, store_host="127.0.0.1", store_port=port)
    strategy.setup()
    torch.manual_seed(0)
    model = strategy.wrap(create_model(MODEL, num_classes=CLASSES, in_chans=CHANNELS))
    optimizer = build_optimizer(config, model.parameters())
    held = HeldMemory(model, optimizer, strategy.devices)
    _one_step(strategy, model, optimizer, _loader(config.process_batch, 2))
    return strategy, held


def _assert_state_matches(estimate: MemoryEstimate, measured: dict[str, dict]):
    assert set(measured) == {d.label for d in estimate.devices}
    for device in estimate.devices:
        got = device.to_dict()
        for part in ("parameters_mb", "gradients_mb", "optimizer_mb"):
            assert got[part] == pytest.approx(measured[device.label][part], rel=0.01), (device.label, part)


@pytest.mark.parametrize("strategy,devices", [("single", ("cpu",)), ("dp", ("cpu", "cpu")), ("mp", ("cpu", "cpu"))])
def test_one_process_strategies_hold_what_the_estimate_says(strategy, devices):
    config = RunConfig(model=MODEL, image_size=SIZE, batch_size=8, strategy=strategy, devices=devices,
                       optimizer="adam")
    _, held = _held(config)
    estimate = estimate_memory(config, num_classes=CLASSES, in_chans=CHANNELS)
    _assert_state_matches(estimate, local_breakdown(held.mb, {}))


WORLD_CONFIGS = {
    "ddp": dict(strategy="ddp", optimizer="adam"),
    "fsdp": dict(strategy="fsdp", optimizer="adamw"),
    "pp": dict(strategy="pp", optimizer="sgd", microbatches=2),
    "pp_1f1b": dict(strategy="pp", optimizer="adam", microbatches=4, pipeline_schedule="1f1b"),
}


def world_config(name: str) -> RunConfig:
    return RunConfig(model=MODEL, image_size=SIZE, batch_size=8, devices=("cpu", "cpu"), **WORLD_CONFIGS[name])


def _world(rank: int, port: int, out_path: str) -> None:
    results, strategies = {}, []
    try:
        for name in WORLD_CONFIGS:
            strategy, held = _held(world_config(name), rank, port)
            strategies.append(strategy)
            results[name] = memory_breakdown(strategy, held.mb, {})
    finally:
        if strategies:
            strategies[0].teardown()
    leave_with_results(rank, results, out_path)


@pytest.fixture(scope="module")
def world_of_two(tmp_path_factory) -> dict:
    return world_results(tmp_path_factory, _world, 2, timeout_s=SPAWN_TIMEOUT_S)


@pytest.mark.parametrize("name", list(WORLD_CONFIGS))
def test_each_rank_holds_what_the_estimate_says(world_of_two, name):
    estimate = estimate_memory(world_config(name), num_classes=CLASSES, in_chans=CHANNELS)
    _assert_state_matches(estimate, world_of_two[name])


def test_a_run_stores_its_estimate_and_it_matches_what_the_run_measured(shared_runs):
    """ddp on two CPU processes, through the CLI: the estimate made before training is in the
    run's measurements, and its parameters, gradients and optimizer state are what each rank held."""
    import pandas as pd

    from reports.memory_check import STATE, estimate_check_frame

    run = shared_runs["ddp_tiny"]
    assert run["status"] == "completed", run["error"]
    estimate = run["measurements"]["memory_estimate"]
    assert estimate["strategy"] == "ddp" and set(estimate["devices"]) == {"rank0:cpu", "rank1:cpu"}
    epochs = pd.DataFrame(run["epochs"]).assign(run_id=run["run_id"])
    frame = estimate_check_frame([{"id": run["run_id"], "measurements": run["measurements"]}], epochs)
    assert frame["device"].tolist() == ["rank0:cpu", "rank1:cpu"] and set(frame["compared"]) == {STATE}
    assert frame["error"].abs().max() < 0.01, frame


# --- how each strategy places memory on GPUs (estimated here without one) -------------------

@pytest.fixture
def two_gpus(monkeypatch):
    from tests.nvml_machines import pin_cuda_count

    pin_cuda_count(monkeypatch, 2)


def gpu_estimate(strategy: str, **changes) -> dict[str, DeviceMemory]:
    config = RunConfig(model=MODEL, image_size=96, batch_size=128, strategy=strategy,
                       devices=("cuda:0",) if strategy == "single" else ("cuda:0", "cuda:1"), **changes)
    estimate = estimate_memory(config, num_classes=CLASSES, in_chans=CHANNELS)
    return {d.label: d for d in estimate.devices}


def test_each_strategy_places_its_parts_on_the_gpus_as_it_runs(two_gpus):
    single = gpu_estimate("single", amp="bf16")["cuda:0"]
    whole = single.parameters
    ddp = gpu_estimate("ddp", amp="bf16")
    assert set(ddp) == {"cuda:0", "cuda:1"}
    for device in ddp.values():  # a full replica, its buckets, half the batch
        assert (device.parameters, device.comm) == (whole, device.gradients)
        assert device.activations < single.activations
    dp = gpu_estimate("dp", amp="bf16")
    assert dp["cuda:0"].parameters == whole and dp["cuda:1"].parameters == dp["cuda:1"].optimizer == 0
    assert dp["cuda:1"].activations > whole  # the replica made each step, with its gradients
    mp = gpu_estimate("mp", amp="bf16")
    assert mp["cuda:0"].parameters + mp["cuda:1"].parameters == whole
    fsdp = gpu_estimate("fsdp", amp="bf16")
    assert all(d.parameters == pytest.approx(whole / 2, rel=0.01) for d in fsdp.values())
    from trainer_backend.rank.strategies import sharded_blocks

    with torch.device("meta"):
        units = [sum(p.numel() * 4 for p in block.parameters())
                 for block in sharded_blocks(create_model(MODEL, num_classes=CLASSES, in_chans=CHANNELS))]
    # The unit computing, the next one gathered ahead and the unsharded gradients: the largest unit thrice.
    assert all(d.comm == 3 * max(units) for d in fsdp.values())
    pp = gpu_estimate("pp", amp="bf16", microbatches=4)
    assert pp["cuda:0"].comm == pp["cuda:1"].comm > 0  # 4 activations coming in, 4 gradients going back


def test_gpipe_keeps_every_microbatch_and_1f1b_fewer(two_gpus):
    """GPipe runs all 8 forwards before any backward; 1F1B keeps 2 in flight on the first of 2
    stages and 1 on the last."""
    from trainer_backend.rank.forecast.memory_estimate import MemoryPlan

    gpipe = gpu_estimate("pp", amp="off", microbatches=8)
    one_f_one_b = gpu_estimate("pp", amp="off", microbatches=8, pipeline_schedule="1f1b")
    config = RunConfig(model=MODEL, image_size=96, batch_size=128, strategy="pp", devices=("cuda:0", "cuda:1"),
                       amp="off", microbatches=8)
    last = MemoryPlan(config, CLASSES, CHANNELS, None).trace(16, 1)
    kept = last.forward_kept - last.input_bytes
    assert gpipe["cuda:1"].activations - one_f_one_b["cuda:1"].activations == 7 * kept
    assert one_f_one_b["cuda:0"].activations < gpipe["cuda:0"].activations


def test_amp_auto_without_cuda_is_estimated_as_bf16_and_says_so(two_gpus):
    config = RunConfig(model=MODEL, image_size=96, batch_size=128, devices=("cuda:0",))
    estimate = estimate_memory(config, num_classes=CLASSES, in_chans=CHANNELS)
    assert estimate.amp_dtype == "bfloat16" and estimate.notes[0].startswith("AMP auto is estimated as bf16")
    fp32 = estimate_memory(config.replace(amp="off"), num_classes=CLASSES, in_chans=CHANNELS)
    assert fp32.devices[0].activations > estimate.devices[0].activations


# --- the dataset a CUDA run keeps on its GPU -------------------------------------------------

def test_the_dataset_is_counted_on_the_gpu_each_process_keeps_it_on(two_gpu_machine):
    """Both splits' stored pixels and labels, as the run stores them, on every rank's GPU where one
    process runs per device, and on the first GPU only where one process spans them (dp, mp)."""
    from trainer_backend.datasets import prepare_data

    data = prepare_data("digits", image_size=96)
    stored = data.train.stored_bytes + data.val.stored_bytes + 8 * (len(data.train) + len(data.val))
    single = gpu_estimate("single")["cuda:0"]
    assert single.data == stored and single.to_dict()["data_mb"] == round(stored / 2**20, 3)
    assert single.total == single.parameters + single.gradients + single.optimizer + single.activations + stored
    for strategy in ("ddp", "fsdp"):  # a process per device, each building its data
        assert [d.data for d in gpu_estimate(strategy).values()] == [stored, stored], strategy
    for strategy in ("dp", "mp", "pp"):  # one process, or a pipeline's first stage, the only one fed images
        placed = gpu_estimate(strategy)
        assert (placed["cuda:0"].data, placed["cuda:1"].data) == (stored, 0), strategy
    config = RunConfig(model=MODEL, image_size=96, batch_size=128, devices=("cuda:0",))
    assert "data" in format_table(estimate_memory(config, num_classes=CLASSES, in_chans=CHANNELS)).splitlines()[0]
    # Stored larger than trained: the pixels are kept at the stored size.
    larger = estimate_memory(config.replace(image_size=64, stored_size=96), num_classes=CLASSES, in_chans=CHANNELS)
    assert larger.devices[0].data == stored


def test_each_gpu_keeps_the_dataset_by_its_own_memory_and_one_nvml_cannot_read_is_named(fake_nvml, two_gpus):
    """cuda:1 (the A6000, the higher bus id, given 100 MB here) has a tenth of 10 MB, cuda:0 of 2.4 GB:
    digits at 96 px (16 MB) stay on cuda:0 only."""
    fake_nvml([{**TWO_GPUS[0], "memory_total_mb": 100}, TWO_GPUS[1]])
    ddp = gpu_estimate("ddp")
    assert ddp["cuda:0"].data > 0 and ddp["cuda:1"].data == 0
    fake_nvml(None)
    config = RunConfig(model=MODEL, image_size=96, batch_size=128, devices=("cuda:0",), amp="bf16")
    estimate = estimate_memory(config, num_classes=CLASSES, in_chans=CHANNELS)
    assert estimate.devices[0].data == 0
    assert any(note.startswith("The dataset's 16 MB are not counted on cuda:0: its memory cannot be read here")
               for note in estimate.notes), estimate.notes
    cpu = estimate_memory(RunConfig(model=MODEL, image_size=96, batch_size=128), num_classes=CLASSES, in_chans=CHANNELS)
    assert cpu.devices[0].data == 0 and not any("dataset" in note for note in cpu.notes)
    workers = estimate_memory(config.replace(decode="workers"), num_classes=CLASSES, in_chans=CHANNELS)
    assert workers.devices[0].data == 0


def test_a_run_stores_the_dataset_its_gpus_keep_in_its_estimate(two_gpus):
    from trainer_backend.rank.forecast.memory_estimate import StoredData, stored_estimate

    config = RunConfig(model=MODEL, image_size=96, batch_size=128, strategy="ddp", devices=("cuda:0", "cuda:1"),
                       amp="bf16")
    stored = StoredData(2 * 2**20, 2**17, {"cuda:0": 10 * 2**20, "cuda:1": 20 * 2**20})  # 2 MB of pixels, 1 MB of labels
    devices = stored_estimate(config, CLASSES, CHANNELS, stored)["memory_estimate"]["devices"]
    assert (devices["cuda:0"]["data_mb"], devices["cuda:1"]["data_mb"]) == (0.0, 3.0)
    assert stored_estimate(config, CLASSES, CHANNELS)["memory_estimate"]["devices"]["cuda:0"]["data_mb"] == 0.0


@pytest.mark.usefixtures("own_data_dir")
def test_a_datasets_stored_size_is_read_from_a_look_as_preparing_it_stores_it(parallax_home, tmp_path):
    from tests.trainer_backend.datasets.test_streaming_decode import make_jpeg_folder
    from trainer_backend.datasets import prepare_data, stored_split_size

    folder = tmp_path / "jpegs"
    make_jpeg_folder(folder, 12, 40)
    data = prepare_data(str(folder), image_size=32)
    assert stored_split_size(str(folder), 32) == (data.train.stored_bytes + data.val.stored_bytes, 12)
    assert 12 * 3 * 32 * 32 == data.train.stored_bytes + data.val.stored_bytes
    # Not downloaded yet: counted as the download will be, its test split too.
    assert stored_split_size("cifar10", 32) == (60_000 * 3 * 32 * 32, 60_000)
    assert stored_split_size("cifar10", 32, val_from="train") == (50_000 * 3 * 32 * 32, 50_000)
    assert stored_split_size("eurosat", 64) == (27_000 * 3 * 64 * 64, 27_000)


def test_a_search_of_changes_looks_at_the_dataset_and_the_gpus_once(two_gpu_machine, monkeypatch):
    """The batch search and the other changes estimate one config many times; none of them changes
    the dataset, so NVML is read once, and the kept dataset is on every candidate's first GPU."""
    from contract import devices

    reads = []
    real = devices.gpu_statuses
    monkeypatch.setattr(devices, "gpu_statuses", lambda *a, **k: reads.append(1) or real(*a, **k))
    config = RunConfig(model=MODEL, image_size=96, batch_size=256, devices=("cuda:0",), amp="off")
    needed = estimate_memory(config, num_classes=CLASSES, in_chans=CHANNELS).devices[0]
    assert needed.data > 0 and len(reads) == 1
    free = {"cuda:0": needed.total_mb * 0.7, "cuda:1": needed.total_mb * 0.7}
    found = suggestions(config, CLASSES, CHANNELS, free, ["cuda:0", "cuda:1"])
    assert any(f.startswith("a global batch of ") for f in found), found
    assert len(reads) == 2, len(reads)  # the search's one look


# --- cuBLAS's workspaces ------------------------------------------------------------------------

def test_a_step_counts_the_threads_that_run_matrix_products():
    """On CUDA forward runs in the calling thread and backward in autograd's: a linear layer runs a
    product in both, a network of convolutions in neither."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        linear = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        convolutions = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        traces = [trace_step(net, torch.optim.SGD(net.parameters(), lr=0.1), shape)
                  for net, shape in ((linear, (64, 8)), (convolutions, (2, 3, 8, 8)))]
    assert [trace.blas_threads for trace in traces] == [2, 0]


def test_cublas_workspaces_are_counted_per_thread_by_each_gpus_generation(fake_nvml, two_gpus, monkeypatch):
    """resnet18's head runs a product in forward and in backward: two workspaces on each GPU that holds
    it, 8 MiB + 128 KiB each on the A6000 (8.6) and the 4090 (8.9), 32 MiB on Hopper and Blackwell (9.x,
    10.x, 12.x), the sum of CUBLAS_WORKSPACE_CONFIG's pairs where it is set; none on model parallel's first
    stage, which has no linear layer, unless it crops the batches; none where NVML cannot tell the
    generation, and the estimate says so."""
    from trainer_backend.rank.forecast.memory_estimate import cublas_workspace_bytes

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    mib = 2**20
    fake_nvml([{**gpu, "capability": None} for gpu in TWO_GPUS])
    config = RunConfig(model=MODEL, image_size=96, batch_size=128, strategy="ddp", devices=("cuda:0", "cuda:1"),
                       amp="bf16")
    unknown = estimate_memory(config, num_classes=CLASSES, in_chans=CHANNELS)
    assert any(note.startswith("cuBLAS's workspaces (32 MiB on Hopper and Blackwell, 8.125 MiB on other GPUs, for "
                               "each thread that runs a matrix product) are not counted on cuda:0, cuda:1")
               for note in unknown.notes), unknown.notes
    bare = {d.label: d.activations for d in unknown.devices}
    strategies = ("single", "dp", "ddp", "fsdp", "mp", "pp")

    def activations() -> dict[str, list[int]]:
        return {name: [d.activations for d in gpu_estimate(name, amp="bf16").values()] for name in strategies}

    before = activations()
    fake_nvml(TWO_GPUS)
    two = 2 * (8 * mib + 128 * 1024)
    added = {name: [a - b for a, b in zip(now, before[name])] for name, now in activations().items()}
    # DataParallel over two GPUs: the run's thread evaluates the model unwrapped on cuda:0, a third handle there.
    assert added == {"single": [two], "dp": [3 * two // 2, two], "ddp": [two, two], "fsdp": [two, two],
                     "mp": [0, two], "pp": [0, two]}
    stored = estimate_memory(config, num_classes=CLASSES, in_chans=CHANNELS).to_dict()["devices"]
    assert [parts["workspace_mb"] for parts in stored.values()] == [round(two / mib, 3)] * 2  # of activations_mb
    # Batches cropped on the GPU: a product in the forward's thread, which adds a workspace only on a first
    # stage that runs no product of its own (model parallel's and a pipeline's, whose first stage alone takes images).
    crops = ("single", "dp", "mp", "pp")
    uncropped = {name: [d.activations for d in gpu_estimate(name, amp="bf16").values()] for name in crops}
    for changes in ({"augment": "flip,crop"}, {"stored_size": 128}):
        cropped = {name: [d.activations - b for d, b in zip(gpu_estimate(name, amp="bf16", **changes).values(), plain)]
                   for name, plain in uncropped.items()}
        assert cropped == {"single": [0], "dp": [0, 0], "mp": [two // 2, 0], "pp": [two // 2, 0]}, changes
    assert not any("cuBLAS" in note for note in estimate_memory(config, num_classes=CLASSES, in_chans=CHANNELS).notes)

    fake_nvml([{**TWO_GPUS[0], "capability": [9, 0]}, TWO_GPUS[1]])  # the first listed is cuda:1 (higher bus id)
    hopper = gpu_estimate("ddp", amp="bf16")
    assert (hopper["cuda:0"].activations - bare["cuda:0"], hopper["cuda:1"].activations - bare["cuda:1"]) == (
        2 * (8 * mib + 128 * 1024), 2 * 32 * mib)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:1:16:8")
    assert cublas_workspace_bytes((9, 0)) == cublas_workspace_bytes((8, 6)) == 4 * mib + 128 * 1024
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    assert [cublas_workspace_bytes((major, 0)) for major in (7, 8, 9, 10, 12)] == [two // 2] * 2 + [32 * mib] * 3
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:1:16:8")
    assert gpu_estimate("ddp", amp="bf16")["cuda:1"].activations - bare["cuda:1"] == 2 * (4 * mib + 128 * 1024)
