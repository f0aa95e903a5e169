"""Repeats and statistics for the benchmarks: A/B alternation, summaries and targets.

    times = alternate({"plain": run_plain, "parallax": run_parallax}, repeats=5)
    summarize(times["parallax"])          # median, min, max, n
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable


def alternate(contenders: dict[str, Callable[[], Any]], repeats: int, *, label: str = "") -> dict[str, list[Any]]:
    """Run the contenders in turn, A B A B ..., ``repeats`` times each.

    Interleaving spreads slow drifts of the machine (another process waking up, thermal state,
    the page cache) over every contender instead of loading them onto whichever ran last."""
    results: dict[str, list[Any]] = {name: [] for name in contenders}
    for repeat in range(1, repeats + 1):
        for name, measure in contenders.items():
            started = time.perf_counter()
            results[name].append(measure())
            print(f"  {label}{name} #{repeat}: {time.perf_counter() - started:.1f} s", flush=True)
    return results


def timed_calls(function: Callable, record: Callable[[float], None]) -> Callable:
    """``function``, handing each call's wall seconds to ``record`` (also when it raises): for
    patching an engine function to see what its calls cost inside a real run."""
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            record(time.perf_counter() - start)
    return wrapper


def summarize(values: list[float]) -> dict[str, Any]:
    values = [float(v) for v in values]
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values), "values": values}


def pair_ratios(numerators: list[float], denominators: list[float]) -> list[float]:
    """Ratio of each A/B pair from the same round (the pair shares the machine's state)."""
    return [a / b for a, b in zip(numerators, denominators)]


@dataclass(frozen=True)
class Target:
    op: str       # "<=" or ">="
    limit: float
    unit: str = ""

    def met(self, value: float) -> bool:
        return value <= self.limit if self.op == "<=" else value >= self.limit

    @property
    def text(self) -> str:
        return f"{'≤' if self.op == '<=' else '≥'} {format_number(self.limit)}{self.unit}"


def at_most(limit: float, unit: str = "") -> Target:
    return Target("<=", limit, unit)


def at_least(limit: float, unit: str = "") -> Target:
    return Target(">=", limit, unit)


def format_number(value: float | None) -> str:
    if value is None:
        return "—"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    if magnitude >= 0.01:
        return f"{value:.3f}"
    return f"{value:.2g}"
