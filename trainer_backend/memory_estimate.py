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
  statistics) are added here too, as the breakdown's "activations and other" holds them;
- communication buffers: DDP's gradient buckets, FSDP's gathered units, a pipeline's receive buffers.

Each strategy says how it places these (``memory_placement`` on each strategy class, see
strategies.py and pipeline.py); this module provides the counts they place.

The trace is this module's own small ``TorchDispatchMode`` rather than
``torch.distributed._tools.MemTracker``: that one attributes memory module by module and refuses a
module called twice in one step (a pipeline's microbatches), and it made the trace of resnet50 at
224 px about 4x slower on two cores (1.8 s against 0.45 s a step).

What no trace here sees: CUDA's context (not in the allocator's peak either), cuDNN workspaces
and the caching allocator's rounding and fragmentation; autocast is traced with the CPU's op list,
which casts convolutions and matrix products as CUDA's does.
"""

from __future__ import annotations

import functools
import threading
import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .config import RunConfig

MB = 2**20
PARTS = ("parameters_mb", "gradients_mb", "optimizer_mb", "activations_mb", "comm_mb")
# Bytes of each parameter's optimizer state per parameter byte (the step count comes on top).
OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "sgd": 1}
CPU_NOTE = ("On CPU the run measures parameters, gradients and optimizer state exactly; activations have no "
            "measured peak there (the CPU allocator keeps none), and each process also holds the interpreter "
            "and libraries, which no estimate counts.")


class EstimateError(ValueError):
    """A config whose memory cannot be estimated; the message names the value."""


@dataclass
class DeviceMemory:
    """What one device holds at the step's peak, in bytes."""

    label: str
    parameters: int = 0
    gradients: int = 0
    optimizer: int = 0
    activations: int = 0
    comm: int = 0

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations + self.comm

    @property
    def total_mb(self) -> float:
        return self.total / MB

    def add(self, other: DeviceMemory) -> None:
        for name in ("parameters", "gradients", "optimizer", "activations", "comm"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def to_dict(self) -> dict[str, float]:
        values = (self.parameters, self.gradients, self.optimizer, self.activations, self.comm)
        return {**{part: round(v / MB, 3) for part, v in zip(PARTS, values)}, "total_mb": round(self.total_mb, 3)}


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


# --- counting what exists on the fake devices ------------------------------------------------

class LiveBytes(TorchDispatchMode):
    """Counts the bytes of every tensor storage created while it is active, until that storage is
    freed, and the most that were alive at once (with how much of it was parameter gradients)."""

    def __init__(self, params: list[nn.Parameter], existing: list[torch.Tensor] = ()):
        super().__init__()
        self.live = self.peak = self.grads = self.grads_at_peak = 0
        # Storages made before (parameters, buffers) are not counted, views of them included.
        self._sizes: dict[int, int] = {t.untyped_storage()._cdata: 0 for t in existing}
        self._grad_keys: set[int] = set()
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in params if p.requires_grad]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                self._add(tensor.untyped_storage())
        return out

    def _add(self, storage) -> None:
        key = storage._cdata
        if key in self._sizes:
            return
        size = storage.nbytes()
        self._sizes[key] = size
        self.live += size
        weakref.finalize(storage, self._free, key)
        if self.live > self.peak:
            self.peak, self.grads_at_peak = self.live, self.grads

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)
        if key in self._grad_keys:
            self._grad_keys.discard(key)
            self.grads = sum(self._sizes.get(k, 0) for k in self._grad_keys)

    def _grad_ready(self, param: nn.Parameter) -> None:
        key = param.grad.untyped_storage()._cdata
        if key in self._sizes and key not in self._grad_keys:
            self._grad_keys.add(key)
            self.grads += self._sizes[key]

    def restart_peak(self) -> None:
        self.peak, self.grads_at_peak = self.live, self.grads

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()


@dataclass(frozen=True)
class StepTrace:
    """Bytes one training step of a module allocated beyond its parameters and buffers."""

    backward_peak: int      # most alive at once in forward and backward (gradients included)
    grads_at_peak: int      # of which parameter gradients
    forward_kept: int       # alive when forward ends: what backward needs, the output, the input
    optimizer_peak: int     # most alive in the optimizer step (its state, created then, included)
    input_bytes: int
    output_bytes: int
    optimizer_extra: int    # of which the step's own: its state and temporaries (the same at any batch)


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


# --- the fake model and its stages ----------------------------------------------------------

class FakeModel:
    """A model built under fake tensors: shapes and dtypes without memory or weights. One per
    (model, classes, channels), shared by every estimate (``fake_model``); its traces run one at
    a time (``TRACE_LOCK``), since each hooks the shared parameters."""

    def __init__(self, name: str, num_classes: int, in_chans: int):
        from torch._subclasses.fake_tensor import FakeTensorMode

        from .models import create_model

        self.name, self.num_classes, self.in_chans = name, num_classes, in_chans
        self.mode = FakeTensorMode()
        with self.mode:
            try:
                self.model = create_model(name, num_classes=num_classes, in_chans=in_chans)
            except (ValueError, LookupError):
                raise
            except Exception as exc:  # an architecture that computes values from tensors in __init__
                raise EstimateError(f"model {name!r} cannot be built without its weights to estimate "
                                    f"its memory: {type(exc).__name__}: {exc}") from None
        self.model.train()
        self._stages: dict[tuple[int, int], tuple[list[nn.Sequential], list[tuple[int, ...]]]] = {}

    def stages(self, n: int, image_size: int, strategy: str) -> tuple[list[nn.Sequential], list[tuple[int, ...]]]:
        """The stages mp and pp cut the model into (the same layers, balanced the same way), and
        each stage's input shape per image."""
        from .models import ModelError, _balanced_bounds, count_parameters, flatten_sequential

        if (n, image_size) not in self._stages:
            layers = flatten_sequential(self.model)
            if len(layers) < n:
                raise ModelError(f"model {self.name!r} has {len(layers)} layers in sequence, too few for {n} stages")
            shapes = self._shapes_in_sequence(layers, image_size)
            if shapes is None:
                raise ModelError(f"model {self.name!r} cannot be split into stages for {strategy}: "
                                 "its layers do not run in sequence")
            bounds = _balanced_bounds([count_parameters(layer) for layer in layers], n)
            self._stages[(n, image_size)] = ([nn.Sequential(*layers[start:end]) for start, end in bounds],
                                             [shapes[start] for start, _ in bounds])
        return self._stages[(n, image_size)]

    def _shapes_in_sequence(self, layers: list[nn.Module], image_size: int) -> list[tuple[int, ...]] | None:
        """Each layer's input shape per image when run one after another, if that gives the
        model's output shape (the check split_into_stages makes, by shape); else None."""
        with self.mode, torch.no_grad():
            self.model.eval()
            try:
                probe = torch.empty(2, self.in_chans, image_size, image_size)
                expected = self.model(probe)
                shapes, got = [], probe
                for layer in layers:
                    shapes.append(tuple(got.shape[1:]))
                    got = layer(got)
                return shapes if got.shape == expected.shape else None
            except Exception:
                return None
            finally:
                self.model.train()

    def trace(self, module: nn.Module, config: RunConfig, shape: tuple[int, ...], amp_dtype: torch.dtype | None, *,
              first: bool = True, last: bool = True, optimizer_extra: int | None = None) -> StepTrace:
        """One training step of ``module`` on an input of ``shape`` with the run's optimizer."""
        from .trainer import build_optimizer

        with TRACE_LOCK, self.mode:
            optimizer = build_optimizer(config, [p for p in module.parameters() if p.requires_grad])
            try:
                return trace_step(module, optimizer, shape, amp_dtype, first=first, last=last,
                                  label_smoothing=config.label_smoothing, optimizer_extra=optimizer_extra)
            except ValueError as exc:  # e.g. BatchNorm in training on one image
                raise EstimateError(f"one training step of {self.name!r} on {shape[0]} image(s) per device "
                                    f"fails: {exc}") from None


TRACE_LOCK = threading.Lock()


@functools.lru_cache(maxsize=4)
def fake_model(name: str, num_classes: int, in_chans: int) -> FakeModel:
    return FakeModel(name, num_classes, in_chans)


def trace_step(module: nn.Module, optimizer: torch.optim.Optimizer, shape: tuple[int, ...],
               amp_dtype: torch.dtype | None = None, *, first: bool = True, last: bool = True,
               label_smoothing: float = 0.0, optimizer_extra: int | None = None) -> StepTrace:
    """Count one training step of ``module`` (built under the active FakeTensorMode) on an input
    of ``shape``: as the training loop runs it, with the logits kept until the step ends. The
    first stage's input needs no gradient; a stage before the last is given its output's
    gradient as a pipeline's next stage sends it back. What the optimizer step adds does not
    depend on the batch: given as ``optimizer_extra`` (from a trace at another batch), the
    step is not run."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for group in optimizer.param_groups:
        # CUDA's default, whose temporaries are the larger (the host steps one tensor at a time),
        # and a tenth of the dispatches to trace.
        group["foreach"] = True
    tracker = LiveBytes(params, [*module.parameters(), *module.buffers()])
    try:
        with tracker:
            images = torch.empty(shape, requires_grad=not first)
            input_bytes = tracker.live
            context = (torch.autocast("cpu", dtype=amp_dtype) if amp_dtype is not None
                       else torch.autocast("cpu", enabled=False))
            with context:
                out = module(images)
                if last:
                    labels = torch.zeros(shape[0], dtype=torch.long)
                    loss = F.cross_entropy(out, labels, label_smoothing=label_smoothing)
            forward_kept, output_bytes = tracker.live, out.numel() * out.element_size()
            if last:
                loss.backward()
                del loss, labels
            else:
                out.backward(torch.ones_like(out))
            del out, images
            backward_peak, grads_at_peak = tracker.peak, tracker.grads_at_peak
            after_backward = tracker.live
            if optimizer_extra is None:
                tracker.restart_peak()
                optimizer.step()
                optimizer_extra = tracker.peak - after_backward
            optimizer.zero_grad()
    finally:
        tracker.close()
    return StepTrace(backward_peak, grads_at_peak, forward_kept, after_backward + optimizer_extra, input_bytes,
                     output_bytes, optimizer_extra)


# --- what a strategy places ------------------------------------------------------------------

class MemoryPlan:
    """The counts a strategy's ``memory_placement`` places on its devices: the model's parts and
    traces of its steps, each traced once per batch (traces are cached across plans)."""

    def __init__(self, config: RunConfig, num_classes: int, in_chans: int, amp_dtype: torch.dtype | None):
        self.config, self.amp_dtype = config, amp_dtype
        self.num_classes, self.in_chans = num_classes, in_chans
        self.device_type = "cuda" if config.uses_cuda else "cpu"
        self.notes: list[str] = []

    @functools.cached_property
    def fake(self) -> FakeModel:
        return fake_model(self.config.model, self.num_classes, self.in_chans)

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

    def whole(self, label: str, batch: int) -> DeviceMemory:
        """The model whole on one device, training on ``batch`` images: single's placement."""
        held = self.held(label, self.model)
        held.activations += self.step_activations(self.trace(batch), held)
        return held

    def stages(self) -> tuple[list[nn.Sequential], list[tuple[int, ...]]]:
        return self.fake.stages(len(self.config.devices), self.config.image_size, self.config.strategy)

    def stage(self, index: int) -> nn.Module:
        return self.stages()[0][index]

    def input_bytes_per_image(self) -> int:
        return self.in_chans * self.config.image_size ** 2 * 4

    def stage_memory(self, label: str, index: int, batch: int) -> tuple[DeviceMemory, StepTrace]:
        """Stage ``index`` on one device training on ``batch`` images (a whole batch or a microbatch)."""
        held = self.held(label, self.stage(index))
        trace = self.trace(batch, index)
        held.activations += self.step_activations(trace, held)
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
        (strategies._blocks), and of the root's own parameters, which stay gathered."""
        from .strategies import _blocks

        blocks = _blocks(self.model)
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
    from .loop import resolve_amp

    if not config.uses_cuda or config.amp == "off":
        return None, None
    dtype, note = None, None
    if config.amp == "auto" and not torch.cuda.is_available():
        dtype, note = torch.bfloat16, ("AMP auto is estimated as bf16: this process cannot ask the GPU whether it "
                                       "has bf16 (before Ampere it trains in fp16, the same size).")
    else:
        dtype = resolve_amp(config.amp, torch.device(config.devices[0]))
    if config.strategy == "pp" and dtype == torch.float16:
        return None, None  # as the trainer: pipelines cannot scale fp16 gradients, so train in fp32
    return dtype, note


def estimate_memory(config: RunConfig, *, num_classes: int, in_chans: int) -> MemoryEstimate:
    """Peak memory per device of ``config``'s training step, without a GPU and without weights."""
    from .strategies import strategy_class

    amp_dtype, note = estimate_amp_dtype(config)
    plan = MemoryPlan(config, num_classes, in_chans, amp_dtype)
    devices = strategy_class(config.strategy).memory_placement(plan)
    merged: dict[str, DeviceMemory] = {}
    for device in devices:  # CPU "devices" of one process are one memory
        if device.label in merged:
            merged[device.label].add(device)
        else:
            merged[device.label] = device
    notes = ([note] if note else []) + plan.notes + ([] if config.uses_cuda else [CPU_NOTE])
    return MemoryEstimate(config.strategy, list(merged.values()),
                          None if amp_dtype is None else str(amp_dtype).removeprefix("torch."), notes)


def dataset_shape(config: RunConfig) -> tuple[int, int]:
    """(classes, input channels) of the config's dataset, from a look at it (nothing decoded)."""
    from .datasets import inspect_dataset

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


def stored_estimate(config: RunConfig, num_classes: int, in_chans: int) -> dict:
    """``{"memory_estimate": ...}`` for the run's measurements, so that what it measures can be
    set against it; an estimate that cannot be made is stored as its reason, never failing the run."""
    try:
        return {"memory_estimate": estimate_memory(config, num_classes=num_classes, in_chans=in_chans).to_dict()}
    except Exception as exc:  # the run trains whether or not its memory could be estimated
        return {"memory_estimate": {"error": f"{type(exc).__name__}: {exc}"[:500]}}


# --- does it fit ----------------------------------------------------------------------------

def available_memory_mb(config: RunConfig) -> dict[str, float]:
    """Free memory where the run would train: every GPU's (NVML: total less used; the others too,
    for the changes ``suggestions`` tries), or for CPU runs the machine's available memory under
    the one label "cpu" (all processes share it)."""
    if not config.uses_cuda:
        available = host_available_mb()
        return {} if available is None else {"cpu": available}
    from .devices import gpu_statuses

    return {f"cuda:{g.index}": g.memory_total_mb - g.memory_used_mb for g in gpu_statuses()}


def host_available_mb() -> float | None:
    """MemAvailable from /proc/meminfo: what new processes can take without swapping."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def gb(mb: float, digits: int | None = None) -> str:
    value = mb / 1024
    if digits is None:
        digits = 0 if value >= 10 else 1
    return f"{value:.{digits}f} GB"


def verdict(needed_mb: float, free_mb: float) -> str:
    """'fits, 31 GB to spare' / 'needs about 52 GB, 39 GB free'."""
    if needed_mb <= free_mb:
        return f"fits, {gb(free_mb - needed_mb)} to spare"
    digits = None if gb(needed_mb) != gb(free_mb) else 1  # "needs about 21 GB, 21 GB free" would say nothing
    return f"needs about {gb(needed_mb, digits)}, {gb(free_mb, digits)} free"


@dataclass(frozen=True)
class Fit:
    device: str
    needed_mb: float
    free_mb: float

    @property
    def fits(self) -> bool:
        return self.needed_mb <= self.free_mb

    @property
    def verdict(self) -> str:
        return verdict(self.needed_mb, self.free_mb)


def fits(estimate: MemoryEstimate | dict[str, float], free_mb: dict[str, float]) -> list[Fit]:
    """Each device's estimate (or {device: total MB}) against its free memory; CPU processes
    share the host's memory, so a CPU run's devices are summed against it."""
    totals = estimate if isinstance(estimate, dict) else {d.label: d.total_mb for d in estimate.devices}
    if "cpu" in free_mb and all(label.endswith("cpu") for label in totals):
        return [Fit("cpu", sum(totals.values()), free_mb["cpu"])]
    return [Fit(label, total, free_mb[label]) for label, total in totals.items() if label in free_mb]


def all_fit(config: RunConfig, num_classes: int, in_chans: int, free_mb: dict[str, float]) -> bool:
    estimate = estimate_memory(config, num_classes=num_classes, in_chans=in_chans)
    found = fits(estimate, free_mb)
    return bool(found) and all(f.fits for f in found)


def suggestions(config: RunConfig, num_classes: int, in_chans: int, free_mb: dict[str, float],
                gpus: list[str] | None = None) -> list[str]:
    """Changes that would fit, each checked by estimating it: a smaller batch (the largest that
    fits, of the ones the strategy allows), bf16, fsdp on the same devices, more devices."""
    from .config import ConfigError

    found: list[str] = []

    def check(label: str, **changes) -> bool:
        try:
            changed = config.replace(**changes)
        except ConfigError:
            return False
        wanted = available_for(changed)
        if wanted is None or not all_fit(changed, num_classes, in_chans, wanted):
            return False
        found.append(label)
        return True

    def available_for(changed: RunConfig) -> dict[str, float] | None:
        if not changed.uses_cuda:
            return free_mb
        return free_mb if all(d in free_mb for d in changed.devices) else None

    step = len(config.devices) if config.strategy in ("ddp", "fsdp") else (
        config.microbatches if config.strategy == "pp" else 1)
    if (batch := largest_batch(config, num_classes, in_chans, free_mb, step)) is not None:
        found.append(f"a global batch of {batch}")
    if config.uses_cuda and config.amp in ("off",):
        check("mixed precision bf16 (--amp bf16)", amp="bf16")
    if config.strategy in ("single", "dp", "ddp") and len(config.devices) > 1:
        check("fsdp on the same devices", strategy="fsdp")
    more = [g for g in (gpus or []) if g not in config.devices]
    if more and config.strategy != "single":
        devices = (*config.devices, *more)
        check(f"{config.strategy} on {len(devices)} GPUs ({','.join(devices)})", devices=devices)
    elif more and config.strategy == "single":
        devices = (*config.devices, *more)
        check(f"fsdp on {len(devices)} GPUs ({','.join(devices)})", strategy="fsdp", devices=devices)
    return found


def largest_batch(config: RunConfig, num_classes: int, in_chans: int, free_mb: dict[str, float],
                  step: int) -> int | None:
    """The largest global batch below ``config``'s that fits (a multiple of ``step``): halved
    until one fits, then the step between that and the last that did not filled in from the
    activations' growth per image (nearly linear), each candidate checked by an estimate."""
    def needed(batch: int) -> float | None:
        try:
            estimate = estimate_memory(config.replace(batch_size=batch), num_classes=num_classes, in_chans=in_chans)
        except ValueError:
            return None
        found = fits(estimate, free_mb)
        return None if not found else max(f.needed_mb - f.free_mb for f in found)

    high, over_high = config.batch_size, needed(config.batch_size)
    low = (high // 2) // step * step
    while low >= step:
        over = needed(low)
        if over is not None and over <= 0:
            break
        high, over_high, low = low, over, (low // 2) // step * step
    else:
        return None
    if over_high is None or high - low <= step:
        return low
    per_image = (over_high - over) / (high - low)
    guess = min(high - step, low + int(-over / per_image) // step * step) if per_image > 0 else low
    while guess > low:  # activations grow a little faster than linearly at times: step back until it fits
        margin = needed(guess)
        if margin is not None and margin <= 0:
            return guess
        guess = max(low, guess - max(step, (guess - low) // 4 // step * step))
    return low


# --- the table ------------------------------------------------------------------------------

def table_rows(estimate: MemoryEstimate, free_mb: dict[str, float] | None = None) -> list[dict]:
    """One row per device: the parts in MB, the total, and with free memory the verdict."""
    free_mb = free_mb or {}
    rows = []
    for device in estimate.devices:
        row = {"device": device.label, **device.to_dict()}
        if device.label in free_mb:
            row["free_mb"] = round(free_mb[device.label], 1)
            row["verdict"] = verdict(device.total_mb, free_mb[device.label])
        rows.append(row)
    return rows


def format_table(estimate: MemoryEstimate, free_mb: dict[str, float] | None = None, *, notes: bool = True) -> str:
    """The estimate as a text table (the CLI's output)."""
    headers = ("device", "parameters", "gradients", "optimizer", "activations", "comm", "total")
    lines = [f"{headers[0]:<14}" + "".join(f"{h:>13}" for h in headers[1:])]
    for device in estimate.devices:
        values = (device.parameters, device.gradients, device.optimizer, device.activations, device.comm, device.total)
        lines.append(f"{device.label:<14}" + "".join(f"{v / MB:>10.1f} MB" for v in values))
    for fit in fits(estimate, free_mb or {}):
        lines.append(f"{fit.device}: {fit.verdict}")
    precision = estimate.amp_dtype or "float32"
    lines.append(f"strategy {estimate.strategy}, activations in {precision}")
    if notes:
        lines.extend(estimate.notes)
    return "\n".join(lines)

