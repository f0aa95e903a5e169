"""Packing a series' values into chunks, and reducing them to what a chart draws: pure numpy, no database.

A chunk holds the values one series logged within one block of ``BLOCK_STEPS`` steps (``step //
BLOCK_STEPS``) that were written together, as three packed arrays (steps, seconds, values), with its
summary: how many values, how many finite, their minimum, maximum and sum, and the last one. A chart of a
million steps reads the summaries (``db.script_metrics``) and never unpacks a value; a window of few
enough steps unpacks its chunks and reduces them here (``reduce_window``).

    rows = pack(steps, t_s, values)            # [{"block", "first_step", "last_step", "points", ...}, ...]
    steps, t_s, values = unpack(rows[0])
    buckets = reduce_window(steps, t_s, values, first_step=0, width=10)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# Steps per block. A chart of about a thousand buckets reads summaries alone once a window spans more than
# a thousand blocks (128,000 steps); a narrower one unpacks at most that many values of each series.
BLOCK_STEPS = 128
STEP_TYPE, FLOAT_TYPE = np.dtype("<i8"), np.dtype("<f8")
BUCKET_FIELDS = ("step", "t_s", "value", "min", "max", "n", "nonfinite")


def pack(steps: Sequence[int], t_s: Sequence[float], values: Sequence[float | None]) -> list[dict[str, Any]]:
    """One series' values (any order; None reads as NaN) as chunk rows: one per block they fall in, values in
    step order (equal steps in the order given), times to the millisecond."""
    step_array = np.asarray(steps, dtype=STEP_TYPE)
    t_array = np.round(np.asarray(t_s, dtype=FLOAT_TYPE), 3)
    value_array = np.asarray(values, dtype=FLOAT_TYPE)  # None becomes NaN
    if not len(step_array):
        return []
    if len(step_array) > 1 and np.any(step_array[1:] < step_array[:-1]):
        order = np.argsort(step_array, kind="stable")
        step_array, t_array, value_array = step_array[order], t_array[order], value_array[order]
    blocks = step_array // BLOCK_STEPS
    starts = np.concatenate(([0], np.flatnonzero(blocks[1:] != blocks[:-1]) + 1))
    ends = np.concatenate((starts[1:], [len(step_array)]))
    finite = np.isfinite(value_array)
    usable = np.where(finite, value_array, np.nan)
    with np.errstate(invalid="ignore"):  # a block of NaN only: its minimum is NaN, stored as NULL
        minima, maxima = np.fmin.reduceat(usable, starts), np.fmax.reduceat(usable, starts)
    counts = np.add.reduceat(finite.astype(np.int64), starts)
    totals = np.add.reduceat(np.where(finite, value_array, 0.0), starts)
    rows = []
    for index, (start, end) in enumerate(zip(starts.tolist(), ends.tolist())):
        chunk_steps = step_array[start:end]
        first, last = int(chunk_steps[0]), int(chunk_steps[-1])
        consecutive = last - first + 1 == end - start and bool(np.all(np.diff(chunk_steps) == 1))
        last_value = float(value_array[end - 1])
        rows.append({
            "block": int(blocks[start]), "first_step": first, "last_step": last, "points": end - start,
            "finite": int(counts[index]), "min_value": _finite_or_none(minima[index]),
            "max_value": _finite_or_none(maxima[index]),
            "total_value": float(totals[index]) if counts[index] else None,
            "last_value": last_value if np.isfinite(last_value) else None, "last_t_s": float(t_array[end - 1]),
            "steps": None if consecutive else chunk_steps.tobytes(), "t_s": t_array[start:end].tobytes(),
            "values": value_array[start:end].tobytes(),
        })
    return rows


def unpack(row: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A chunk row's (steps, seconds, values) arrays."""
    values = np.frombuffer(row["values"], dtype=FLOAT_TYPE)
    if row["steps"] is None:
        steps = np.arange(row["first_step"], row["first_step"] + len(values), dtype=STEP_TYPE)
    else:
        steps = np.frombuffer(row["steps"], dtype=STEP_TYPE)
    return steps, np.frombuffer(row["t_s"], dtype=FLOAT_TYPE), values


def unpack_all(rows: Sequence[Mapping[str, Any]], first_step: int | None = None, last_step: int | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The chunks' values together, in step order (chunks in the order given where steps are equal), kept
    to [first_step, last_step] where given."""
    parts = [unpack(row) for row in rows]
    if not parts:
        return (np.empty(0, STEP_TYPE), np.empty(0, FLOAT_TYPE), np.empty(0, FLOAT_TYPE))
    steps, t_s, values = (np.concatenate([part[i] for part in parts]) for i in range(3))
    order = np.argsort(steps, kind="stable")
    steps, t_s, values = steps[order], t_s[order], values[order]
    if first_step is not None or last_step is not None:
        inside = (steps >= (first_step if first_step is not None else steps.min())) & (
            steps <= (last_step if last_step is not None else steps.max()))
        steps, t_s, values = steps[inside], t_s[inside], values[inside]
    return steps, t_s, values


def reduce_window(steps: np.ndarray, t_s: np.ndarray, values: np.ndarray, *, first_step: int, width: int
                  ) -> list[dict[str, Any]]:
    """Values in step order reduced to buckets of ``width`` steps from ``first_step``: each bucket's last value
    (at its last step and time), its minimum and maximum over the finite values (None where none is finite),
    how many values it holds (``n``) and how many of them are NaN or infinite (``nonfinite``)."""
    if not len(steps):
        return []
    reduced = reduce_runs((steps - first_step) // width, values)
    return [{"step": int(steps[end]), "t_s": float(t_s[end]), "value": _finite_or_none(values[end]),
             "min": low, "max": high, "n": count, "nonfinite": bad} for end, low, high, count, bad in reduced]


def reduce_runs(buckets: np.ndarray, values: np.ndarray) -> list[tuple[int, float | None, float | None, int, int]]:
    """``values`` grouped by runs of equal ``buckets`` (in order): for each run, the index of its last value, its
    minimum and maximum over the finite values (None where none is), its count and how many are NaN or infinite."""
    if not len(values):
        return []
    starts = np.concatenate(([0], np.flatnonzero(buckets[1:] != buckets[:-1]) + 1))
    ends = np.concatenate((starts[1:], [len(values)])) - 1
    finite = np.isfinite(values)
    usable = np.where(finite, values, np.nan)
    with np.errstate(invalid="ignore"):
        minima, maxima = np.fmin.reduceat(usable, starts), np.fmax.reduceat(usable, starts)
    counts = np.diff(np.concatenate((starts, [len(values)])))
    nonfinite = counts - np.add.reduceat(finite.astype(np.int64), starts)
    return [(end, _finite_or_none(low), _finite_or_none(high), count, bad)
            for end, low, high, count, bad in zip(ends.tolist(), minima.tolist(), maxima.tolist(), counts.tolist(),
                                                  nonfinite.tolist())]


def _finite_or_none(value: float) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None
