"""The catalogue of run-config fields a user sets: each one's label, help, bounds or choices, and flag, once.

    FIELDS["epochs"]          # Field(name='epochs', kind=int, default=3, low=1, high=10000, ...)
    FIELDS["epochs"].flag     # '--epochs'
    FIELDS["lr"].allowed      # 'a finite number above 0'
    FIELDS["microbatches"].section, FIELDS["microbatches"].shown_when   # 'Strategy', with_strategy(microbatched)

Three readers: ``RunConfig`` validates the simple bounds and choices from it (config.py), the command line
builds its flags from it (control/cli.py) and the Launch form its sections and widgets (ui/field_widgets.py): a
field with a ``section`` is drawn there, in catalogue order, with the widget its kind (or ``widget``) asks
for, and only where its ``shown_when`` holds for the form's values; a field without one is a flag only. A
field whose rules
say more than bounds or a list (devices, tags, bands, dataset paths ...) names the config.py function that
checks it in ``check``. Below config.py, so it holds the lists and limits config.py validates against, and the
defaults: RunConfig's fields default to their entries' (config._default).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from contract.strategy_specs import StrategySpec, baseline, find

PIPELINE_SCHEDULES = ("gpipe", "1f1b")
OPTIMIZERS = ("adam", "adamw", "sgd")
AMP_MODES = ("auto", "off", "bf16", "fp16")
LR_SCHEDULES = ("constant", "cosine", "step", "onecycle")
# The linear scaling rule (Goyal et al., 2017): the given learning rate is for this global batch.
SCALE_LR_REFERENCE_BATCH = 256
MAX_ACCUMULATE_STEPS = 1024
MAX_GRAD_CLIP = 1e6
AUGMENTATIONS = ("flip", "crop")  # done on the device, on whole training batches (augment.py)
VAL_SOURCES = ("test", "train")  # the official test split where a dataset ships one, or a share of training
DECODE_MODES = ("cache", "workers")  # decode once into the mapped cache, or every epoch in the loader workers
DATA_ON_DEVICE_MODES = ("auto", "on", "off")  # keep the cached dataset on the GPU: when it fits a share, always, never
NONFINITE_ACTIONS = ("stop", "skip", "warn")  # what a NaN or infinite training loss does (rank/divergence.py)
STALL_ACTIONS = ("wait", "cancel")  # what a run that stalls does after its stacks are logged (supervisor/stall.py)
MAX_EPOCHS = 10_000
MAX_BATCH_SIZE = 65_536
MIN_IMAGE_SIZE, MAX_IMAGE_SIZE = 8, 1024
MAX_TAGS, MAX_TAG_LENGTH = 64, 200
MAX_CHOICE_LENGTH = 200  # a choice (strategy, optimizer, ...) or the augment list; the allowed ones are short
# The datasets a name stands for (trainer_backend/datasets/builtin.py, which imports torch to say so); any other
# dataset is a path (contract/user_paths.py).
BUILTIN_DATASETS = ("digits", "mnist", "fashion_mnist", "cifar10", "eurosat")
SET_BY_TORCHRUN = ("nodes",)  # RunConfig fields no user sets: torchrun's world gives them
SET_BY_LAUNCH = ("model_source",)  # RunConfig fields no user sets: the launch records them


# Whether the Launch form shows a field, given the values drawn so far (the started config's for the rest) and
# "strategies": the strategies the form will run (the one run's, or the sweep's).
Condition = Callable[[Mapping[str, Any]], bool]


def when(name: str, *values: Any) -> Condition:
    """Shown where the form's field ``name`` holds one of ``values``: ``shown_when=when("where", "slurm")``."""
    return lambda form: form.get(name) in values


def with_strategy(flag: Callable[[StrategySpec], bool]) -> Condition:
    """Shown where one of the form's strategies has ``flag``: ``with_strategy(lambda s: s.microbatched)``."""
    return lambda form: any(flag(found) for name in form.get("strategies", ()) if (found := find(name)) is not None)


def split_commas(text: str) -> list[str]:
    """'a, b,,c' -> ['a', ' b', '', 'c']: the items of a comma list, cleaned by the field's own check."""
    return text.split(",")


@dataclass(frozen=True)
class Field:
    """One user-settable RunConfig field. ``low``/``high`` bound numbers (``low_open``/``high_open``: the bound
    itself is refused; ``high`` None: no fixed upper bound); ``choices`` is the fixed list a choice takes, and
    ``registry`` names where the choices live when the list is not fixed here ("strategies": config.STRATEGIES;
    "datasets", "models": free text, offered from their registries by the dashboard)."""

    name: str
    kind: type  # int, float, bool or str
    default: Any
    label: str  # the Launch form's label
    help: str  # one sentence, for the form's tooltip and the flag's --help
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] | None = None
    registry: str | None = None
    check: str | None = None  # the config.py function holding rules beyond bounds and choices
    parse: Callable[[str], Any] | None = None  # text -> value for the flag; None: a --x/--no-x switch
    step: float | None = None  # the form's increment for a number
    choice_labels: dict[str, str] = field(default_factory=dict)  # how the form words each choice
    # The Launch form (ui/field_widgets.py): the section it is drawn in (None: the command line only) and a heading inside
    # it; the widget where the kind's own does not fit ("toggle", "multiselect", "radio"); what a multiselect or a
    # choice offers where ``choices`` is not the rule (a tuple, or a function giving them, e.g. from the machine);
    # when it is shown (None: always; a hidden field keeps its default); a text's placeholder and longest input,
    # and how a list value is joined into its text (so that ``parse`` splits it back).
    section: str | None = None
    group: str | None = None
    widget: str | None = None
    options: tuple[str, ...] | Callable[[], Sequence[str]] | None = None
    shown_when: Condition | None = None
    placeholder: str | None = None
    max_chars: int | None = None
    separator: str = ", "

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def simple(self) -> bool:
        """Its bounds, list or type say all there is to check, so ``allows`` is its whole validation."""
        return self.check is None and (self.kind is bool or self.choices is not None or self.low is not None)

    @property
    def allowed(self) -> str:
        """What the field takes, in the words its refusal uses: 'a whole number from 1 to 10000'."""
        if self.kind is bool:
            return "true or false"
        if self.choices is not None:
            return f"one of {', '.join(self.choices)}"
        if self.kind is int and self.low is not None and self.high is not None:
            return f"a whole number from {self.low} to {self.high}"
        if self.kind is float and self.low is not None and self.high is not None:
            return f"a number in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"
        if self.kind is float and self.low is not None and self.low_open:
            return f"a finite number above {self.low:g}"
        return "a text" if self.kind is str else f"a number from {self.low}"

    def allows(self, value: Any) -> bool:
        """Whether ``value`` has the field's type and lies in its bounds or list (None where None is the default)."""
        if value is None and self.default is None:
            return True
        if self.kind is bool:
            return isinstance(value, bool)
        if self.choices is not None:
            return isinstance(value, str) and value in self.choices
        if self.kind is str:
            return isinstance(value, str)
        numbers = int if self.kind is int else (int, float)
        if isinstance(value, bool) or not isinstance(value, numbers):
            return False
        if isinstance(value, float) and not math.isfinite(value):  # an int may be too large for a float
            return False
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below


def _number(name, kind, default, label, help, low, high=None, *, step, **more) -> Field:
    return Field(name, kind, default, label, help, low=low, high=high, parse=kind, step=step, **more)


def _choice(name, default, label, help, choices, **more) -> Field:
    return Field(name, str, default, label, help, choices=choices, parse=str, **more)


def _switch(name, label, help, **more) -> Field:
    return Field(name, bool, False, label, help, **more)


MORE = "More options"
RECIPE = {"section": "Advanced", "group": "Training recipe"}
SPEED = {"section": "Advanced", "group": "Augmentation and speed"}
PIPELINED = with_strategy(lambda s: s.microbatched)

# In the order the command line lists them and the Launch form draws each section's fields; RunConfig validates
# the simple ones in this order too.
FIELDS: dict[str, Field] = {f.name: f for f in (
    Field("dataset", str, "digits", "Dataset", "A built-in set (digits, mnist, fashion_mnist, cifar10, eurosat), a "
          "folder with one sub-folder per class (or train/ and val/ trees of them), or a .csv/.txt list of path,label "
          "lines.", registry="datasets", check="_check_dataset", parse=str, section="Data"),
    _number("image_size", int, 32, "Image size (pixels, square)", "Every image is resized to N×N pixels before "
            "training.", MIN_IMAGE_SIZE, MAX_IMAGE_SIZE, step=8, section="Data"),
    _choice("decode", "cache", "Decode images", "The cache decodes a dataset once into a file every process maps; "
            "workers decode an image folder's files in the data-loader workers every epoch, caching nothing.",
            DECODE_MODES, choice_labels={"cache": "once, into a cache every process maps",
                                         "workers": "every epoch, in the data-loader workers"}, section=MORE),
    _choice("data_on_device", "auto", "Keep the dataset on the GPU", "A CUDA run copies the cached dataset onto each "
            "process's GPU once, so that batches need no copy from host memory: auto where its stored pixels take at "
            "most a tenth of the GPU's free memory, on wherever they fit (refused where they do not), off never.",
            DATA_ON_DEVICE_MODES, choice_labels={"auto": "auto: where it takes a tenth of the free memory at most",
                                                 "on": "on: always (refused where it does not fit)",
                                                 "off": "off: never (batches are copied from host memory)"},
            section=MORE),
    _number("stored_size", int, 0, "Stored image size (0: the image size)", "Store the dataset cache at this size, "
            "at least the image size: training batches take random-resized crops of it and validation a centre "
            "crop, as ImageNet recipes do; 0 stores at the image size.", 0, MAX_IMAGE_SIZE, step=8,
            section=MORE),
    Field("bands", str, None, "Bands (multi-band TIFFs, zero-based, e.g. 3,2,1; blank: default)", "Zero-based band "
          "indices of multi-band TIFFs, e.g. 3,2,1 (blank: the default for 13-band files).", check="_parse_bands",
          parse=str, section=MORE, max_chars=MAX_CHOICE_LENGTH),
    _number("band_scale", float, None, "Band scale", "Band values are divided by this, then clipped to [0, 1] "
            "(4000 for 13-band files when not given).", 0.0, 1e9, low_open=True, step=100.0),
    Field("model", str, "resnet18", "timm model (type to search)", "A timm model name, e.g. resnet18, or your own: "
          "pkg.module:Attr or path/to/file.py:Attr, an nn.Module class or a function returning one.",
          registry="models", check="_check_model_name", parse=str, section="Model"),
    Field("model_args", str, "{}", "Model arguments (a JSON object)", "The model's keyword arguments as a JSON "
          'object, e.g. {"depth": 34}; num_classes and in_chans come from the dataset (given here, they must match '
          "it).", check="_check_model_args", parse=str, section="Model"),
    _switch("pretrained", "Start from pretrained weights (from the local cache when offline)",
            "Start from the model's pretrained weights, from the local cache when offline.", section=MORE),
    Field("strategy", str, baseline().name, "Strategy", "How the run spreads over its devices.", registry="strategies",
          check="STRATEGIES", parse=str, section="Strategy"),
    Field("devices", str, ("cpu",), "Devices", "Comma list of torch devices: cpu may repeat (cpu,cpu = 2 CPU "
          "processes for ddp) and a bare integer N means cuda:N.", check="parse_devices", parse=str,
          section="Devices"),
    _number("batch_size", int, 128, "Global batch size", "The global batch: ddp and fsdp give each of N processes "
            "batch/N, dp splits it over its GPUs, pp cuts it into microbatches.", 1, MAX_BATCH_SIZE, step=16,
            section="Training"),
    _number("epochs", int, 3, "Epochs", "Passes over the training images.", 1, MAX_EPOCHS, step=1,
            section="Training"),
    # No upper bound: a run forced to diverge is a run a user may want; one above LR_WARN_ABOVE is warned of.
    _number("lr", float, 1e-3, "Learning rate", "The learning rate, the peak of its schedule.", 0.0, None,
            low_open=True, step=1e-4, section="Training"),
    _choice("optimizer", "adam", "Optimizer", "The optimizer that steps the weights.", OPTIMIZERS,
            section="Training"),
    _number("weight_decay", float, 0.0, "Weight decay", "Weight decay the optimizer applies to the weights.",
            0.0, 1.0, step=1e-4, section=MORE),
    _choice("amp", "auto", "Mixed precision (AMP)", "Mixed precision on CUDA: auto is bf16 where every GPU of the run "
            "supports it, else fp16 with a gradient scaler, settled before the run starts; CPU runs train in fp32.",
            AMP_MODES, section="Training"),
    _number("num_workers", int, 0, "Data-loader workers per process", "Data-loader worker processes per training "
            "process; the decoded set is one cache file every process maps, so workers mostly add hand-over cost.",
            0, 64, step=1, section=MORE),
    _number("seed", int, 0, "Seed", "Seed of the run's random numbers: the same seed repeats a run.", 0, 2**31 - 1,
            step=1, section=MORE),
    _number("val_fraction", float, 0.2, "Validation share", "Share of the training images held out, stratified, "
            "where the dataset has no official test split or validation is from train.", 0.0, 0.9, low_open=True,
            step=0.05, section=MORE),
    _choice("val_from", "test", "Validate on", "test validates on the official test split of mnist, fashion_mnist "
            "and cifar10, so their accuracies compare with published ones, and on a folder's val/ tree or the "
            "val.csv beside a train.csv (other datasets hold out the validation share); train always holds out the "
            "validation share of the training images.", VAL_SOURCES,
            choice_labels={"test": "the official test split (where the dataset has one)",
                           "train": "a share of the training images"}, section=MORE),
    _number("bn_stats_images", int, 512, "BatchNorm statistics from N training images", "BatchNorm statistics are "
            "re-estimated from this many training images with the current weights before each validation, so that "
            "short runs validate what they learnt; 0 validates on the running averages.", 0, 1_000_000, step=256,
            section=MORE),
    _choice("lr_schedule", "constant", "Learning-rate schedule", "The learning rate per optimizer step after the "
            "warmup: constant; cosine (down to 0); step (a tenth after each third of the run); onecycle (from lr/25 "
            "up over the warmup, 30 % of the run by default, then cosine down to lr/250000).", LR_SCHEDULES,
            **RECIPE),
    _number("warmup_epochs", float, 0.0, "Warmup epochs (linear, fractions allowed)", "Linear warmup from 0 to the "
            "learning rate over this many epochs, at most the run's epochs; fractions are allowed.", 0.0,
            check="_validate_recipe", step=0.5, **RECIPE),
    _switch("scale_lr", f"Scale the learning rate with the batch (lr given for {SCALE_LR_REFERENCE_BATCH})",
            f"The linear scaling rule: the learning rate given is for a global batch of {SCALE_LR_REFERENCE_BATCH} "
            f"and is scaled by the effective batch / {SCALE_LR_REFERENCE_BATCH}; the run's notes state the result.",
            **RECIPE),
    _number("label_smoothing", float, 0.0, "Label smoothing", "Label smoothing of the training loss; the validation "
            "loss stays the plain cross-entropy.", 0.0, 1.0, high_open=True, check="_validate_recipe", step=0.05,
            **RECIPE),
    _number("grad_clip", float, 0.0, "Gradient clipping (max norm, 0 = off)", "The global gradient norm is scaled "
            "down to this (under fp16 AMP after unscaling); 0 = no clipping.", 0.0, MAX_GRAD_CLIP,
            check="_validate_recipe", step=0.5, **RECIPE),
    _choice("on_nonfinite", "stop", "On a NaN or infinite loss", "stop fails the run at that step on every rank, "
            "keeping every epoch recorded before it; skip drops that step's optimizer update (as fp16's gradient "
            "scaler does) and counts it, not with pp; warn trains on and counts it.", NONFINITE_ACTIONS,
            choice_labels={"stop": "stop the run", "skip": "skip the step's update", "warn": "train on, count it"},
            **RECIPE),
    _number("keep_checkpoints", int, 1, "Resume points kept", "Every epoch's end leaves a checkpoint to resume the "
            "run from (parallax resume); this many of the newest are kept, besides the best epoch's weights.", 1, 1000,
            step=1, **RECIPE),
    _choice("on_stall", "wait", "When no step is taken for minutes", "A run whose steps stop moving for "
            "max(PARALLAX_STALL_AFTER_S, 5 minutes by default, 20 median steps) while its processes live is marked "
            "stalled and every rank's stack goes into its log; then wait keeps it running, cancel ends it.",
            STALL_ACTIONS, choice_labels={"wait": "mark it stalled and wait", "cancel": "mark it stalled and cancel"},
            **RECIPE),
    _number("accumulate_steps", int, 1, "Gradient accumulation steps", "Batches whose gradients add up to one "
            "optimizer step: the effective batch is the global batch × N; DDP and FSDP reduce gradients only on "
            "the last of them; not with pp, whose microbatches do this.", 1, MAX_ACCUMULATE_STEPS, step=1, **RECIPE),
    _number("microbatches", int, 4, "Microbatches per batch", "Pipeline parallel: the microbatches each batch is "
            "cut into.", 1, 1024, step=1, section="Strategy", shown_when=PIPELINED),
    _choice("pipeline_schedule", "gpipe", "Pipeline schedule", "Pipeline parallel: the schedule the stages "
            "follow.", PIPELINE_SCHEDULES, section="Strategy", shown_when=PIPELINED),
    Field("tags", str, (), "Tags (comma-separated)", "Comma-separated labels for finding the run later.",
          check="parse_tags", parse=split_commas, section="Labels", placeholder="baseline, fp32",
          max_chars=MAX_TAGS * (MAX_TAG_LENGTH + 2)),
    Field("augment", str, "none", "Augmentation (training batches, on the device)", "none, or a comma list of "
          "flip (random horizontal flip) and crop (random-resized crop) of training batches, on the device; "
          "validation images are never augmented.", check="parse_augment", parse=str, widget="multiselect",
          options=AUGMENTATIONS, **SPEED),
    _switch("channels_last", "channels_last memory format", "Model and images in channels_last memory format: "
            "faster convolutions on recent GPUs (tensor cores); not with pp or fsdp.", **SPEED),
    _switch("compile", "torch.compile the model", "torch.compile the model before the first epoch; the compile "
            "time is recorded apart and left out of images/s; not with dp, pp or fsdp.", **SPEED),
    _switch("profile", "Profile the first steps (torch.profiler)", "Profile a window of first-epoch steps with "
            "torch.profiler: op table, step breakdown, traces.", section="Training", widget="toggle"),
    _number("profile_wait", int, 1, "Profiler: steps skipped", "Profiler: steps skipped before the window.", 0, 100,
            step=1),
    _number("profile_warmup", int, 1, "Profiler: warm-up steps", "Profiler: steps recorded and discarded.", 0, 100,
            step=1),
    _number("profile_active", int, 3, "Profiler: steps kept", "Profiler: steps kept, the knob for trace size.", 1,
            100, step=1),
    _switch("profile_stack", "Profiler: record Python stacks", "Profiler: record Python stacks too (larger "
            "traces)."),
)}


# Where a run goes, and what it asks a Slurm cluster for (contract/slurm_options.py checks them together; the
# job they become: control/slurm_job.py). The Launch form draws them in a section of their own.
WHERE = ("local", "slurm")
MAX_SLURM_GPUS_PER_NODE = 64
MAX_REQUEUES = 100
SLURM_SECTION = "Slurm"


def split_sbatch_options(text: str) -> list[str]:
    """'--constraint=a100 --exclusive' -> ['--constraint=a100', '--exclusive']: one #SBATCH line each."""
    import re

    return [part for part in re.split(r"\s+(?=--)", text.strip()) if part]


_SLURM_FIELDS = (
    _choice("where", "local", "Where the run goes", "local trains on this machine; slurm submits the run to a Slurm "
            "cluster as one batch job (its database must be reachable from the cluster's nodes).", WHERE,
            check="_validate_slurm", choice_labels={"local": "this machine", "slurm": "a Slurm cluster (sbatch)"}),
    Field("slurm_partition", str, None, "Partition (blank: the cluster's default)", "The Slurm partition the job "
          "asks for (sbatch --partition); blank takes the cluster's default.", check="_validate_slurm", parse=str),
    _number("slurm_nodes", int, 1, "Nodes", "Machines the job spans (sbatch --nodes), one task each, every task a "
            "torchrun agent.", 1, 4096, step=1),
    _number("slurm_gpus_per_node", int, 0, "GPUs per node (0: CPU)", "GPUs the job asks for on each node, one "
            "training process each; 0 trains on CPUs.", 0, MAX_SLURM_GPUS_PER_NODE,
            step=1),
    _number("slurm_cpus_per_task", int, 0, "CPUs per node (0: what the run needs)", "CPU cores the job asks for "
            "on each node, shared by that node's training processes and their loader workers, at least one each; 0 "
            "asks for what the run needs, a core per process and one per loader worker.", 0,
            4096, step=1),
    Field("slurm_mem", str, None, "Memory per node (e.g. 64G; blank: the default)", "Memory the job asks for on "
          "each node (sbatch --mem), a whole number with an optional K, M, G or T, e.g. 64G; blank takes the "
          "partition's default.", check="_validate_slurm", parse=str),
    Field("slurm_time", str, None, "Time limit (e.g. 2:00:00; blank: the partition's)", "The job's time limit "
          "(sbatch --time): minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS; blank takes the partition's.",
          check="_validate_slurm", parse=str),
    Field("slurm_account", str, None, "Account (optional)", "The account the job is charged to (sbatch --account).",
          check="_validate_slurm", parse=str),
    Field("slurm_qos", str, None, "QoS (optional)", "The quality of service the job asks for (sbatch --qos).",
          check="_validate_slurm", parse=str),
    Field("slurm_extra", str, (), "Extra #SBATCH options", "More sbatch options, one #SBATCH line each, read as "
          "sbatch reads them, e.g. --constraint=a100 --exclusive; a line that sets what Parallax sets (output, job "
          "name, signal, requeue, array, ...) is refused.", check="_validate_slurm",
          parse=split_sbatch_options),
    _number("max_requeues", int, 3, "Requeues at most", "How often a job that Slurm preempts or warns of its time "
            "limit (USR1) requeues itself to resume at the step where it stopped before it is left to end.", 0,
            MAX_REQUEUES, step=1),
    _number("slurm_array_limit", int, 0, "Sweep runs at once on Slurm (0: no limit)", "A sweep onto Slurm is one "
            "job array, one task per run: at most this many of them run at once (sbatch --array=0-K%M).", 0, 10_000,
            step=1),
)
# The form draws them in their own section; the job's fields only once the run goes to Slurm.
_SLURM_FIELDS = tuple(replace(f, section=SLURM_SECTION, shown_when=None if f.name == "where" else when("where", "slurm"),
                              separator=" " if f.name == "slurm_extra" else f.separator) for f in _SLURM_FIELDS)
FIELDS.update({f.name: f for f in _SLURM_FIELDS})
SECTIONS: dict[str, tuple[str, ...]] = {SLURM_SECTION: tuple(f.name for f in _SLURM_FIELDS)}
