"""RunConfig: the one contract between the dashboard, the CLI and the trainer.

A RunConfig is frozen and validated on construction, so any RunConfig that exists is one the
trainer can start. It is stored as JSON on the run row (``to_dict``/``from_dict``). Validation
here is pure and fast (no dataset reads, no model builds): it is what the Launch form calls on
every field. The checks that need the data or the model run in ``preflight`` before launch.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass, fields
from typing import Any

# The lists and limits the field catalogue describes live beside it; imported here, where they are enforced.
from contract.fields import (AMP_MODES, AUGMENTATIONS, DECODE_MODES, FIELDS, LR_SCHEDULES,  # noqa: F401
                                             DATA_ON_DEVICE_MODES,
                                             MAX_ACCUMULATE_STEPS, MAX_BATCH_SIZE, MAX_CHOICE_LENGTH, MAX_EPOCHS,
                                             MAX_GRAD_CLIP, MAX_IMAGE_SIZE, MAX_TAG_LENGTH, MAX_TAGS, MIN_IMAGE_SIZE,
                                             OPTIMIZERS, PIPELINE_SCHEDULES, SCALE_LR_REFERENCE_BATCH, VAL_SOURCES,
                                             Field)
from contract.devices import cpu_cores
from contract.printable import is_utf8, shown_name
from contract.strategy_specs import STRATEGY_SPECS, names_where, spoken
from contract.strategy_specs import spec as strategy_spec

# The names and descriptions the dashboard and the CLI offer, from the strategies' specs.
STRATEGIES: dict[str, str] = {name: s.description for name, s in STRATEGY_SPECS.items()}
MAX_NODES = 4096
# Learning rates above this are allowed and warned of: past it, training usually diverges.
LR_WARN_ABOVE = 10.0
MAX_DEVICES = 4096  # entries in a device list, over every machine of a torchrun job
MAX_BAND_INDEX = 4095
# Text fields are bounded before anything reads them: a 50-million-character model name must not
# reach the closest-name search, nor a path longer than the OS allows reach the file system.
MAX_MODEL_NAME_LENGTH = 128  # timm's longest name with its pretrained tag is under 60
MAX_PATH_LENGTH = 4096  # Linux's PATH_MAX; the folder must also exist, which the OS checks past this
MAX_PATH_PART_LENGTH = 255  # NAME_MAX: one folder or file name
MAX_MODEL_ARGS_LENGTH = 100_000  # a JSON object of keyword arguments, not a data file
# CPU processes (or model stages) on one machine, per core: a few more processes than cores still
# runs (slowly, each with one thread); thousands start until the machine stops answering.
CPU_PROCESSES_PER_CORE = 4
MAX_CPU_PROCESSES_ENV = "PARALLAX_MAX_CPU_PROCESSES"


class ConfigError(ValueError):
    """A value a user gave that Parallax cannot run with. ``field`` names the config field."""

    def __init__(self, field_name: str, message: str):
        super().__init__(message)
        self.field = field_name


def parse_devices(devices: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """'cpu,cpu' -> ('cpu', 'cpu'); '0,1' -> ('cuda:0', 'cuda:1'); 'cuda' -> ('cuda:0',)."""
    if isinstance(devices, str):
        items = devices.split(",")
    elif isinstance(devices, (list, tuple)) and all(_is_device_item(d) for d in devices):
        items = list(devices)
    else:
        raise ConfigError(
            "devices", f"devices {_shown(devices)} is not allowed: give a comma-separated text or a list of device "
            'names, e.g. "cpu,cpu" or ["cuda:0", "cuda:1"]'
        )
    if len(items) > MAX_DEVICES:
        raise ConfigError("devices", f"devices lists {len(items)} entries, more than the {MAX_DEVICES} allowed")
    parsed = []
    for raw in items:
        item = str(raw).strip().lower()
        if item.isdigit():
            item = f"cuda:{int(item)}"
        elif item == "cuda":
            item = "cuda:0"
        if item != "cpu" and not (item.startswith("cuda:") and item[5:].isdigit() and len(item) <= 12):
            raise ConfigError(
                "devices",
                f"device {_shown(raw)} is not allowed: use 'cpu', 'cuda:N' or a bare GPU index N "
                "(e.g. --devices cpu,cpu or --devices 0,1)",
            )
        parsed.append(item)
    if not parsed:
        raise ConfigError("devices", "no devices given: list at least one, e.g. --devices cpu")
    return tuple(parsed)


def _is_device_item(item: Any) -> bool:
    return isinstance(item, str) or (isinstance(item, int) and not isinstance(item, bool))


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, so a message stays one readable line; a long
    text or list is cut before ``repr`` sees it, so a huge value costs nothing to show."""
    if isinstance(value, str) and len(value) > limit:
        value = value[:limit]
    elif isinstance(value, (list, tuple)) and len(value) > limit:
        value = value[:limit]
    elif isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * limit:
        return f"(a whole number of about {int(value.bit_length() * 0.30103)} digits)"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


_shown = shown


def shown_length(text: str) -> str:
    """How long ``text`` is and how it starts, for a message about a text that is too long."""
    return f"{shown(text, 40)} ({len(text):,} characters)"


def parse_tags(tags: Any) -> tuple[str, ...]:
    """A list of strings, stripped, empty ones dropped. A bare string is refused rather than read as
    a sequence of one-letter tags."""
    if not isinstance(tags, (list, tuple)) or not all(isinstance(t, str) for t in tags):
        raise ConfigError(
            "tags", f'tags {_shown(tags)} is not allowed: give a list of strings, e.g. ["baseline", "fp32"] '
            "(on the command line: --tags baseline,fp32)"
        )
    cleaned = tuple(t.strip() for t in tags if t.strip())
    if len(cleaned) > MAX_TAGS or any(len(t) > MAX_TAG_LENGTH for t in cleaned):
        raise ConfigError(
            "tags", f"tags {_shown(cleaned)} are not allowed: at most {MAX_TAGS} tags of at most "
            f"{MAX_TAG_LENGTH} characters each"
        )
    return cleaned


def _default(name: str) -> Any:
    """A RunConfig field's default: the catalogue's, so that the two cannot disagree."""
    return FIELDS[name].default


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs. ``batch_size`` is the global batch: DDP gives each of N ranks batch/N."""

    dataset: str = _default("dataset")
    image_size: int = _default("image_size")
    # The size the dataset cache stores images at; 0 stores them at image_size. Larger, training
    # batches take random-resized crops of it to image_size on the device (timm's defaults) and
    # validation a centre crop, as ImageNet recipes do (trainer_backend/rank/inputs.py).
    stored_size: int = _default("stored_size")
    bands: tuple[int, ...] | None = _default("bands")
    band_scale: float | None = _default("band_scale")
    model: str = _default("model")
    # The model's keyword arguments, a JSON object kept as canonical JSON text (sorted keys) so that
    # the frozen config stays hashable and two spellings of the same arguments compare equal.
    model_args: str = _default("model_args")
    # A custom model's source file and its SHA-256 when the run was launched ('<path> sha256=<hex>';
    # '' for a timm model): the code a past run trained (contract/model_source.py).
    model_source: str = ""
    pretrained: bool = _default("pretrained")
    strategy: str = _default("strategy")
    devices: tuple[str, ...] = _default("devices")
    batch_size: int = _default("batch_size")
    # The first run a newcomer makes: resnet18 on digits ends above 90 % validation accuracy in
    # under a minute on two CPU cores (docs/BENCHMARKS.md).
    epochs: int = _default("epochs")
    lr: float = _default("lr")
    optimizer: str = _default("optimizer")
    weight_decay: float = _default("weight_decay")
    amp: str = _default("amp")
    num_workers: int = _default("num_workers")
    seed: int = _default("seed")
    val_fraction: float = _default("val_fraction")
    # "test" validates on the dataset's official test split (mnist, fashion_mnist, cifar10; a folder's
    # val/ tree, a train.csv's val.csv), and
    # datasets without one on val_fraction of the training images; "train" always the latter.
    val_from: str = _default("val_from")
    # "cache" decodes a dataset once into a file every process maps; "workers" decodes an image
    # folder's files in the DataLoader workers every epoch, caching nothing (datasets/streaming.py).
    decode: str = _default("decode")
    # Whether a CUDA run keeps the cached dataset on each process's GPU ("auto": where its stored
    # pixels take at most a tenth of the free memory; "on": wherever they fit; "off": never).
    data_on_device: str = _default("data_on_device")
    # Before each validation, BatchNorm statistics are re-estimated from this many training
    # images with the current weights (trainer_backend/rank/batchnorm.py); 0 validates on the running
    # averages, which trail fast-changing weights in short runs.
    bn_stats_images: int = _default("bn_stats_images")
    # The profiler records a window of the first epoch: skip `wait` steps, record and discard
    # `warmup`, keep `active`.
    profile: bool = _default("profile")
    profile_wait: int = _default("profile_wait")
    profile_warmup: int = _default("profile_warmup")
    profile_active: int = _default("profile_active")
    profile_stack: bool = _default("profile_stack")
    microbatches: int = _default("microbatches")
    pipeline_schedule: str = _default("pipeline_schedule")
    # The training recipe (trainer_backend/rank/schedule.py): the learning rate follows `lr_schedule`
    # per optimizer step after a linear warmup of `warmup_epochs` (fractional allowed); with
    # `scale_lr` the lr given is for a global batch of 256, scaled by effective_batch / 256.
    lr_schedule: str = _default("lr_schedule")
    warmup_epochs: float = _default("warmup_epochs")
    scale_lr: bool = _default("scale_lr")
    # Training loss only; validation reports the plain cross-entropy.
    label_smoothing: float = _default("label_smoothing")
    grad_clip: float = _default("grad_clip")  # max gradient norm; 0 = no clipping
    # What a NaN or infinite training loss does: stop the run, skip the step's update, or warn
    # (trainer_backend/rank/divergence.py).
    on_nonfinite: str = _default("on_nonfinite")
    # What a run whose steps stop moving does once its stacks are logged: wait or cancel (supervisor/stall.py).
    on_stall: str = _default("on_stall")
    # Resume points kept on disk, the newest first (rank/resume.py); the best epoch's weights are kept apart.
    keep_checkpoints: int = _default("keep_checkpoints")
    accumulate_steps: int = _default("accumulate_steps")  # batches whose gradients add up to one optimizer step
    # "none", or a comma list of AUGMENTATIONS, kept in that order (training batches only).
    augment: str = _default("augment")
    channels_last: bool = _default("channels_last")
    # torch.compile the model; the compile warm-up is timed apart from the epochs (speed.py).
    compile: bool = _default("compile")
    tags: tuple[str, ...] = _default("tags")
    # Where the run trains (this machine, or a Slurm cluster) and what its Slurm job asks for (slurm_options.py).
    where: str = _default("where")
    slurm_partition: str | None = _default("slurm_partition")
    slurm_nodes: int = _default("slurm_nodes")
    slurm_gpus_per_node: int = _default("slurm_gpus_per_node")
    slurm_cpus_per_task: int = _default("slurm_cpus_per_task")
    slurm_mem: str | None = _default("slurm_mem")
    slurm_time: str | None = _default("slurm_time")
    slurm_account: str | None = _default("slurm_account")
    slurm_qos: str | None = _default("slurm_qos")
    slurm_extra: tuple[str, ...] = _default("slurm_extra")
    max_requeues: int = _default("max_requeues")
    slurm_array_limit: int = _default("slurm_array_limit")
    # Machines the run spans; set by torchrun (then ``devices`` lists every process's device, in
    # rank order, each machine's own GPUs, so a GPU index may repeat), never by hand.
    nodes: int = 1

    def __post_init__(self) -> None:
        # Normalise containers first so that the frozen instance is hashable and JSON-stable.
        object.__setattr__(self, "devices", parse_devices(self.devices))
        object.__setattr__(self, "tags", parse_tags(self.tags))
        if self.bands is not None:
            object.__setattr__(self, "bands", _parse_bands(self.bands))
        object.__setattr__(self, "augment", parse_augment(self.augment))
        object.__setattr__(self, "model_args", parse_model_args(self.model_args))
        from contract.slurm_options import parse_extra

        object.__setattr__(self, "slurm_extra", parse_extra(self.slurm_extra))
        _validate(self)

    @property
    def world_size(self) -> int:
        """Processes the run starts: one per device for ddp, fsdp and pp, one otherwise."""
        return len(self.devices) if strategy_spec(self.strategy).distributed else 1

    @property
    def processes_per_node(self) -> int:
        """Processes sharing one machine's cores (all of them, unless torchrun spread the run)."""
        return max(1, self.world_size // self.nodes)

    @property
    def per_device_batch(self) -> int:
        """The batch each DDP/FSDP rank (or DataParallel GPU replica, rounded down) sees. Pipeline
        stages all see the whole batch, cut into microbatches."""
        strategy = strategy_spec(self.strategy)
        if strategy.splits_batch or (strategy.scatters_batch and self.uses_cuda):
            return self.batch_size // len(self.devices)
        return self.batch_size

    @property
    def process_batch(self) -> int:
        """The batch each process's data loader yields: the global batch split over DDP/FSDP ranks,
        whole otherwise. DataParallel is given the whole batch because it splits it over its GPUs itself."""
        return self.batch_size // self.world_size if strategy_spec(self.strategy).splits_batch else self.batch_size

    @property
    def effective_batch(self) -> int:
        """Images behind one optimizer step: the global batch times the accumulation steps."""
        return self.batch_size * self.accumulate_steps

    @property
    def base_lr(self) -> float:
        """The peak learning rate the schedule uses: ``lr``, or with ``scale_lr`` the linear scaling rule."""
        return self.lr * self.effective_batch / SCALE_LR_REFERENCE_BATCH if self.scale_lr else self.lr

    @property
    def model_kwargs(self) -> dict[str, Any]:
        """``model_args`` as the keyword arguments it holds."""
        return json.loads(self.model_args)

    @property
    def uses_cuda(self) -> bool:
        return self.devices[0].startswith("cuda")

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for key, value in data.items():
            if isinstance(value, tuple):
                data[key] = list(value)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        """The config a JSON object describes; every field is type- and range-checked like a flag."""
        if not isinstance(data, dict):
            raise ConfigError("config", f"a config must be a JSON object of fields, got {_shown(data)}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            named = "[" + ", ".join(shown(name, 40) for name in unknown[:5]) + (", …" if len(unknown) > 5 else "") + "]"
            allowed = str(sorted(known))
            if len(allowed) > 600:  # one line: the nearest names, and where the whole list is
                import difflib

                nearest = difflib.get_close_matches(str(unknown[0])[:100], sorted(known), n=5, cutoff=0.5)
                allowed = (f"{len(known)} fields (parallax run --help lists them)"
                           + (f", e.g. {', '.join(nearest)}" if nearest else ""))
            raise ConfigError(unknown[0], f"unknown config field(s) {named}; allowed: {allowed}")
        return cls(**data)  # lists become tuples in __post_init__, after their items are checked

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)


def _parse_bands(bands: Any) -> tuple[int, ...]:
    malformed = ConfigError(
        "bands", f"bands {_shown(bands)} must be comma-separated zero-based band indices, e.g. 3,2,1 (in a "
        "config file: [3, 2, 1])"
    )
    if isinstance(bands, str):
        items = [b.strip() for b in bands.split(",") if b.strip()]
        if not all(b.isascii() and b.isdecimal() and len(b) <= 6 for b in items):
            raise malformed
        parsed = tuple(int(b) for b in items)
    elif isinstance(bands, (list, tuple)) and all(isinstance(b, int) and not isinstance(b, bool) for b in bands):
        parsed = tuple(bands)
    else:
        raise malformed
    if len(parsed) > MAX_BAND_INDEX + 1:
        raise ConfigError("bands", f"bands lists {len(parsed)} indices, more than the {MAX_BAND_INDEX + 1} allowed")
    if not parsed or not all(0 <= b <= MAX_BAND_INDEX for b in parsed):
        raise ConfigError("bands", f"bands {_shown(bands)} must be one or more indices from 0 to {MAX_BAND_INDEX}, "
                          "e.g. 3,2,1")
    return parsed


def parse_augment(augment: Any) -> str:
    """'crop, flip' -> 'flip,crop'; 'none' or '' -> 'none'. A list of names is accepted too."""
    if isinstance(augment, (list, tuple)) and all(isinstance(a, str) for a in augment):
        augment = ",".join(augment)
    if not isinstance(augment, str) or len(augment) > MAX_CHOICE_LENGTH:
        raise ConfigError("augment", f"augment {_shown(augment)} is not allowed: use none or a comma list of "
                          f"{', '.join(AUGMENTATIONS)}, e.g. flip,crop")
    items = [a.strip().lower() for a in augment.split(",") if a.strip()]
    if items in ([], ["none"]):
        return "none"
    unknown = [a for a in items if a not in AUGMENTATIONS]
    if unknown:
        raise ConfigError("augment", f"augment {_shown(augment)} is not allowed: use none or a comma list of "
                          f"{', '.join(AUGMENTATIONS)}, e.g. flip,crop")
    return ",".join(a for a in AUGMENTATIONS if a in items)


def _check_path_length(dataset: str) -> None:
    """Refuse a dataset path the OS would refuse (ENAMETOOLONG) before anything looks it up."""
    if "\x00" in dataset:
        raise ConfigError("dataset", f"dataset {_shown(dataset)} holds a NUL character, which no path can hold")
    if not is_utf8(dataset):
        # The path is recorded and shown as text, which a name that is not UTF-8 cannot be.
        raise ConfigError("dataset", f"dataset {shown_name(dataset[:MAX_PATH_LENGTH])} is not allowed: its name holds "
                          "bytes that are not UTF-8 (shown escaped); rename the folder to a UTF-8 name (e.g. convmv "
                          "-f latin1 -t utf8 -r --notest FOLDER) or link to it from a UTF-8 path")
    if len(dataset) > MAX_PATH_LENGTH:
        raise ConfigError("dataset", f"dataset {shown_length(dataset)} is not allowed: a path has at most "
                          f"{MAX_PATH_LENGTH} characters")
    longest = max(dataset.split(os.sep), key=len)
    if len(longest.encode("utf-8", "surrogateescape")) > MAX_PATH_PART_LENGTH:
        raise ConfigError("dataset", f"dataset path has a part {shown_length(longest)} longer than the "
                          f"{MAX_PATH_PART_LENGTH} bytes one folder or file name may have: give an existing folder")


def _require_int(cfg: RunConfig, name: str, low: int, high: int) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(name, f"{name} {_shown(value)} is not allowed: use a whole number from {low} to {high}")


def _require(cfg: RunConfig, spec: Field) -> None:
    """A field the catalogue's bounds, list or type check in full."""
    value = getattr(cfg, spec.name)
    if not spec.allows(value):
        verb = "choose" if spec.choices is not None else "use"
        raise ConfigError(spec.name, f"{spec.name} {_shown(value)} is not allowed: {verb} {spec.allowed}")


def _require_choice(cfg: RunConfig, name: str, allowed: tuple[str, ...] | list[str]) -> None:
    value = getattr(cfg, name)
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(name, f"{name} {_shown(value)} is not allowed: choose one of {', '.join(allowed)}")


def _check_dataset(cfg: RunConfig) -> None:
    if not isinstance(cfg.dataset, str) or not cfg.dataset.strip():
        raise ConfigError("dataset", "dataset is empty: give a built-in name (e.g. digits) or a folder path")
    _check_path_length(cfg.dataset)


def _check_model_name(cfg: RunConfig) -> None:
    if not isinstance(cfg.model, str) or not cfg.model.strip():
        raise ConfigError("model", "model is empty: give a timm model name, e.g. resnet18")
    if ":" in cfg.model:  # your own model, pkg.module:Attr or path/to/file.py:Attr (contract/model_source.py)
        _check_custom_model_name(cfg)
    elif len(cfg.model) > MAX_MODEL_NAME_LENGTH:
        raise ConfigError("model", f"model {shown_length(cfg.model)} is not allowed: a timm model name has at most "
                          f"{MAX_MODEL_NAME_LENGTH} characters, e.g. resnet18")
    if not isinstance(cfg.model_source, str) or not (cfg.model_source == "" or MODEL_SOURCE.fullmatch(cfg.model_source)):
        raise ConfigError("model_source", f"model_source {_shown(cfg.model_source)} is not allowed: it is recorded at "
                          "launch as '<file> sha256=<64 hex digits>', or '' for a timm model")


MODEL_SOURCE = re.compile(r".+ sha256=[0-9a-f]{64}", re.DOTALL)


def _check_custom_model_name(cfg: RunConfig) -> None:
    from contract.model_source import ModelError, split_model_spec

    if "\x00" in cfg.model or len(cfg.model) > MAX_PATH_LENGTH:
        raise ConfigError("model", f"model {shown_length(cfg.model)} is not allowed: a path:Attr has at most "
                          f"{MAX_PATH_LENGTH} characters and no NUL")
    try:
        split_model_spec(cfg.model)
    except ModelError as exc:
        raise ConfigError("model", str(exc)) from None
    if cfg.pretrained:
        raise ConfigError("pretrained", f"pretrained is not allowed with model {_shown(cfg.model)}: pretrained "
                          "weights are timm's; load your own in the model's constructor")


def parse_model_args(model_args: Any) -> str:
    """'{"depth": 34}' or {"depth": 34} -> '{"depth": 34}' (canonical JSON); anything but a JSON object is refused."""
    allowed = 'give the model\'s keyword arguments as a JSON object, e.g. {"depth": 34}'
    if isinstance(model_args, str):
        if len(model_args) > MAX_MODEL_ARGS_LENGTH:
            raise ConfigError("model_args", f"model_args {shown_length(model_args)} is not allowed: at most "
                              f"{MAX_MODEL_ARGS_LENGTH:,} characters; {allowed}")
        try:
            value = json.loads(model_args) if model_args.strip() else {}
        except (ValueError, RecursionError) as exc:
            raise ConfigError("model_args", f"model_args {_shown(model_args)} is not JSON ({getattr(exc, 'msg', exc)}): "
                              f"{allowed}") from None
    else:
        value = model_args
    if not isinstance(value, dict):
        raise ConfigError("model_args", f"model_args {_shown(model_args)} is not allowed: {allowed}")
    for size in ("num_classes", "in_chans"):  # the dataset decides them; given, they are checked against it
        given = value.get(size)
        if size in value and (isinstance(given, bool) or not isinstance(given, int) or not 1 <= given <= 1_000_000):
            raise ConfigError("model_args", f"model_args gives {size} {_shown(given)}, which is not allowed: give the "
                              f"dataset's {'class count' if size == 'num_classes' else 'channels'} as a whole number, "
                              "or leave it out (the dataset's is passed where the model takes it)")
    try:
        return json.dumps(value, sort_keys=True, allow_nan=False)
    except (ValueError, TypeError, RecursionError) as exc:
        raise ConfigError("model_args", f"model_args {_shown(model_args)} is not allowed ({exc}): {allowed}") from None


def _check_model_args(cfg: RunConfig) -> None:
    parse_model_args(cfg.model_args)  # normalised in __post_init__; named in the field catalogue


def _validate(cfg: RunConfig) -> None:
    _check_dataset(cfg)
    _check_model_name(cfg)
    for spec in FIELDS.values():
        if spec.simple:
            _require(cfg, spec)
    if 0 < cfg.stored_size < cfg.image_size:
        raise ConfigError("stored_size", f"stored_size {cfg.stored_size} is not allowed: use 0 (store at image_size) "
                          f"or a size from image_size {cfg.image_size} to {MAX_IMAGE_SIZE}")
    _require_int(cfg, "nodes", 1, MAX_NODES)
    _require_choice(cfg, "strategy", list(STRATEGIES))
    _validate_recipe(cfg)
    _validate_devices(cfg)
    _validate_loader_workers(cfg)
    _validate_speed_switches(cfg)
    _validate_data_on_device(cfg)
    _validate_slurm(cfg)


def _validate_slurm(cfg: RunConfig) -> None:
    """The Slurm fields' own rules (slurm_options.py), named in the field catalogue."""
    from contract.slurm_options import SlurmOptionError, check_slurm_options

    try:
        check_slurm_options(cfg)
    except SlurmOptionError as exc:
        raise ConfigError(exc.field, str(exc)) from None


def data_holding_devices(cfg: RunConfig) -> list[str]:
    """The devices a run keeps its dataset on: every process's own where each replica reads images
    (ddp, fsdp), else the first (one process, or a pipeline's first stage, the only one fed images)."""
    strategy = strategy_spec(cfg.strategy)
    return list(cfg.devices) if strategy.distributed and not strategy.microbatched else list(cfg.devices[:1])


def data_refusal(stored_bytes: int, free_bytes: int, device: str) -> str:
    """Why ``--data-on-device on`` cannot keep ``stored_bytes`` of stored pixels on ``device``, in one line."""
    return (f"data_on_device on: the dataset's {stored_bytes / 2**20:,.0f} MB of stored pixels do not fit in the "
            f"{max(0, free_bytes) / 2**20:,.0f} MB free on {device}: use auto (kept where they take at most a "
            "tenth of the free memory) or off")


def data_on_device_problem(cfg: RunConfig, stored_bytes: int, free_bytes: dict[str, int]) -> str | None:
    """Why ``cfg`` (with ``--data-on-device on``) cannot keep ``stored_bytes`` on the GPUs that would hold it,
    given their free memory where it is known (by "cuda:N"), or None. GPUs of other machines are theirs to check."""
    if cfg.data_on_device != "on" or not cfg.uses_cuda or cfg.nodes > 1:
        return None
    for device in dict.fromkeys(data_holding_devices(cfg)):
        if device in free_bytes and stored_bytes > free_bytes[device]:
            return data_refusal(stored_bytes, free_bytes[device], device)
    return None


def _validate_data_on_device(cfg: RunConfig) -> None:
    """``on`` asks for what only a CUDA run over the cache can do; whether the set fits its GPUs is
    checked where their free memory can be read (preflight, and each rank before it copies)."""
    if cfg.data_on_device != "on":
        return
    if not cfg.uses_cuda:
        raise ConfigError("data_on_device", f"data_on_device on keeps the dataset on a GPU, and this run trains on "
                          f"{','.join(cfg.devices)}: use auto or off, or list CUDA devices")
    if cfg.decode == "workers":
        raise ConfigError("data_on_device", "data_on_device on keeps the decoded cache on the GPU, and decode workers "
                          "decodes every epoch, caching nothing: use decode cache, or data_on_device auto or off")


def _validate_speed_switches(cfg: RunConfig) -> None:
    strategy = strategy_spec(cfg.strategy)
    if cfg.compile and strategy.compile_refusal:
        raise ConfigError("compile", f"compile is not allowed with strategy {cfg.strategy}: {strategy.compile_refusal}; "
                          f"use {spoken(names_where(lambda s: not s.compile_refusal))}")
    if cfg.channels_last and strategy.channels_last_refusal:
        raise ConfigError("channels_last", f"channels_last is not allowed with strategy {cfg.strategy}: "
                          f"{strategy.channels_last_refusal}; "
                          f"use it with {spoken(names_where(lambda s: not s.channels_last_refusal))}")


def _validate_recipe(cfg: RunConfig) -> None:
    warmup = cfg.warmup_epochs
    if (isinstance(warmup, bool) or not isinstance(warmup, (int, float))
            or not 0 <= warmup <= cfg.epochs):  # also refuses nan
        raise ConfigError("warmup_epochs", f"warmup_epochs {_shown(warmup)} is not allowed: use a number from 0 to the "
                          f"run's epochs ({cfg.epochs}); fractions are allowed, e.g. 0.5")
    label_smoothing = cfg.label_smoothing
    if (isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float))
            or not 0 <= label_smoothing < 1):  # also refuses nan
        raise ConfigError("label_smoothing", f"label_smoothing {_shown(label_smoothing)} is not allowed: use a number "
                          "in [0, 1), e.g. 0.1 (0 = plain cross-entropy)")
    clip = cfg.grad_clip
    if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not 0 <= clip <= MAX_GRAD_CLIP:
        raise ConfigError("grad_clip", f"grad_clip {_shown(clip)} is not allowed: give the largest gradient norm, a number "
                          f"from 0 to {MAX_GRAD_CLIP:g} (e.g. 1.0; 0 = no clipping)")
    if strategy_spec(cfg.strategy).microbatched and cfg.on_nonfinite == "skip":
        raise ConfigError(
            "on_nonfinite", f"on_nonfinite 'skip' is not allowed with strategy {cfg.strategy}: its schedule steps the "
            "optimizer inside the pipeline, where a step cannot be dropped; use stop or warn"
        )
    if strategy_spec(cfg.strategy).microbatched and cfg.accumulate_steps > 1:
        raise ConfigError(
            "accumulate_steps", f"accumulate_steps {cfg.accumulate_steps} is not allowed with strategy {cfg.strategy}: a "
            "pipeline already accumulates gradients over its microbatches; use 1 and raise --batch-size and "
            "--microbatches instead"
        )
    if cfg.scale_lr is True and not 0 < cfg.base_lr < math.inf:
        raise ConfigError("lr", f"lr {cfg.lr!r} scaled to {cfg.base_lr:g} by --scale-lr (x {cfg.effective_batch}/"
                          f"{SCALE_LR_REFERENCE_BATCH}) is not allowed: the scaled lr must be a finite number above 0")


def _validate_devices(cfg: RunConfig) -> None:
    devices, n = cfg.devices, len(cfg.devices)
    kinds = {d.split(":")[0] for d in devices}
    if len(kinds) > 1:
        raise ConfigError("devices", f"devices {','.join(devices)} mix CPU and GPU: use one kind")
    # A Slurm job's processes run on the nodes it asks for, not on this machine (slurm_options.py judges them).
    if kinds == {"cpu"} and n > 1 and cfg.where != "slurm":
        here = -(-n // cfg.nodes)  # the most any one machine of the job runs
        limit = max_cpu_processes()
        if here > limit:
            why = _process_limit_why(limit)
            raise ConfigError(
                "devices", f"devices ask for {here} CPU {'processes' if strategy_spec(cfg.strategy).distributed else 'devices'} "
                f"on one machine, more than the {limit} allowed ({why}): use at most {limit}"
            )
    gpus = [d for d in devices if d.startswith("cuda")]
    if cfg.nodes > 1 and (not strategy_spec(cfg.strategy).distributed or n < cfg.nodes):
        raise ConfigError(
            "nodes", f"nodes {cfg.nodes}: only ddp, fsdp and pp run across machines, with at least one "
            "process per machine; start them with torchrun"
        )
    if cfg.nodes == 1 and len(set(gpus)) != len(gpus):
        raise ConfigError("devices", f"devices {','.join(devices)} list a GPU twice: each GPU once")
    problem = strategy_spec(cfg.strategy).problem(cfg)  # its own rules: how many devices, how the batch divides over them
    if problem is not None:
        raise ConfigError(*problem)
    if cfg.amp in ("bf16", "fp16") and not gpus:
        raise ConfigError(
            "amp", f"amp {cfg.amp!r} needs CUDA devices; on CPU training runs in fp32: use auto or off"
        )
    # Other machines' GPUs (a torchrun job's, a Slurm cluster's nodes) cannot be counted from here.
    if gpus and cfg.nodes == 1 and cfg.where != "slurm":
        available = cuda_device_count()
        missing = [d for d in gpus if int(d.split(":")[1]) >= available]
        if missing:
            have = f"GPUs 0..{available - 1}" if available else "no CUDA GPUs"
            raise ConfigError("devices", f"device {missing[0]} does not exist: this machine has {have}")


def _process_limit_why(limit: int) -> str:
    return (f"{CPU_PROCESSES_PER_CORE} per core, {cpu_cores()} cores; {MAX_CPU_PROCESSES_ENV} sets another limit"
            if limit == CPU_PROCESSES_PER_CORE * cpu_cores() else f"set by {MAX_CPU_PROCESSES_ENV}")


def _validate_loader_workers(cfg: RunConfig) -> None:
    """Data-loader workers are processes on the machine too: each training process keeps
    ``num_workers`` for its training loader and as many for its validation loader (both persistent),
    whether it computes on the CPU or feeds a GPU."""
    if not cfg.num_workers or cfg.where == "slurm":  # on Slurm: the nodes' cores it asks for (slurm_options.py)
        return
    ranks = -(-cfg.world_size // cfg.nodes)  # training processes on the busiest machine of the job
    total = ranks * (1 + 2 * cfg.num_workers)
    limit = max_cpu_processes()
    if total > limit:
        most = max(0, (limit // ranks - 1) // 2)
        who = "1 training process" if ranks == 1 else f"{ranks} training processes, each"
        raise ConfigError(
            "num_workers", f"num_workers {cfg.num_workers} is not allowed here: {who} with {cfg.num_workers} "
            f"loader workers for training and {cfg.num_workers} for validation make {total} processes on one "
            f"machine, more than the {limit} allowed ({_process_limit_why(limit)}): use at most {most} loader "
            f"worker{'s' if most != 1 else ''} per process"
        )


def cuda_device_count() -> int:
    """GPUs visible to CUDA: NVML's count (no CUDA context, no torch: the dashboard checks a config in its own
    process, which never imports torch), else torch's where NVML cannot be read."""
    from contract.devices import visible_gpu_count

    if (count := visible_gpu_count()) is not None:
        return count
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def threads_per_process(config: RunConfig) -> int:
    """CPU threads for each of a run's processes on one machine: its cores shared out, whether the
    processes compute on the CPU or feed GPUs (N processes each taking every core fight for them)."""
    return max(1, cpu_cores() // config.processes_per_node)


def max_cpu_processes() -> int:
    """CPU devices one machine may run for a run: PARALLAX_MAX_CPU_PROCESSES, default 4 per core."""
    from contract.environment import whole_number_from_env

    try:
        return whole_number_from_env(MAX_CPU_PROCESSES_ENV, CPU_PROCESSES_PER_CORE * cpu_cores(), high=MAX_DEVICES)
    except ValueError as exc:
        raise ConfigError("devices", str(exc)) from None


def strategy_notes(config: RunConfig) -> list[str]:
    """What a user should know about how their strategy really runs on these devices."""
    notes = []
    if config.world_size > 1 and not config.uses_cuda:
        threads = threads_per_process(config)
        batch = (f"per-process batch {config.per_device_batch}" if not strategy_spec(config.strategy).microbatched
                 else f"{config.microbatches} microbatches of {config.batch_size // config.microbatches}")
        notes.append(
            f"{config.strategy.upper()} on CPU: {len(config.devices)} processes on gloo, {threads} thread(s) "
            f"each ({cpu_cores()} cores shared), {batch}."
        )
    notes += strategy_spec(config.strategy).notes(config)  # a process per CPU device is never a world of one
    if config.amp == "auto" and not config.uses_cuda:
        notes.append("AMP auto: CPU runs train in fp32.")
    return notes + recipe_notes(config)


def lr_warning(config: RunConfig) -> str | None:
    """A learning rate above LR_WARN_ABOVE is allowed (a run forced to diverge is a run too), and said."""
    if config.base_lr <= LR_WARN_ABOVE:
        return None
    return (f"Learning rate {config.base_lr:g} is above {LR_WARN_ABOVE:g}: training usually diverges there (the loss "
            f"turns NaN or infinite; on a NaN or infinite loss this run will {config.on_nonfinite}).")


def recipe_notes(config: RunConfig) -> list[str]:
    """What the run's recipe changes about the batch and the learning rate, in numbers."""
    notes = [warning] if (warning := lr_warning(config)) else []
    if config.accumulate_steps > 1:
        notes.append(
            f"Gradient accumulation: {config.accumulate_steps} batches of {config.batch_size} per optimizer step, "
            f"an effective batch of {config.effective_batch}"
            + (" (DDP/FSDP all-reduce gradients only on the last of them)." if strategy_spec(config.strategy).splits_batch
               else ".")
        )
    if config.scale_lr:
        notes.append(
            f"Learning rate scaled by the linear rule: {config.lr:g} x {config.effective_batch}/"
            f"{SCALE_LR_REFERENCE_BATCH} = {config.base_lr:g} (the given lr is for a global batch of "
            f"{SCALE_LR_REFERENCE_BATCH}; the effective batch is {config.effective_batch})."
        )
    if config.lr_schedule != "constant" or config.warmup_epochs:
        warmup = f" after {config.warmup_epochs:g} epoch(s) of linear warmup" if config.warmup_epochs else ""
        notes.append(f"Learning rate schedule {config.lr_schedule}{warmup}, stepped per optimizer step; "
                     "each epoch's lr is the one its last optimizer step used.")
    return notes
