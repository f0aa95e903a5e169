"""Will it fit? Peak memory per device for a config, before anything launches.

    estimate = estimate_memory(config, num_classes=10, in_chans=3)     # no GPU touched, no weights read
    for device in estimate.devices:
        print(device.label, device.total_mb)
    python -m trainer_backend estimate --model resnet50 --image-size 224 --batch-size 256 --strategy ddp --devices 0,1

The parts are the ones ``memory_breakdown`` measures after the first step, so the two compare
one to one:

- parameters, gradients and optimizer state: counted from the model's parameter shapes and the
  optimizer (Adam and AdamW two states per parameter and a step count, SGD one momentum buffer),
  as the strategy places them; AMP's autocast keeps all three in fp32;
- activations: one training step (forward, backward, optimizer step) run under PyTorch's fake
  tensors, with every tensor storage it allocates counted while it lives: what backward keeps,
  the gradients of activations, the optimizer's temporaries, the input batch; autocast runs as in
  training, so bf16/fp16 activations are counted at their size. The model's buffers (BatchNorm
  statistics) are added here too, as the breakdown's "activations and other" holds them, and so
  are cuBLAS's workspaces on a GPU: PyTorch takes one from the caching allocator for each thread
  that runs a matrix product there (forward's and backward's: two for a model with a linear head;
  ``blas_workspace`` says when cropping batches on the GPU and DataParallel's threads add one), 32 MiB
  each on Hopper and Blackwell and 8 MiB + 128 KiB elsewhere (``cublas_workspace_bytes``);
- communication buffers: DDP's gradient buckets, FSDP's gathered units, a pipeline's receive buffers;
- the dataset: a CUDA run keeps both splits' stored pixels and labels on each process's first GPU
  as --data-on-device says (``kept_on_device``: under auto where the pixels take at most a tenth
  of its free memory); a run passes its data, whether it kept it, and CUDA's compute capability per
  GPU (``run_stored_data``), an estimate before launch looks at the dataset and NVML's free memory
  (``stored_data``).

Each strategy says how it places the model's parts and buffers (its class's ``memory_placement``, one of
strategies/placements.py's functions); this module provides the counts they place, and puts the dataset
on each process's first device.

The trace is memory_trace.py's; whether it fits, and what would, is memory_fit.py's. What no
trace here sees: CUDA's context (not in the allocator's peak either), cuDNN's workspaces (taken and given back
within each convolution), cuBLASLt's own workspace (1 MiB per handle, where a release keeps it apart from
cuBLAS's) and the caching allocator's rounding and fragmentation.
"""

from __future__ import annotations

import functools
import os
import re
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from contract.config import RunConfig
from contract.strategy_specs import spec
from trainer_backend.datasets.tensor_dataset import DEVICE_DATA_SHARE, kept_on_device
from trainer_backend.rank.forecast.memory_trace import EstimateError, FakeModel, StepTrace, fake_model
from trainer_backend.rank.inputs import crops_on_device

MB = 2**20
PARTS = ("parameters_mb", "gradients_mb", "optimizer_mb", "activations_mb", "comm_mb", "data_mb")
# Bytes of each parameter's optimizer state per parameter byte (the step count comes on top).
OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "sgd": 1}
CPU_NOTE = ("On CPU the run measures parameters, gradients and optimizer state exactly; activations have no "
            "measured peak there (the CPU allocator keeps none), and each process also holds the interpreter "
            "and libraries, which no estimate counts.")


@dataclass
class DeviceMemory:
    """What one device holds at the step's peak, in bytes."""

    label: str
    parameters: int = 0
    gradients: int = 0
    optimizer: int = 0
    activations: int = 0
    comm: int = 0
    data: int = 0  # the dataset kept on the device
    workspace: int = 0  # of ``activations``: cuBLAS's workspaces, which do not follow the batch

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations + self.comm + self.data

    @property
    def total_mb(self) -> float:
        return self.total / MB

    def add(self, other: DeviceMemory) -> None:
        for name in ("parameters", "gradients", "optimizer", "activations", "comm", "data", "workspace"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def add_workspace(self, workspace: int) -> None:
        self.activations += workspace
        self.workspace += workspace

    def to_dict(self) -> dict[str, float]:
        """The parts, their total, and how much of the activations are cuBLAS's workspaces (``workspace_mb``)."""
        values = (self.parameters, self.gradients, self.optimizer, self.activations, self.comm, self.data)
        return {**{part: round(v / MB, 3) for part, v in zip(PARTS, values)}, "total_mb": round(self.total_mb, 3),
                "workspace_mb": round(self.workspace / MB, 3)}


@dataclass
class MemoryEstimate:
    strategy: str
    devices: list[DeviceMemory]
    amp_dtype: str | None
    notes: list[str] = field(default_factory=list)

    @property
    def largest(self) -> DeviceMemory:
        return max(self.devices, key=lambda d: d.total)

    def to_dict(self) -> dict:
        """What a run stores in ``measurements["memory_estimate"]``."""
        return {"strategy": self.strategy, "amp_dtype": self.amp_dtype, "notes": list(self.notes),
                "devices": {d.label: d.to_dict() for d in self.devices}}


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def optimizer_bytes(params, optimizer: str) -> int:
    """The optimizer's state for ``params`` as torch creates it at the first step: Adam's two
    moments and a float32 step count per parameter (on the host on CUDA, where it is not counted),
    SGD's momentum buffer."""
    return OPTIMIZER_STATES[optimizer] * tensor_bytes(params)


def step_count_bytes(params, optimizer: str, device_type: str) -> int:
    """Adam's per-parameter step counts: float32 scalars on the host (a CPU device counts them)."""
    return 4 * len(list(params)) if optimizer != "sgd" and device_type == "cpu" else 0



# --- what a strategy places ------------------------------------------------------------------

class MemoryPlan:
    """The counts a strategy's ``memory_placement`` places on its devices: the model's parts and
    traces of its steps, each traced once per batch (traces are cached across plans)."""

    def __init__(self, config: RunConfig, num_classes: int, in_chans: int, amp_dtype: torch.dtype | None,
                 gpus: StoredData | None = None):
        self.config, self.amp_dtype = config, amp_dtype
        self.num_classes, self.in_chans = num_classes, in_chans
        self.device_type = "cuda" if config.uses_cuda else "cpu"
        self.gpus = gpus or StoredData()  # what is known of the GPUs: their compute capability
        self.notes: list[str] = []
        self.workspace_unknown: list[str] = []  # GPUs whose cuBLAS workspaces could not be sized

    @functools.cached_property
    def fake(self) -> FakeModel:
        return fake_model(self.config.model, self.num_classes, self.in_chans, self.config.model_args)

    @property
    def model(self) -> nn.Module:
        return self.fake.model

    def labels(self) -> list[str]:
        """Each process's device as the measured breakdown names it (``rank_device_label``)."""
        config = self.config
        if config.world_size == 1:
            return list(dict.fromkeys(config.devices))
        if self.device_type == "cpu":
            return [f"rank{r}:cpu" for r in range(config.world_size)]
        if config.nodes > 1:
            return [f"rank{r}:{d}" for r, d in enumerate(config.devices)]
        return list(config.devices)

    def held(self, label: str, module: nn.Module) -> DeviceMemory:
        """Whole parameters, gradients and optimizer state of ``module``, and its buffers."""
        params = [p for p in module.parameters() if p.requires_grad]
        return DeviceMemory(label, parameters=tensor_bytes(module.parameters()), gradients=tensor_bytes(params),
                            optimizer=optimizer_bytes(params, self.config.optimizer)
                            + step_count_bytes(params, self.config.optimizer, self.device_type),
                            activations=tensor_bytes(module.buffers()))

    def trace(self, batch: int, stage: int | None = None) -> StepTrace:
        """A step of the whole model (``stage`` None) or of one stage, at ``batch`` images."""
        key = (self.config.model, self.num_classes, self.in_chans, self.config.image_size, self.config.optimizer,
               self.config.label_smoothing, str(self.amp_dtype), self.device_type,
               None if stage is None else len(self.config.devices), stage, batch)
        return _cached_trace(key, self, batch, stage)

    def step_activations(self, trace: StepTrace, held: DeviceMemory) -> int:
        """The step's peak beyond what ``held`` counts: the larger of forward and backward (with
        the optimizer state already there, as from the second step on) and the optimizer step;
        with gradient accumulation the gradients of earlier batches are there all along."""
        if self.config.accumulate_steps > 1:
            backward = trace.backward_peak - trace.grads_at_peak + held.gradients + held.optimizer
        else:
            backward = trace.backward_peak + held.optimizer
        peak = max(backward, trace.optimizer_peak)
        return max(0, peak - held.gradients - held.optimizer)

    def blas_workspace(self, label: str, trace: StepTrace, *, takes_input: bool = True,
                       forward_elsewhere: bool = False) -> int:
        """cuBLAS's workspaces on the GPU ``label`` whose step is ``trace``: one for each thread that runs a
        matrix product there. ``takes_input``: the run's own thread crops each batch there (``inputs.crops_on_device``),
        in the forward's thread. ``forward_elsewhere``: the training forward runs in threads of its own
        (DataParallel's over several GPUs), so the run's thread, which crops and evaluates the model
        unwrapped there, has a handle of its own. None on CPU; none where the GPU's compute capability is
        unknown, which ``workspace_unknown`` then names."""
        threads = set(trace.blas_phases)
        if takes_input and crops_on_device(self.config):
            threads.add("forward")
        if forward_elsewhere and "forward" in threads:
            threads.add("run's thread")
        if self.device_type != "cuda" or not threads:
            return 0
        capability = self.gpus.capability(label)
        if capability is None:
            self.workspace_unknown.append(label)
            return 0
        return len(threads) * cublas_workspace_bytes(capability)

    def whole(self, label: str, batch: int, *, forward_elsewhere: bool = False) -> DeviceMemory:
        """The model whole on one device, training on ``batch`` images it takes: single's placement."""
        held = self.held(label, self.model)
        trace = self.trace(batch)
        held.activations += self.step_activations(trace, held)
        held.add_workspace(self.blas_workspace(label, trace, forward_elsewhere=forward_elsewhere))
        return held

    def stages(self) -> tuple[list[nn.Sequential], list[tuple[int, ...]]]:
        return self.fake.stages(len(self.config.devices), self.config.image_size, self.config.strategy)

    def stage(self, index: int) -> nn.Module:
        return self.stages()[0][index]

    def input_bytes_per_image(self) -> int:
        return self.in_chans * self.config.image_size ** 2 * 4

    def stage_memory(self, label: str, index: int, batch: int, *, takes_input: bool) -> tuple[DeviceMemory, StepTrace]:
        """Stage ``index`` on one device training on ``batch`` images (a whole batch or a microbatch);
        ``takes_input``: the batches are cropped on this device too (``blas_workspace``)."""
        held = self.held(label, self.stage(index))
        trace = self.trace(batch, index)
        held.activations += self.step_activations(trace, held)
        held.add_workspace(self.blas_workspace(label, trace, takes_input=takes_input))
        return held, trace

    def shard(self, label: str, rank: int, world: int) -> DeviceMemory:
        """FSDP2's shard on ``rank``: each parameter cut along dim 0 into ``world`` chunks of
        ceil(rows / world) rows. The shard's storage is padded to a whole chunk, and so is its
        gradient (the reduce-scatter's output); the optimizer state is made like the unpadded
        local shard."""
        padded = local = 0
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            rows = p.shape[0] if p.dim() else 1
            per_row = p.numel() // rows * p.element_size()
            chunk = -(-rows // world)
            padded += chunk * per_row
            local += max(0, min(chunk, rows - rank * chunk)) * per_row
        optimizer = (OPTIMIZER_STATES[self.config.optimizer] * local
                     + step_count_bytes(params, self.config.optimizer, self.device_type))
        return DeviceMemory(label, parameters=padded, gradients=padded, optimizer=optimizer,
                            activations=tensor_bytes(self.model.buffers()))

    def fsdp_units(self) -> list[int]:
        """Unsharded bytes of each unit ``fully_shard`` gathers at once, as FSDP wraps the model
        (strategies.sharded_blocks), and of the root's own parameters, which stay gathered."""
        from trainer_backend.rank.strategies import sharded_blocks

        blocks = sharded_blocks(self.model)
        in_blocks = {id(p) for block in blocks for p in block.parameters()}
        root = sum(p.numel() * p.element_size() for p in self.model.parameters() if id(p) not in in_blocks)
        return [tensor_bytes(block.parameters()) for block in blocks] + [root]


_TRACES: dict = {}
MAX_CACHED_TRACES = 256


def _cached_trace(key, plan: MemoryPlan, batch: int, stage: int | None) -> StepTrace:
    """Traces depend only on the model, the batch and the precision: kept for the next estimate
    (the Launch page's suggestions re-estimate the same model many times). The optimizer step is
    traced once per module; at other batches its share is taken from there."""
    if key not in _TRACES:
        fake, config = plan.fake, plan.config
        step_key = (*key[:-1], "optimizer step")
        extra = _TRACES.get(step_key)
        if stage is None:
            shape = (batch, plan.in_chans, config.image_size, config.image_size)
            trace = fake.trace(fake.model, config, shape, plan.amp_dtype, optimizer_extra=extra)
        else:
            stages, shapes = plan.stages()
            trace = fake.trace(stages[stage], config, (batch, *shapes[stage]), plan.amp_dtype,
                               first=stage == 0, last=stage == len(stages) - 1, optimizer_extra=extra)
        if len(_TRACES) >= MAX_CACHED_TRACES:
            _TRACES.pop(next(iter(_TRACES)))
        _TRACES[key] = trace
        _TRACES.setdefault(step_key, trace.optimizer_extra)
    return _TRACES[key]


# --- the estimate ----------------------------------------------------------------------------

def estimate_amp_dtype(config: RunConfig) -> tuple[torch.dtype | None, str | None]:
    """The autocast dtype the run will train in (as the trainer resolves it), and a note when
    this machine cannot tell (AMP auto on GPUs torch does not see)."""
    from trainer_backend.rank.loop import resolve_amp, with_resolved_amp

    if not config.uses_cuda or config.amp == "off":
        return None, None
    dtype, note = None, None
    if config.amp == "auto" and not torch.cuda.is_available():
        dtype, note = torch.bfloat16, ("AMP auto is estimated as bf16: this process cannot ask the GPU whether it "
                                       "has bf16 (before Ampere it trains in fp16, the same size).")
    else:
        dtype = resolve_amp(with_resolved_amp(config).amp, torch.device(config.devices[0]))  # the weakest GPU's
    if spec(config.strategy).microbatched and dtype == torch.float16:
        return None, None  # as the trainer: pipelines cannot scale fp16 gradients, so train in fp32
    return dtype, note


def estimate_memory(config: RunConfig, *, num_classes: int, in_chans: int,
                    stored: StoredData | None = None) -> MemoryEstimate:
    """Peak memory per device of ``config``'s training step, without a GPU and without weights.
    ``stored``: the dataset's bytes and each GPU's memory where the run knows them; None looks
    (``stored_data``)."""
    from trainer_backend.rank.strategies.registry import strategy_class

    amp_dtype, note = estimate_amp_dtype(config)
    if stored is None:
        stored = stored_data(config)
    plan = MemoryPlan(config, num_classes, in_chans, amp_dtype, stored)
    devices = strategy_class(config.strategy).memory_placement(plan)
    merged: dict[str, DeviceMemory] = {}
    for device in devices:  # CPU "devices" of one process are one memory
        if device.label in merged:
            merged[device.label].add(device)
        else:
            merged[device.label] = device
    data_notes = []
    if stored.bytes:
        # Each process that reads images keeps the dataset on its first device: every rank's where one
        # process runs per device, save a pipeline's, whose first stage alone reads them.
        labels = plan.labels()
        unread = []
        strategy = spec(config.strategy)
        for label in labels if strategy.distributed and not strategy.microbatched else labels[:1]:
            kept = stored.kept_on(label)
            if kept is None:
                unread.append(label)
            else:
                merged[label].data = kept
        if unread:
            data_notes.append(f"The dataset's {stored.bytes / MB:,.0f} MB are not counted on {', '.join(unread)}: "
                              "its memory cannot be read here, and a run keeps them on a GPU where they take at most "
                              f"{DEVICE_DATA_SHARE:.0%} of its free memory (--data-on-device auto).")
    data_notes += [stored.note] if stored.note else []
    if plan.workspace_unknown:
        data_notes.append(f"cuBLAS's workspaces ({cublas_workspace_bytes((9, 0)) / MB:g} MiB on Hopper and Blackwell, "
                          f"{cublas_workspace_bytes((8, 0)) / MB:g} MiB on other GPUs, for each thread that runs a "
                          f"matrix product) are not counted on {', '.join(dict.fromkeys(plan.workspace_unknown))}: "
                          "the GPU's compute capability cannot be read here.")
    notes = ([note] if note else []) + plan.notes + data_notes + ([] if config.uses_cuda else [CPU_NOTE])
    return MemoryEstimate(config.strategy, list(merged.values()),
                          None if amp_dtype is None else str(amp_dtype).removeprefix("torch."), notes)


@dataclass(frozen=True)
class StoredData:
    """What a CUDA run may keep on its GPUs (``trainer.keep_on_device``): both splits' ``images``,
    their stored pixels and int64 labels, kept on a GPU as ``mode`` (--data-on-device) says given
    its free memory (``device_bytes``, by "cuda:N"): under auto where that is at least ten times
    ``pixel_bytes``. ``kept``: what a run decided, where it did (then the memory is not asked).
    ``note`` says why the dataset could not be sized. With each GPU's compute capability
    (``capabilities``), which sizes cuBLAS's workspaces."""

    pixel_bytes: int = 0
    images: int = 0
    device_bytes: dict[str, int] = field(default_factory=dict)
    note: str | None = None
    capabilities: dict[str, tuple[int, int]] = field(default_factory=dict)
    mode: str = "auto"
    kept: bool | None = None

    @property
    def bytes(self) -> int:
        return self.pixel_bytes + LABEL_BYTES * self.images

    def kept_on(self, label: str) -> int | None:
        """Bytes kept on the device ``label`` names ("cuda:1", or "rank3:cuda:1" on another node,
        judged by this machine's GPU of that index); None where its memory is unknown."""
        if self.kept is not None:
            return self.bytes if self.kept else 0
        if self.mode == "on":  # kept, or the run is refused before it trains
            return self.bytes
        free = self.device_bytes.get(_gpu(label))
        if free is None:
            return None
        return self.bytes if kept_on_device(self.pixel_bytes, free, self.mode) else 0

    def capability(self, label: str) -> tuple[int, int] | None:
        return self.capabilities.get(_gpu(label))


def _gpu(label: str) -> str:
    """The GPU of this machine a device label names: "cuda:1" for "cuda:1" and for "rank3:cuda:1" (a rank on
    another node, judged by this machine's GPU of that index)."""
    return label.split(":", 1)[1] if label.startswith("rank") else label


# Compute capabilities (major) whose cuBLAS handles get 32 MiB: Hopper and Blackwell, as ATen's
# CublasHandlePool.cpp sizes them; releases before Blackwell gave 32 MiB to 9.0 only, less than counted here.
WORKSPACE_32MIB_MAJORS = (9, 10, 11, 12)


def cublas_workspace_bytes(capability: tuple[int, int]) -> int:
    """The workspace PyTorch gives each cuBLAS handle (one per thread and GPU) on a GPU of ``capability``,
    from the caching allocator, so that the allocator's peak counts it: CUBLAS_WORKSPACE_CONFIG's
    ``:KiB:COUNT`` pairs added up where it is set, else 32 MiB on Hopper and Blackwell
    (``WORKSPACE_32MIB_MAJORS``) and 8 MiB + 128 KiB on other GPUs."""
    pairs = re.findall(r":([0-9]+):([0-9]+)", os.environ.get("CUBLAS_WORKSPACE_CONFIG", ""))
    if pairs:
        return sum(int(kib) * 1024 * int(count) for kib, count in pairs)
    return 4096 * 1024 * 8 if capability[0] in WORKSPACE_32MIB_MAJORS else 4096 * 1024 * 2 + 16 * 1024 * 8


def stored_data(config: RunConfig) -> StoredData:
    """``StoredData`` from a look before launch: the dataset's size without decoding or
    downloading it, and each GPU's free memory from NVML now (the run judges its own after its
    model is placed, so a dataset within a few MB of the share can be judged differently), with
    their compute capabilities. Nothing for CPU runs, and no dataset for files
    decoded by the loader workers. A search that estimates many changes of one config looks once and
    passes the result on."""
    if not config.uses_cuda:
        return StoredData()
    from contract.devices import gpu_statuses

    gpus = gpu_statuses()
    free = {f"cuda:{g.index}": int(max(0.0, g.memory_total_mb - g.memory_used_mb) * MB) for g in gpus}
    capabilities = {f"cuda:{g.index}": g.compute_capability for g in gpus if g.compute_capability}
    if config.decode == "workers" or config.data_on_device == "off":
        return StoredData(capabilities=capabilities)
    try:
        pixels, images = _split_size(config.dataset, config.stored_size or config.image_size, config.bands,
                                     config.band_scale, config.val_from, _looked_at())
    except (OSError, ValueError) as exc:  # DatasetError is a ValueError
        return StoredData(note=f"The dataset is not counted: its size could not be read ({exc})."[:400],
                          capabilities=capabilities)
    return StoredData(pixels, images, free, capabilities=capabilities, mode=config.data_on_device)


def run_stored_data(data, devices: list[torch.device], kept: bool = False) -> StoredData:
    """``StoredData`` of a run's prepared ``data``: the splits, ``kept`` on its GPU or not (as this
    process's ``keep_on_device`` decided), and the compute capability of this machine's GPUs."""
    from trainer_backend.datasets import ImageTensorDataset

    if not any(d.type == "cuda" for d in devices):
        return StoredData()
    properties = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    capabilities = {f"cuda:{i}": (p.major, p.minor) for i, p in enumerate(properties)}
    if not isinstance(data.train, ImageTensorDataset):
        return StoredData(capabilities=capabilities)
    return StoredData(data.train.stored_bytes + data.val.stored_bytes, len(data.train) + len(data.val),
                      capabilities=capabilities, kept=kept)


LABEL_BYTES = 8  # int64, copied beside the pixels
LOOK_TTL_S = 60  # a folder's size is looked at again after this long, as the Launch page's dataset panel


def _looked_at() -> tuple:
    """Part of ``_split_size``'s key: where datasets are, and the minute, so a folder that changes
    or a dataset that is downloaded is looked at again."""
    from contract.environment import data_dir

    return str(data_dir()), os.getcwd(), int(time.monotonic() // LOOK_TTL_S)


@functools.lru_cache(maxsize=16)
def _split_size(dataset: str, image_size: int, bands, band_scale, val_from: str, _key: tuple) -> tuple[int, int]:
    """``stored_split_size``, looked at once per dataset, size and minute: a batch search
    estimates the same config many times."""
    from trainer_backend.datasets import stored_split_size

    return stored_split_size(dataset, image_size, bands, band_scale, val_from)


def dataset_shape(config: RunConfig) -> tuple[int, int]:
    """(classes, input channels) of the config's dataset, from a look at it (nothing decoded)."""
    from trainer_backend.datasets import inspect_dataset

    info = inspect_dataset(config.dataset)
    if config.bands:
        channels = len(config.bands)
    elif info.get("default_bands"):
        channels = len(info["default_bands"])
    else:
        channels = int(info.get("bands") or 3)
    classes = int(info.get("num_classes") or 0)
    if classes < 1:
        raise EstimateError(f"dataset {config.dataset!r} has no class folders: nothing to size the model's output by")
    return classes, channels


def estimate_for_config(config: RunConfig) -> MemoryEstimate:
    """``estimate_memory`` with the dataset's classes and channels looked up."""
    num_classes, in_chans = dataset_shape(config)
    return estimate_memory(config, num_classes=num_classes, in_chans=in_chans)


def stored_estimate(config: RunConfig, num_classes: int, in_chans: int, stored: StoredData | None = None) -> dict:
    """``{"memory_estimate": ...}`` for the run's measurements, so that what it measures can be
    set against it (``stored``: what the run may keep on its GPUs, ``run_stored_data``); an
    estimate that cannot be made is stored as its reason, never failing the run."""
    try:
        return {"memory_estimate": estimate_memory(config, num_classes=num_classes, in_chans=in_chans,
                                                   stored=stored or StoredData()).to_dict()}
    except Exception as exc:  # the run trains whether or not its memory could be estimated
        return {"memory_estimate": {"error": f"{type(exc).__name__}: {exc}"[:500]}}
