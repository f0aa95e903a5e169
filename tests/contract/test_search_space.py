"""A search's space read from the words of ``--param`` and checked as a launch checks a config, before anything
starts: each value with the base config, every combination of them, and the settings that cannot go together;
and a trial's objective read from its epochs.

    .venv/bin/python -m pytest tests/contract/test_search_space.py -q
"""

from __future__ import annotations

import math

import pytest

from contract.config import ConfigError, RunConfig
from contract.search_space import (SEARCHABLE, Choices, Range, SearchSpace, check_space, epoch_figure,
                                   objective_values, parse_param, trial_config)

TWO_CPU = RunConfig(strategy="ddp", devices=("cpu", "cpu"))


def space(*params: str, **settings) -> SearchSpace:
    return SearchSpace(params=tuple(parse_param(p) for p in params), **settings)


def test_ranges_and_choices_are_read_as_the_flags_read_their_values():
    assert parse_param("lr=1e-4:1e-1:log") == Range("lr", 1e-4, 1e-1, log=True)
    assert parse_param("batch-size=32,64,32") == Choices("batch_size", (32, 64))
    assert parse_param("channels_last=false,on") == Choices("channels_last", (False, True))
    assert parse_param("accumulate_steps=1:8") == Range("accumulate_steps", 1, 8)
    assert parse_param("optimizer=adam,sgd") == Choices("optimizer", ("adam", "sgd"))
    searched = space("lr=1e-4:1e-1:log", "batch_size=32,64", pruner="median", trials=8, at_once=2)
    assert SearchSpace.from_dict(searched.to_dict()) == searched


@pytest.mark.parametrize("text, said", [
    ("lr", "give NAME=LOW:HIGH[:log] or NAME=A,B,C"),
    ("devices=cpu", "'devices' is not a field a search may vary; allowed: " + ", ".join(SEARCHABLE)),
    ("lr=0:1:log", "a log range needs LOW above 0"),
    ("lr=0.1:0.01", "LOW 0.1 must be below HIGH 0.01"),
    ("lr=-1:1", "lr -1 is not allowed: use a finite number above 0"),
    ("weight_decay=0:2", "weight_decay 2 is not allowed: use a number in [0.0, 1.0]"),
    ("batch_size=0,32", "batch_size 0 is not allowed: use a whole number from 1 to 65536"),
    ("batch_size=big", "batch_size 'big' is not allowed: give a whole number"),
    ("compile=maybe", "compile 'maybe' is not allowed: give true or false"),
    ("lr=1e-3:1e-2:cubic", "a range is lr=LOW:HIGH, or lr=LOW:HIGH:log"),
    ("epochs=", "lists no value"),
])
def test_a_bad_param_is_refused_in_one_line_naming_it(text, said):
    with pytest.raises(ConfigError) as refused:
        parse_param(text)
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_every_value_is_checked_with_the_base_as_a_launch_checks_it():
    with pytest.raises(ConfigError, match=r"batch_size=3 cannot run: batch_size 3 .* divide evenly over 2 DDP"):
        check_space(TWO_CPU, space("batch_size=3,4"))
    with pytest.raises(ConfigError, match="optimizer 'lion' is not allowed: choose one of adam, adamw, sgd"):
        check_space(TWO_CPU, space("optimizer=adam,lion"))


def test_values_that_each_run_but_not_together_are_refused_naming_the_combination():
    # accumulation steps run, and so does a pipeline, but a pipeline accumulates over its microbatches itself
    with pytest.raises(ConfigError, match=r"the values strategy=pp, accumulate_steps=4 cannot run together"):
        check_space(TWO_CPU, space("strategy=ddp,pp", "accumulate_steps=1,4"))


def test_a_trials_strategy_takes_the_devices_a_sweep_gives_it():
    assert trial_config(TWO_CPU, {"strategy": "single"}).devices == ("cpu",)
    assert trial_config(TWO_CPU, {"strategy": "fsdp"}).devices == ("cpu", "cpu")


@pytest.mark.parametrize("settings, said", [
    ({"pruner": "median", "objective": "acc_and_speed"}, "Optuna prunes single-objective studies only"),
    ({"pruner": "median", "objective": "time_to_acc"}, "time to the target is known only once it is reached"),
    ({"sampler": "grid"}, "--param lr=0.0001:0.1:log is a range"),
    ({"kind": "speed", "objective": "images_per_s"}, "a speed search tries each combination of choices"),
    ({"trials": 0}, "--trials 0 is not allowed: use a whole number from 1 to 10000"),
    ({"at_once": 65}, "--at-once 65 is not allowed"),
    ({"target_acc": math.nan}, "--target-acc nan is not allowed"),
    ({"objective": "loss"}, "--objective 'loss' is not allowed: choose one of val_acc, images_per_s"),
])
def test_settings_that_cannot_go_together_are_refused_before_anything_starts(settings, said):
    with pytest.raises(ConfigError) as refused:
        check_space(TWO_CPU, space("lr=1e-4:1e-1:log", **settings))
    assert said in str(refused.value)


def test_a_grid_runs_each_combination_once_whatever_the_trials_asked():
    checked = check_space(TWO_CPU, space("batch_size=32,64", "optimizer=adam,sgd", sampler="grid", trials=20))
    assert checked.trials == 4
    assert checked.notes == ("4 combination(s) in the grid: 20 trials asked, 4 run.",)


EPOCHS = [{"epoch": 1, "val_acc": 0.5, "images_per_s": 40.0, "epoch_time_s": 10.0},
          {"epoch": 2, "val_acc": 0.9, "images_per_s": 100.0, "epoch_time_s": 5.0},
          {"epoch": 3, "val_acc": 0.8, "images_per_s": 110.0, "epoch_time_s": 5.0}]


def test_a_trials_objective_comes_from_its_epochs():
    assert objective_values(SearchSpace(objective="val_acc"), EPOCHS) == (0.9,)
    assert objective_values(SearchSpace(objective="images_per_s"), EPOCHS) == (105.0,)  # the warm-up epoch left out
    assert objective_values(SearchSpace(objective="acc_and_speed"), EPOCHS) == (0.9, 105.0)
    assert objective_values(SearchSpace(objective="time_to_acc", target_acc=0.85), EPOCHS) == (15.0,)
    assert objective_values(SearchSpace(objective="time_to_acc", target_acc=0.95), EPOCHS) == (math.inf,)
    assert objective_values(SearchSpace(objective="val_acc"), []) is None
    assert epoch_figure(SearchSpace(objective="images_per_s"), EPOCHS[0]) == 40.0
    assert epoch_figure(SearchSpace(objective="time_to_acc"), EPOCHS[0]) == 0.5
