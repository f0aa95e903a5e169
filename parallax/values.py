"""What ``parallax.log`` accepts: {name: number}, nested dicts flattened with "/"."""

from __future__ import annotations

from collections.abc import Mapping

ACCEPTED = "int, float, bool, a numpy number or a one-element tensor"


def as_step(step) -> int:
    """A step given to ``log``: a whole number of 0 or more."""
    try:
        value = step.__index__()
    except AttributeError:
        raise TypeError(f"parallax.log: step={step!r} is not a whole number; give an int of 0 or more, "
                        "or leave it out to count on from the last one") from None
    if value < 0:
        raise ValueError(f"parallax.log: step={value} is negative; steps count from 0")
    return value


def as_values(data: Mapping, prefix: str = "") -> dict[str, float]:
    """``data`` as {name: float}; anything else is refused in one line naming the key and its type."""
    if not isinstance(data, Mapping):
        raise TypeError(f"parallax.log takes a dict of {{name: number}}, not {type(data).__name__}")
    values: dict[str, float] = {}
    for name, value in data.items():
        if type(name) is not str:
            raise TypeError(f"parallax.log: metric names are strings; got {name!r} ({type(name).__name__})")
        if type(value) is float:
            values[prefix + name] = value
        elif isinstance(value, Mapping):
            values.update(as_values(value, f"{prefix}{name}/"))
        else:
            values[prefix + name] = _as_float(prefix + name, value)
    return values


def _as_float(name: str, value) -> float:
    if isinstance(value, (str, bytes)) or value is None:
        raise TypeError(f"parallax.log: {name!r} is {type(value).__name__} {value!r:.40}; log numbers ({ACCEPTED}); "
                        "put text in run.config or run.summary")
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"parallax.log: {name!r} is a {type(value).__name__}, not a number ({ACCEPTED}); tables, "
                        "images, histograms and media are not supported") from None
