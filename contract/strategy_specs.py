"""Every strategy Parallax trains with, by name, as the dashboard, the CLI, the supervisor and each rank
must know it: one frozen spec each, the only place that says what a strategy name means.

    s = spec(config.strategy)               # ValueError naming the allowed names for any other
    find(values.get("strategy"))            # None for a value not validated yet
    s.distributed, s.splits_batch, s.staged # what it does with processes, batches and the model
    s.problem(config)                       # (field, message) of its first rule broken, or None
    s.notes(config)                         # what a user should know about how it runs here
    s.implementation                        # "module:Class", imported by rank.strategies.registry

Torch-free, and beneath the config module (which imports it): the checks and notes read a RunConfig
and return what they found; the config raises the problems as ConfigErrors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

RunConfig = Any  # a contract.config.RunConfig; that module imports this one, so this one names it only

Problem = tuple[str, str]  # (config field, message naming the value and the fix): config raises it as a ConfigError
Check = Callable[[RunConfig], "Problem | None"]
Notes = Callable[[RunConfig], list[str]]


@dataclass(frozen=True)
class StrategySpec:
    name: str
    description: str  # one line for the Launch form and --help
    implementation: str  # "module:Class" of the class that runs it, imported when a rank needs it
    distributed: bool = False  # one process per device (a process group; torchrun can start it)
    spans_devices: bool = False  # one process computes on several devices (dp's GPUs, mp's stages)
    splits_batch: bool = False  # the global batch is split over the processes, each training on its share
    scatters_batch: bool = False  # one process scatters each batch over its GPUs (a pass-through on CPU)
    staged: bool = False  # the model is cut into one stage per device, so it needs at least 2
    microbatched: bool = False  # each batch is cut into microbatches streamed through the stages
    shards_state: bool = False  # parameters, gradients and optimizer state are split over the devices
    one_device: bool = False  # runs on exactly one device
    baseline: bool = False  # the one-device run every other strategy is measured against
    # A sweep's shared fields are checked under it where the sweep spans several devices: it adds no batch or
    # speed-switch rule of its own, so what fails there fails for every strategy (their own rules follow one by one).
    sweep_base: bool = False
    # Offered in a new sweep where the devices allow it; the others are picked by hand (DataParallel on CPU is
    # single again, FSDP is DDP's memory trade).
    in_first_sweep: bool = False
    grad_sync_passes: float = 0.0  # gradient passes each device sends per step, times (n-1)/n (ring)
    records_on_last_rank: bool = False  # the last rank (the one computing the loss) writes the step points
    compile_refusal: str = ""  # why torch.compile cannot run it; empty where it can
    channels_last_refusal: str = ""  # why channels_last cannot run it; empty where it can
    checks: tuple[Check, ...] = ()  # its rules for devices and batch, in the order they are checked
    own_notes: Notes | None = None

    def problem(self, config: RunConfig) -> Problem | None:
        """The first of this strategy's rules the config breaks, or None where it can run."""
        return next((found for check in self.checks if (found := check(config)) is not None), None)

    def notes(self, config: RunConfig) -> list[str]:
        """What a user should know about how this strategy really runs on the config's devices."""
        return self.own_notes(config) if self.own_notes is not None else []

    def recording_rank(self, world_size: int) -> int:
        """The rank that writes the step points to the database."""
        return world_size - 1 if self.records_on_last_rank else 0


def chunk_sizes(images: int, parts: int) -> list[int]:
    """How ``Tensor.chunk`` splits ``images`` into at most ``parts`` pieces, as DataParallel scatters a batch:
    pieces of ceil(images / parts), the last one smaller (3 over 2: 2 and 1; 9 over 8: 2, 2, 2, 2, 1)."""
    size = -(-images // parts)
    return [size] * (images // size) + ([images % size] if images % size else [])


def _one_device(cfg: RunConfig) -> Problem | None:
    if len(cfg.devices) != 1:
        return ("devices", f"strategy single runs on one device, got {len(cfg.devices)} ({','.join(cfg.devices)}): "
                "list one, or pick dp, ddp or mp for several")


def _stage_per_device(cfg: RunConfig) -> Problem | None:
    if len(cfg.devices) < 2:
        return ("devices", f"strategy {cfg.strategy} cuts the model into one stage per device and needs at "
                f"least 2 devices, got {','.join(cfg.devices)} (on CPU: --devices cpu,cpu)")


def _batch_divides_over_processes(cfg: RunConfig) -> Problem | None:
    n = len(cfg.devices)
    if cfg.batch_size % n:
        return ("batch_size", f"batch_size {cfg.batch_size} is the global batch and must divide evenly "
                f"over {n} {cfg.strategy.upper()} processes: use a multiple of {n}")


def _microbatches_fit(cfg: RunConfig) -> Problem | None:
    n = len(cfg.devices)
    if cfg.batch_size % cfg.microbatches:
        return ("batch_size", f"batch_size {cfg.batch_size} must divide evenly into {cfg.microbatches} "
                f"microbatches: use a multiple of {cfg.microbatches}, or change the number of microbatches")
    if n > cfg.microbatches:
        return ("microbatches", f"strategy pp with {n} stages needs at least {n} microbatches, got "
                f"{cfg.microbatches}: every stage must have a microbatch to work on (use --microbatches {n} or more)")
    if cfg.amp == "fp16":
        return ("amp", "amp 'fp16' needs a gradient scaler, which pipeline schedules do not apply: use bf16, auto "
                "or off")


def _scatter_leaves_two_per_gpu(cfg: RunConfig) -> Problem | None:
    n = len(cfg.devices)
    if not any(d.startswith("cuda") for d in cfg.devices):
        return  # a pass-through on CPU: nothing is scattered
    if cfg.batch_size < n:
        return ("batch_size", f"batch_size {cfg.batch_size} is smaller than the {n} GPUs DataParallel "
                "splits it over: use at least one image per GPU")
    if 1 in (shares := chunk_sizes(cfg.batch_size, n)):
        fits = next(b for b in range(cfg.batch_size + 1, cfg.batch_size + 2 * n + 2) if 1 not in chunk_sizes(b, n))
        return ("batch_size", f"batch_size {cfg.batch_size} over {n} GPUs gives DataParallel's replicas "
                f"{', '.join(map(str, shares))} images (it splits as Tensor.chunk does), and BatchNorm cannot train "
                f"on one image: use a batch that leaves every replica two or more, e.g. {fits}")


def _data_parallel_notes(cfg: RunConfig) -> list[str]:
    if cfg.world_size != 1:
        return []
    return [f"{cfg.strategy.upper()} on one device: a world of one process (its own process group), "
            "so the run does single's work plus the wrapper's overhead. List more devices to spread it."]


def _data_parallel_on_cpu_notes(cfg: RunConfig) -> list[str]:
    if cfg.uses_cuda:
        return []
    return ["DataParallel on CPU is a pass-through: one process trains on the CPU with all its "
            "threads, exactly like single. Pick GPUs to see DataParallel split the batch."]


def _model_parallel_notes(cfg: RunConfig) -> list[str]:
    if cfg.uses_cuda:
        return []
    return ["Model parallel on CPU: the stages share the same CPU, so this shows the mechanics "
            "(activations handed from stage to stage), not a speed-up."]


def _pipeline_notes(cfg: RunConfig) -> list[str]:
    return [
        f"Pipeline parallel ({cfg.pipeline_schedule}): each epoch records every stage's busy "
        "fraction; the rest is the pipeline bubble. Forward and backward interleave inside the "
        "schedule, so the profiler's step breakdown shows them as 'other'."
    ]


_STRATEGIES = "trainer_backend.rank.strategies"
SPECS: tuple[StrategySpec, ...] = (
    StrategySpec(
        "single", "One device, one process: the baseline every other strategy is measured against.",
        f"{_STRATEGIES}.base:Strategy", one_device=True, baseline=True, in_first_sweep=True, checks=(_one_device,)),
    StrategySpec(
        "dp", "torch.nn.DataParallel: one process scatters each batch over the listed GPUs "
        "(a pass-through on CPU). Simple, but GPU 0 gathers everything; DDP is usually faster.",
        f"{_STRATEGIES}.dp:DataParallelStrategy", spans_devices=True, scatters_batch=True,
        compile_refusal="DataParallel copies the module into threads every step, which a compiled module does not "
        "survive",
        checks=(_scatter_leaves_two_per_gpu,), own_notes=_data_parallel_on_cpu_notes),
    StrategySpec(
        "ddp", "DistributedDataParallel: one process per device, gradients all-reduced. "
        "The default choice when the model fits on one device.",
        f"{_STRATEGIES}.ddp:DistributedStrategy", distributed=True, splits_batch=True, grad_sync_passes=2.0,
        in_first_sweep=True, checks=(_batch_divides_over_processes,), own_notes=_data_parallel_notes),
    StrategySpec(
        "mp", "Model parallel: the model cut into stages on different devices, one stage busy at a "
        "time. Pays off only when the model does not fit on one device.",
        f"{_STRATEGIES}.mp:ModelParallelStrategy", spans_devices=True, staged=True, shards_state=True,
        sweep_base=True, in_first_sweep=True, checks=(_stage_per_device,), own_notes=_model_parallel_notes),
    StrategySpec(
        "pp", "Pipeline parallel: stages as in mp, one process each, with the batch cut into "
        "microbatches so stages work at once. Pays off for models too big for one device.",
        f"{_STRATEGIES}.pp:PipelineStrategy", distributed=True, staged=True, microbatched=True, shards_state=True,
        records_on_last_rank=True, in_first_sweep=True,
        compile_refusal="pipeline stages run inside torch.distributed.pipelining's schedule, which torch.compile "
        "does not trace",
        channels_last_refusal="pipeline stages send their activations to the next process as contiguous (NCHW) "
        "tensors",
        checks=(_stage_per_device, _microbatches_fit), own_notes=_pipeline_notes),
    StrategySpec(
        "fsdp", "Fully sharded data parallel (FSDP2): like DDP, but parameters, gradients and optimizer "
        "state are sharded over the devices. Pays off when the model does not fit with DDP.",
        f"{_STRATEGIES}.fsdp:FullyShardedStrategy", distributed=True, splits_batch=True, shards_state=True,
        grad_sync_passes=3.0,
        compile_refusal="TorchInductor fails to compile the fully sharded (FSDP2) model with this PyTorch",
        channels_last_refusal="FSDP2 shards only contiguous parameters, and channels_last convolution weights are not",
        checks=(_batch_divides_over_processes,), own_notes=_data_parallel_notes),
)
STRATEGY_SPECS: dict[str, StrategySpec] = {s.name: s for s in SPECS}


def find(name: object) -> StrategySpec | None:
    """The spec of strategy ``name``, or None for any other value (one not validated yet)."""
    return STRATEGY_SPECS.get(name) if isinstance(name, str) else None


def spec(name: str) -> StrategySpec:
    """The spec of strategy ``name``; ValueError naming the value and the allowed names for any other."""
    found = find(name)
    if found is None:
        shown = repr(name[:40] if isinstance(name, str) else name)[:60]
        raise ValueError(f"Unknown strategy ({shown}); allowed: {', '.join(STRATEGY_SPECS)}")
    return found


def baseline() -> StrategySpec:
    """The one-device strategy every other is measured against."""
    return next(s for s in SPECS if s.baseline)


def sweep_base_for(device_count: int) -> StrategySpec:
    """The strategy a sweep's shared fields are checked under on ``device_count`` devices: the baseline on one,
    else the one that adds no rule of its own."""
    return baseline() if device_count <= 1 else next(s for s in SPECS if s.sweep_base)


def distributed_base() -> StrategySpec:
    """The strategy a sweep's shared fields are checked under where every run is started by torchrun (a
    scheduler's job): data parallel, one process per device, nothing sharded."""
    return next(s for s in SPECS if s.distributed and s.splits_batch and not s.shards_state)


def memory_saver() -> StrategySpec:
    """The strategy to suggest where a model does not fit: data parallel with its state sharded over the devices."""
    return next(s for s in SPECS if s.splits_batch and s.shards_state)


def names_where(flag: Callable[[StrategySpec], bool]) -> list[str]:
    """The strategies, in their order, for which ``flag(spec)`` holds: for messages naming them."""
    return [s.name for s in SPECS if flag(s)]


def spoken(names: list[str]) -> str:
    """['single', 'ddp', 'mp'] -> 'single, ddp or mp'."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
