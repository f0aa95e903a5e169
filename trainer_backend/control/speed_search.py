"""The fastest settings that fit: a speed search's candidates (every combination of its knobs), judged by the
memory forecast before any is launched, and the short timed run each one trains.

    plan = plan_speed_search(base, space)       # the candidates that fit, with the forecast's peak per device
    plan.skipped                                # [(values, why)]: a rule they break, or the memory they need
    speed_epochs(config, timed_steps=200)       # a warm-up epoch, then enough epochs for the timed steps

The knobs are the search's own choices (``--param batch_size=64,128,256``), else the defaults here: the strategies
the devices allow, the batch at half, once and twice the base, channels_last off and on, and on GPUs AMP and
torch.compile off and on. The forecast is rank/forecast/'s (no GPU touched, no weights read); a configuration
it cannot estimate (a model whose layers do not run in sequence, cut into stages) is tried, and says so.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from contract.config import ConfigError, RunConfig
from contract.search_space import Choices, SearchSpace, combinations, described, trial_config
from contract.strategy_specs import STRATEGY_SPECS


@dataclass(frozen=True)
class Candidate:
    values: dict[str, Any]
    config: RunConfig
    forecast_mb: dict[str, float] = field(default_factory=dict)  # the forecast's peak per device (empty: none)
    note: str | None = None  # why it has no forecast


@dataclass(frozen=True)
class SpeedPlan:
    candidates: list[Candidate]
    skipped: list[tuple[dict[str, Any], str]]

    def notes(self) -> list[str]:
        """What the search says before its first trial: how many it tries, and each one set aside with why."""
        lines = [f"{len(self.candidates)} configuration(s) to time; {len(self.skipped)} skipped before launch."]
        lines += [f"Skipped {described(values)}: {why}" for values, why in self.skipped]
        lines += [f"{described(c.values)}: {c.note}" for c in self.candidates if c.note]
        return lines


def default_knobs(base: RunConfig) -> tuple[Choices, ...]:
    """What a speed search tries where it is not told: the strategies a new sweep offers on these devices, the
    batch at half, once and twice the base's, channels_last off and on, and on GPUs AMP and compile off and on
    (torch.compile takes half a minute or more to warm up on a CPU, longer than a short timed run)."""
    strategies = []
    for name, spec in STRATEGY_SPECS.items():
        if not spec.in_first_sweep:
            continue
        try:
            trial_config(base, {"strategy": name})
        except ConfigError:
            continue
        strategies.append(name)
    batches = tuple(dict.fromkeys(b for b in (base.batch_size // 2, base.batch_size, base.batch_size * 2) if b >= 1))
    knobs = [Choices("strategy", tuple(strategies or (base.strategy,))), Choices("batch_size", batches),
             Choices("channels_last", (False, True))]
    if base.uses_cuda:
        knobs += [Choices("amp", ("off", "auto")), Choices("compile", (False, True))]
    return tuple(knobs)


def with_default_knobs(base: RunConfig, space: SearchSpace) -> SearchSpace:
    """The space with the default knobs where it names none."""
    from dataclasses import replace

    return space if space.params else replace(space, params=default_knobs(base))


def plan_speed_search(base: RunConfig, space: SearchSpace) -> SpeedPlan:
    """Every combination of the knobs: those that cannot run (a rule of their strategy) or would not fit in the
    devices' free memory, as the forecast sees it, are skipped with the reason; the rest are the candidates, the
    base's own settings first (the default every other one is measured against), then in an order drawn from
    the search's seed, at most ``space.trials`` of them."""
    from trainer_backend.rank.forecast.memory_estimate import dataset_shape, estimate_memory, stored_data
    from trainer_backend.rank.forecast.free_memory import available_memory_mb, fits

    num_classes, in_chans = dataset_shape(base)
    stored = stored_data(base)
    free = available_memory_mb(base)
    candidates, skipped = [], []
    for values in combinations(space.params):
        try:
            config = trial_config(base, values)
        except ConfigError as exc:
            skipped.append((values, str(exc)))
            continue
        try:
            estimate = estimate_memory(config, num_classes=num_classes, in_chans=in_chans, stored=stored)
        except ValueError as exc:  # EstimateError: a model the forecast cannot cut into stages, say
            candidates.append(Candidate(values, config, note=f"not forecast ({exc}); timed all the same"))
            continue
        judged = fits(estimate, free)
        too_big = [f for f in judged if not f.fits]
        if too_big:
            skipped.append((values, "the memory forecast says it does not fit: "
                            + "; ".join(f"{f.device} {f.verdict}" for f in too_big)))
            continue
        candidates.append(Candidate(values, config, {d.label: round(d.total_mb, 1) for d in estimate.devices}))
    default = {name: getattr(base, name) for name in space.names}
    first = [c for c in candidates if c.values == default]
    rest = [c for c in candidates if c.values != default]
    random.Random(space.seed).shuffle(rest)
    return SpeedPlan((first + rest)[:space.trials], skipped)


def speed_epochs(config: RunConfig, timed_steps: int) -> int:
    """Epochs of a speed trial: one of warm-up (compile, caches, the allocator finding its sizes), then enough to
    hold ``timed_steps`` steps, from the dataset's image count less its validation share (an estimate: the run
    measures its own images/s whatever the count)."""
    from trainer_backend.datasets import inspect_dataset

    images = int(inspect_dataset(config.dataset).get("num_images") or 0)
    steps_per_epoch = max(1, math.ceil(images * (1 - config.val_fraction) / config.batch_size))
    return 1 + max(1, math.ceil(timed_steps / steps_per_epoch))
