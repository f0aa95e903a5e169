"""What the SDK makes of what a training script passes: a config of any value stored as JSON holds it (the rest as
its text), steps the database can hold and nothing else, and texts from non-UTF-8 arguments stored with their odd
bytes escaped, never raised later as an encoding error.

    .venv/bin/python -m pytest tests/parallax/test_values.py -q
"""

from __future__ import annotations

import argparse
import collections.abc
import datetime
import enum
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from parallax.script_run import Config
from parallax.values import MAX_STEP, as_config, as_step, as_values, storable_text


class Optimizer(enum.Enum):
    ADAM = "adam"


class Width(enum.IntEnum):
    WIDE = 64


class Mode(str, enum.Enum):
    FAST = "fast"


class Unprintable:
    def __str__(self):
        raise RuntimeError("no text")


def test_a_config_of_any_value_is_stored_as_json_holds_it():
    nested = argparse.Namespace(data=Path("/data/cats"), depth=3)
    config = {"data": Path("/data/x"), "optimizer": Optimizer.ADAM, "width": Width.WIDE, "mode": Mode.FAST,
              "sizes": (32, 64), "lr": np.float32(0.5), "epochs": np.int64(3), "flag": np.bool_(True),
              "weights": np.arange(3), "big": np.zeros(5000), "scale": torch.tensor(2.0), "mean": torch.ones(2),
              "nan": float("nan"), "inf": np.float64("inf"), "tags": {"a"}, 7: "seven", "model": nested,
              "when": datetime.date(2026, 1, 2), "raw": b"\xff", "odd": Unprintable(), "fine": {"x": [1, None]}}
    config["itself"] = config
    stored = as_config(config)
    assert json.loads(json.dumps(stored, allow_nan=False)) == stored  # strict JSON, and unchanged by a round trip
    assert stored == {
        "data": "/data/x", "optimizer": "Optimizer.ADAM", "width": 64, "mode": "fast", "sizes": [32, 64], "lr": 0.5,
        "epochs": 3, "flag": True, "weights": [0, 1, 2], "big": str(np.zeros(5000)), "scale": 2.0,
        "mean": [1.0, 1.0], "nan": "nan", "inf": "inf", "tags": ["a"], "7": "seven",
        "model": {"data": "/data/cats", "depth": 3}, "when": "2026-01-02", "raw": "b'\\xff'", "odd": "<Unprintable>",
        "fine": {"x": [1, None]}, "itself": "{...}"}


class Unresolved(collections.abc.Mapping):
    """A mapping whose values cannot all be read (as a Hydra config with a missing value)."""

    def __getitem__(self, key):
        raise KeyError(f"{key}: missing mandatory value")

    def __iter__(self):
        return iter(["lr"])

    def __len__(self):
        return 1


class Unlistable(list):
    def __iter__(self):
        raise RuntimeError("cannot be listed now")


def test_a_config_no_json_writer_could_write_as_it_is_is_stored_too_and_nothing_is_dropped():
    config = {"seed": 10**5000, "hydra": Unresolved(), "half": Unlistable([1]), 1: "the int key", "1": "the text key",
              None: "no key", "None": "the word"}
    stored = as_config(config)
    assert json.loads(json.dumps(stored, allow_nan=False)) == stored
    assert stored["seed"] == "<int of 16610 bits>"
    assert stored["hydra"].startswith("<tests.parallax.test_values.Unresolved object") and stored["half"] == "[1]"
    assert {stored["1"], stored["1 (int)"], stored["None"], stored["None (NoneType)"]} == {
        "the int key", "the text key", "no key", "the word"}
    assert (stored["1"], stored["None"]) == ("the text key", "the word")  # a text key keeps its own name


def test_a_config_changed_while_it_is_taken_is_taken_whole():
    """The writer's thread takes the config while the script's thread may set a value: here a value whose text
    sets another, as that thread would between two of the items."""
    config = Config({"lr": 0.1})

    class SetsAnother:
        def __str__(self):
            config["added"] = 1
            return "sets another"

    config.odd = SetsAnother()
    assert config.take_change() == {"lr": 0.1, "odd": "sets another"}
    assert config.take_change() == {"lr": 0.1, "odd": "sets another", "added": 1}  # the change it made comes next


def test_run_config_changes_are_taken_as_json_holds_them():
    config = Config({"lr": 0.1})
    config.data = Path("/data/y")
    assert config.take_change() == {"lr": 0.1, "data": "/data/y"}
    assert config.data == Path("/data/y")  # the script reads back what it set


@pytest.mark.parametrize("step, error, words", [
    (2**63, ValueError, "step=9223372036854775808 is larger than the database holds: give a step from 0 to "
     "9223372036854775807"),
    (10**30, ValueError, "is larger than the database holds"),
    (-1, ValueError, "step=-1 is negative"),
    (1.5, TypeError, "step=1.5 is not a whole number"),
    (float("nan"), TypeError, "step=nan is not a whole number"),
    (np.float64(2.0), TypeError, "is not a whole number"),
    ("3", TypeError, "step='3' is not a whole number"),
])
def test_a_step_the_database_cannot_hold_is_refused_in_one_line(step, error, words):
    with pytest.raises(error, match=words) as refused:
        as_step(step)
    assert "\n" not in str(refused.value)


def test_the_steps_it_holds_are_taken():
    assert [as_step(s) for s in (0, MAX_STEP, np.int64(7), True)] == [0, MAX_STEP, 7, 1]


def test_a_value_beyond_a_float_is_refused_naming_it():
    with pytest.raises(ValueError, match="'huge' is 1000000000"):
        as_values({"huge": 10**400})
    with pytest.raises(ValueError, match=r"'huger' is an int of 16610 bits, larger than a float holds \(about 1.8e308\)"):
        as_values({"huger": 10**5000})  # past the digits Python writes an int in
    with pytest.raises(ValueError, match=r"step=an int of 16610 bits is larger than the database holds"):
        as_step(10**5000)


@pytest.mark.parametrize("text, stored", [
    ("caf\udce9", "caf\\xe9"), ("a\x00b", "a\\x00b"), ("x\ud800y", "x\\ud800y"), ("café", "café"), ("loss", "loss"),
])
def test_text_from_a_non_utf8_argument_is_stored_with_its_odd_bytes_escaped(text, stored):
    assert storable_text(text) == stored
    assert storable_text(text).encode("utf-8")
    assert as_values({text: 1.0}) == {stored: 1.0}
    assert as_config({text: text}) == {stored: stored}


def test_a_refused_call_leaves_the_step_count_as_it_was(parallax_home):
    import parallax

    with parallax.init(project="p", mode="disabled") as run:
        parallax.log({"a": 1.0})
        with pytest.raises(TypeError, match="'a' is str"):
            parallax.log({"a": "x"}, step=50)
        with pytest.raises(ValueError, match="larger than the database holds"):
            parallax.log({"a": 1.0}, step=2**63)
        parallax.log({"a": 2.0})
        assert run._next_step == 2
        parallax.log({"a": 3.0}, step=MAX_STEP)
        with pytest.raises(ValueError, match="step=9223372036854775808 is larger"):
            parallax.log({"a": 4.0})  # counted on past the last step the database holds
