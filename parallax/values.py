"""What ``parallax.log`` accepts ({name: number}, nested dicts flattened with "/", at a step the database can
hold), and what ``parallax.init`` stores of a config: what JSON can hold as it is, anything else as its text
(a Path, an enum, a datetime), as W&B does; numpy and torch values as the numbers or lists they hold.

    as_values({"train": {"loss": np.float32(0.3)}})      # {"train/loss": 0.30000001192092896}
    as_config({"data": Path("/d"), "sizes": (1, 2)})      # {"data": "/d", "sizes": [1, 2]}

Every text that reaches the database (names, tags, config) is made one it can hold (contract.printable's
``storable_text``): a byte that was not UTF-8 (a lone surrogate from ``sys.argv``) or a NUL is written as its
escape, never raised as an encoding error later.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from contract.printable import storable_text
from contract.storage import MAX_LOGGED_STEP

ACCEPTED = "int, float, bool, a numpy number or a one-element tensor"
MAX_STEP = MAX_LOGGED_STEP  # what the database holds
MAX_CONFIG_DEPTH = 32  # nested deeper (or a config that holds itself) is stored as text
MAX_ARRAY_ITEMS = 1000  # a larger array or tensor in a config is stored as its (summarised) text
MAX_CONVERTED_TEXT = 2000  # the text of a value JSON cannot hold, cut to this many characters


def as_step(step) -> int:
    """A step given to ``log``: a whole number from 0 to MAX_STEP (what the database holds)."""
    try:
        value = step.__index__()
    except (AttributeError, TypeError):
        raise TypeError(f"parallax.log: step={step!r:.40} is not a whole number; give an int of 0 or more, "
                        "or leave it out to count on from the last one") from None
    if value < 0:
        raise ValueError(f"parallax.log: step={value} is negative; steps count from 0")
    if value > MAX_STEP:
        raise ValueError(f"parallax.log: step={_number(value)} is larger than the database holds: give a step from 0 to "
                         f"{MAX_STEP} (2**63-1); nothing of this call was logged")
    return value


def as_values(data: Mapping, prefix: str = "") -> dict[str, float]:
    """``data`` as {name: float}; anything else is refused in one line naming the key and its type."""
    if not isinstance(data, Mapping):
        raise TypeError(f"parallax.log takes a dict of {{name: number}}, not {type(data).__name__}")
    values: dict[str, float] = {}
    for name, value in data.items():
        if type(name) is not str:
            raise TypeError(f"parallax.log: metric names are strings; got {name!r} ({type(name).__name__})")
        if not name.isascii() or "\x00" in name:
            name = storable_text(name)
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
    except OverflowError:  # an int beyond a float's range (10**400)
        raise ValueError(f"parallax.log: {name!r} is {_number(value):.40}, larger than a float holds (about "
                         "1.8e308)") from None
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"parallax.log: {name!r} is a {type(value).__name__}, not a number ({ACCEPTED}); tables, "
                        "images, histograms and media are not supported") from None


def _number(value) -> str:
    """An int as Python writes it, or its size where it has more digits than Python writes (4300 by default)."""
    return repr(value) if _writable(value) else f"an int of {int(value).bit_length()} bits"


def _writable(number: int) -> bool:
    """Whether Python (and so JSON's writer) writes ``number`` out: not past sys.get_int_max_str_digits()."""
    try:
        int.__repr__(number)
    except ValueError:
        return False
    return True


def as_config(config: Mapping) -> dict[str, Any]:
    """``config`` as JSON can hold it (see the module's docstring): never raises for a value it holds. Its
    items are taken at once (another thread may be setting one) and converted from that copy."""
    return _as_object(list(config.items()), 0, {id(config)})


def _key(key) -> str:
    return storable_text(key if type(key) is str else _text(key))


def _as_json(value, depth: int, inside: set[int]):
    """``value`` as JSON holds it; ``inside``: the containers being converted, so that one that holds itself
    is written as Python writes it ({...}), not followed."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        number = int(value)  # an IntEnum or another int subclass: the number
        return number if _writable(number) else f"<{_number(number)[3:]}>"  # too long for JSON's writer: its size
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else str(float(value))  # "nan", "inf": JSON has no such number
    if isinstance(value, str):
        return storable_text(str.__str__(value))  # a str enum's value, not its name
    mapping = isinstance(value, Mapping) or (type(value).__name__ == "Namespace" and hasattr(value, "__dict__"))
    if mapping or isinstance(value, (list, tuple, set, frozenset)):
        if id(value) in inside:
            return "{...}" if mapping else "[...]"
        if depth >= MAX_CONFIG_DEPTH:
            return _text(value)
        inside.add(id(value))
        try:
            if mapping:
                return _as_object(value.items() if isinstance(value, Mapping) else vars(value).items(), depth, inside)
            return [_as_json(item, depth + 1, inside) for item in value]
        except Exception:  # items that cannot be read (a mapping whose values fail to resolve): its text
            return _text(value)
        finally:
            inside.discard(id(value))
    if type(value).__module__.split(".")[0] in ("numpy", "torch") and hasattr(value, "tolist"):
        count = value.numel() if hasattr(value, "numel") else getattr(value, "size", None)
        if isinstance(count, int) and count <= MAX_ARRAY_ITEMS:
            try:
                return _as_json(value.tolist(), depth + 1, inside)
            except Exception:  # a tensor on a device that cannot be read now: its text
                pass
    return _text(value)


def _as_object(items, depth: int, inside: set[int]) -> dict[str, Any]:
    """A mapping's items as a JSON object. A key that is not text is written as its text; where that text is
    another key's, it is kept with its type added (``1`` beside ``"1"`` is ``"1 (int)"``), so nothing is lost."""
    pairs = sorted(items, key=lambda pair: type(pair[0]) is not str)  # text keys first: they keep their names
    converted: dict[str, Any] = {}
    for key, item in pairs:
        name = _key(key)
        while name in converted:
            name = f"{name} ({type(key).__name__})"
        converted[name] = _as_json(item, depth + 1, inside)
    return converted


def _text(value) -> str:
    try:
        text = str(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    if len(text) > MAX_CONVERTED_TEXT:
        text = text[:MAX_CONVERTED_TEXT - 1] + "…"
    return storable_text(text)
