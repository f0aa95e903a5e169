"""What a search varies and what it looks for: a range or a list of choices for fields of the catalogue, an
objective, a budget (trials and/or wall time), how many trials run at once, the sampler and the pruner. Checked
as a launch checks a config, before anything starts; torch-free and Optuna-free, so that the Launch form, the
command line and the search's driver share it.

    space = SearchSpace(params=(parse_param("lr=1e-4:1e-1:log"), parse_param("batch_size=32,64,128")),
                        objective="val_acc", trials=8, at_once=2, pruner="median")
    notes = check_space(base, space)                  # ConfigError naming the value and what is allowed
    config = trial_config(base, {"lr": 3e-3, "batch_size": 64})

A range is ``NAME=LOW:HIGH`` (``:log`` draws it log-uniformly, as learning rates and weight decay usually are),
choices ``NAME=A,B,C``. A speed search (``kind="speed"``) looks for the most images/s: every combination of its
choices is a candidate, the memory forecast filters them before any is launched (control/speed_search.py) and
each trial is a short timed run (``timed_steps`` after a warm-up epoch).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any

from contract.config import ConfigError, RunConfig, shown
from contract.fields import FIELDS, Field
from contract.strategy_specs import find

KINDS = ("hyper", "speed")
# name -> (Optuna's directions, what it is in words); a second direction makes the study multi-objective.
OBJECTIVES: dict[str, tuple[tuple[str, ...], str]] = {
    "val_acc": (("maximize",), "the best validation accuracy"),
    "images_per_s": (("maximize",), "images/s after the first epoch"),
    "time_to_acc": (("minimize",), "training seconds until the validation accuracy reaches the target"),
    "acc_and_speed": (("maximize", "maximize"), "the best validation accuracy and images/s together (a Pareto front)"),
}
SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("none", "median", "halving", "hyperband")
MAX_TRIALS = 10_000
MAX_AT_ONCE = 64
MAX_PARAMS = 32
MAX_CHOICES = 256
# Combinations checked one by one before a search starts; a larger space has each value checked on its own.
MAX_COMBINATIONS_CHECKED = 4096
DEFAULT_TIMED_STEPS = 200
# Fields a search may not vary: where the data is and how it is split (the objective would measure another
# thing), where the run goes and what it records, and the values that say which run a run is.
NOT_SEARCHED = frozenset({
    "dataset", "devices", "tags", "bands", "band_scale", "model_args", "augment", "stored_size", "val_fraction",
    "val_from", "decode", "data_on_device", "profile", "profile_wait", "profile_warmup", "profile_active",
    "profile_stack", "keep_checkpoints", "on_stall", "where", "max_requeues", "slurm_array_limit",
})
# The knobs of a speed search, in the order its answer names them.
SPEED_FIELDS = ("strategy", "batch_size", "amp", "channels_last", "compile", "num_workers", "accumulate_steps")


def searchable(spec: Field) -> bool:
    """Whether a search may vary the field: a number, a switch, a choice, a model or a strategy."""
    if spec.name in NOT_SEARCHED or spec.name.startswith("slurm_") or spec.parse is None and spec.kind is not bool:
        return False
    return spec.kind in (int, float, bool) or spec.choices is not None or spec.registry in ("models", "strategies")


SEARCHABLE: tuple[str, ...] = tuple(name for name, spec in FIELDS.items() if searchable(spec))


@dataclass(frozen=True)
class Range:
    """A number drawn from [low, high] (uniformly, or log-uniformly with ``log``); whole numbers for an int field."""

    name: str
    low: float
    high: float
    log: bool = False

    @property
    def text(self) -> str:
        return f"{self.name}={self.low:g}:{self.high:g}" + (":log" if self.log else "")

    def values_to_check(self) -> list[Any]:
        return [self.low, self.high]


@dataclass(frozen=True)
class Choices:
    """One of ``values``, each a value the field takes."""

    name: str
    values: tuple[Any, ...]

    @property
    def text(self) -> str:
        return f"{self.name}=" + ",".join(_value_text(v) for v in self.values)

    def values_to_check(self) -> list[Any]:
        return list(self.values)


Param = Range | Choices


def _value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class SearchSpace:
    """A search's settings (the base config is apart: every trial is the base with its drawn values)."""

    params: tuple[Param, ...] = ()
    kind: str = "hyper"
    objective: str = "val_acc"
    target_acc: float = 0.9  # for time_to_acc
    trials: int = 20
    timeout_s: float = 0.0  # wall time after which no new trial starts; 0: none
    at_once: int = 1
    sampler: str = "tpe"
    pruner: str = "none"
    seed: int = 0  # the sampler's
    timed_steps: int = DEFAULT_TIMED_STEPS  # a speed trial's measured steps, after its first (warm-up) epoch
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def directions(self) -> tuple[str, ...]:
        return OBJECTIVES[self.objective][0]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def to_dict(self) -> dict[str, Any]:
        return {"params": [p.text for p in self.params], "kind": self.kind, "objective": self.objective,
                "target_acc": self.target_acc, "trials": self.trials, "timeout_s": self.timeout_s,
                "at_once": self.at_once, "sampler": self.sampler, "pruner": self.pruner, "seed": self.seed,
                "timed_steps": self.timed_steps}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SearchSpace:
        values = dict(data)
        values["params"] = tuple(parse_param(text) for text in values.get("params", ()))
        return cls(**values)


def _parse_value(spec: Field, text: str, param: str) -> Any:
    """One value of a field as its flag reads it; a switch takes true/false (on/off, yes/no, 1/0)."""
    text = text.strip()
    if spec.kind is bool:
        lowered = text.lower()
        if lowered in ("true", "on", "yes", "1"):
            return True
        if lowered in ("false", "off", "no", "0"):
            return False
        raise ConfigError(spec.name, f"--param {shown(param)}: {spec.name} {shown(text)} is not allowed: give true or "
                          "false")
    try:
        value = spec.parse(text)
    except (ValueError, TypeError):
        kind = "a whole number" if spec.kind is int else "a number" if spec.kind is float else "a value"
        raise ConfigError(spec.name, f"--param {shown(param)}: {spec.name} {shown(text)} is not allowed: give "
                          f"{kind}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(spec.name, f"--param {shown(param)}: {spec.name} {shown(text)} is not allowed: give a "
                          "finite number")
    return value


def parse_param(text: str) -> Param:
    """``lr=1e-4:1e-1:log`` -> Range; ``batch_size=32,64,128`` -> Choices; one ConfigError naming what is wrong."""
    if not isinstance(text, str) or "=" not in text:
        raise ConfigError("param", f"--param {shown(text)} is not allowed: give NAME=LOW:HIGH[:log] or NAME=A,B,C, "
                          "e.g. lr=1e-4:1e-1:log or batch_size=32,64,128")
    name, _, values = text.partition("=")
    name = name.strip().replace("-", "_")
    spec = FIELDS.get(name)
    if spec is None or name not in SEARCHABLE:
        raise ConfigError("param", f"--param {shown(text)}: {shown(name)} is not a field a search may vary; "
                          f"allowed: {', '.join(SEARCHABLE)}")
    if ":" in values and spec.kind in (int, float):
        parts = values.split(":")
        scale = parts[2].strip().lower() if len(parts) == 3 else "linear"
        if len(parts) not in (2, 3) or scale not in ("log", "linear"):
            raise ConfigError(name, f"--param {shown(text)} is not allowed: a range is {name}=LOW:HIGH, or "
                              f"{name}=LOW:HIGH:log to draw it log-uniformly")
        low, high = (_parse_value(spec, part, text) for part in parts[:2])
        if not low < high:
            raise ConfigError(name, f"--param {shown(text)} is not allowed: LOW {low:g} must be below HIGH {high:g}")
        if scale == "log" and low <= 0:
            raise ConfigError(name, f"--param {shown(text)} is not allowed: a log range needs LOW above 0, e.g. "
                              f"{name}=1e-5:{high:g}:log")
        for bound in (low, high):
            if not spec.allows(bound):
                raise ConfigError(name, f"--param {shown(text)}: {name} {bound:g} is not allowed: use {spec.allowed}")
        return Range(name, low, high, scale == "log")
    items = [item for item in values.split(",") if item.strip()]
    if not items:
        raise ConfigError(name, f"--param {shown(text)} lists no value: give e.g. {name}=A,B")
    if len(items) > MAX_CHOICES:
        raise ConfigError(name, f"--param {shown(text)} lists {len(items)} values, more than the {MAX_CHOICES} "
                          "allowed")
    parsed = list(dict.fromkeys(_parse_value(spec, item, text) for item in items))
    for value in parsed:
        if spec.kind is not str and not spec.allows(value):
            raise ConfigError(name, f"--param {shown(text)}: {name} {_value_text(value)} is not allowed: use "
                              f"{spec.allowed}")
    return Choices(name, tuple(parsed))


def devices_for_strategy(base: RunConfig, strategy: str) -> tuple[str, ...]:
    """The devices a trial of ``strategy`` trains on, as a sweep gives them (control/lifecycle.sweep_configs): a
    one-device strategy (and DataParallel on CPU, a pass-through there) the first device, the others all."""
    known = find(strategy)
    one_device = known is not None and (known.one_device or (known.scatters_batch and not base.uses_cuda))
    return base.devices[:1] if one_device else base.devices


def trial_config(base: RunConfig, values: dict[str, Any]) -> RunConfig:
    """The base config with a trial's values, on the devices its strategy uses; ConfigError where they cannot run
    together (or with the base)."""
    changes = dict(values)
    if "strategy" in changes:
        changes["devices"] = devices_for_strategy(base, changes["strategy"])
    return base.replace(**changes)


def described(values: dict[str, Any]) -> str:
    """'lr=0.003, batch_size=64' for messages."""
    return ", ".join(f"{name}={_value_text(value)}" for name, value in values.items())


def combinations(params: tuple[Param, ...]) -> list[dict[str, Any]]:
    """Every combination of the values each parameter is checked at (a range's two ends, every choice)."""
    names = [p.name for p in params]
    return [dict(zip(names, picked)) for picked in itertools.product(*(p.values_to_check() for p in params))]


def combination_count(params: tuple[Param, ...]) -> int:
    return math.prod(len(p.values_to_check()) for p in params) if params else 0


def check_space(base: RunConfig, space: SearchSpace) -> SearchSpace:
    """The space, checked as a launch checks a config, before anything starts: its own settings, then every value
    of every parameter with the base, then (up to ``MAX_COMBINATIONS_CHECKED``) every combination of them, so no
    trial can draw values that will not run. A speed search keeps the combinations that run and notes the others.
    Returns the space with its notes (trials capped to a grid's size, combinations set aside)."""
    notes: list[str] = []
    _check_settings(space)
    for param in space.params:
        for value in param.values_to_check():
            try:
                trial_config(base, {param.name: value})
            except ConfigError as exc:
                raise ConfigError(exc.field, f"--param {param.text}: {param.name}={_value_text(value)} cannot run: "
                                  f"{exc}") from None
    if space.kind == "hyper" and combination_count(space.params) <= MAX_COMBINATIONS_CHECKED:
        for values in combinations(space.params):
            try:
                trial_config(base, values)
            except ConfigError as exc:
                raise ConfigError(exc.field, f"the values {described(values)} cannot run together: {exc}; narrow "
                                  "the ranges or choices") from None
    elif space.kind == "hyper":
        notes.append(f"{combination_count(space.params):,} combinations of the values' ends: each value was checked "
                     "with the base config, not every combination.")
    trials = space.trials
    if space.sampler == "grid" or space.kind == "speed":
        size = combination_count(space.params)
        if trials > size:
            notes.append(f"{size} combination(s) in the grid: {trials} trials asked, {size} run.")
            trials = size
    return replace(space, trials=trials, notes=tuple(notes))


def _check_settings(space: SearchSpace) -> None:
    def refuse(field_name: str, message: str) -> None:
        raise ConfigError(field_name, message)

    if space.kind not in KINDS:
        refuse("kind", f"search kind {shown(space.kind)} is not allowed: choose one of {', '.join(KINDS)}")
    if space.objective not in OBJECTIVES:
        refuse("objective", f"--objective {shown(space.objective)} is not allowed: choose one of {', '.join(OBJECTIVES)}")
    if space.sampler not in SAMPLERS:
        refuse("sampler", f"--sampler {shown(space.sampler)} is not allowed: choose one of {', '.join(SAMPLERS)}")
    if space.pruner not in PRUNERS:
        refuse("pruner", f"--pruner {shown(space.pruner)} is not allowed: choose one of {', '.join(PRUNERS)}")
    for name, value, low, high in (("trials", space.trials, 1, MAX_TRIALS), ("at_once", space.at_once, 1, MAX_AT_ONCE),
                                   ("timed_steps", space.timed_steps, 1, 1_000_000), ("seed", space.seed, 0, 2**31 - 1)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            refuse(name, f"--{name.replace('_', '-')} {shown(value)} is not allowed: use a whole number from {low} to "
                   f"{high}")
    if isinstance(space.timeout_s, bool) or not isinstance(space.timeout_s, (int, float)) or not (
            math.isfinite(space.timeout_s) and space.timeout_s >= 0):
        refuse("timeout_s", f"--timeout-s {shown(space.timeout_s)} is not allowed: give seconds from 0 (0: no wall-time "
               "budget)")
    if not isinstance(space.target_acc, (int, float)) or not 0 < space.target_acc <= 1:  # also refuses nan
        refuse("target_acc", f"--target-acc {shown(space.target_acc)} is not allowed: give a validation accuracy in "
               "(0, 1], e.g. 0.9")
    if not space.params:
        refuse("param", "a search needs at least one --param NAME=LOW:HIGH or NAME=A,B,C, e.g. lr=1e-4:1e-1:log")
    if len(space.params) > MAX_PARAMS:
        refuse("param", f"a search varies at most {MAX_PARAMS} fields, got {len(space.params)}")
    repeated = [name for name in space.names if space.names.count(name) > 1]
    if repeated:
        refuse("param", f"--param {repeated[0]} is given twice: give each field once")
    if space.sampler == "grid" and any(isinstance(p, Range) for p in space.params):
        first = next(p for p in space.params if isinstance(p, Range))
        refuse("sampler", f"--sampler grid tries every combination of choices; --param {first.text} is a range: give "
               f"its values as choices ({first.name}=A,B,C) or use --sampler tpe or random")
    if space.pruner != "none":
        if len(space.directions) > 1:
            refuse("pruner", f"--pruner {space.pruner} is not allowed with --objective {space.objective}: Optuna prunes "
                   "single-objective studies only; use --pruner none")
        if space.objective == "time_to_acc":
            refuse("pruner", "--pruner is not allowed with --objective time_to_acc: a trial's time to the target is "
                   "known only once it is reached; prune on val_acc instead, or use --pruner none")
        if space.kind == "speed":
            refuse("pruner", "a speed search's trials are short timed runs, each measured whole: use --pruner none")
    if space.kind == "speed":
        if space.objective != "images_per_s":
            refuse("objective", f"a speed search looks for the most images/s: --objective {space.objective} is not "
                   "allowed there (use images_per_s, or a hyperparameter search)")
        ranged = [p for p in space.params if isinstance(p, Range)]
        if ranged:
            refuse("param", f"a speed search tries each combination of choices; --param {ranged[0].text} is a range: "
                   f"give its values as choices ({ranged[0].name}=A,B,C)")
        if any(p.name == "epochs" for p in space.params):
            refuse("param", "a speed search sets each trial's epochs itself (a warm-up epoch, then --timed-steps "
                   "steps): leave epochs out")


def epoch_figure(space: SearchSpace, epoch: dict[str, Any]) -> float | None:
    """What a trial reports to its study after an epoch, for the pruner: the epoch's validation accuracy, or its
    images/s where the search looks for speed; None where the epoch has none."""
    value = epoch.get("images_per_s" if space.objective == "images_per_s" else "val_acc")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def objective_values(space: SearchSpace, epochs: list[dict[str, Any]]) -> tuple[float, ...] | None:
    """A finished trial's values from its epochs (in order), one per direction; None where an epoch it needs
    is missing (no epoch with a validation accuracy, or no images/s). images/s leaves the first epoch out where
    there are more (it carries the warm-up: compile, caches), as a speed trial's answer must; time_to_acc is
    infinite where the target was never reached."""
    accuracies = [e["val_acc"] for e in epochs if isinstance(e.get("val_acc"), (int, float))]
    measured = epochs[1:] if len(epochs) > 1 else epochs
    speeds = [e["images_per_s"] for e in measured if isinstance(e.get("images_per_s"), (int, float))]
    best_acc = max(accuracies) if accuracies else None
    speed = sum(speeds) / len(speeds) if speeds else None
    if space.objective == "val_acc":
        return None if best_acc is None else (float(best_acc),)
    if space.objective == "images_per_s":
        return None if speed is None else (float(speed),)
    if space.objective == "acc_and_speed":
        return None if best_acc is None or speed is None else (float(best_acc), float(speed))
    elapsed_s = 0.0
    for epoch in epochs:
        elapsed_s += float(epoch.get("epoch_time_s") or 0.0)
        if isinstance(epoch.get("val_acc"), (int, float)) and epoch["val_acc"] >= space.target_acc:
            return (elapsed_s,)
    return None if best_acc is None else (math.inf,)
