"""The field catalogue is the one description of a run-config field: every field a user sets has an entry,
the command line's flags and the Launch form's widgets say what the entry says, and RunConfig enforces
exactly the entry's bounds and choices.

    .venv/bin/python -m pytest tests/test_fields.py -q
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import subprocess
import sys
import textwrap

import pytest

from tests.support import ROOT
from contract import config as config_module
from contract.config import STRATEGIES, ConfigError, RunConfig, shown
from contract.fields import FIELDS, SET_BY_LAUNCH, SET_BY_TORCHRUN, Field
from trainer_backend.control.cli import build_parser, flag_help
from ui.field_widgets import config_value, widget_spec

RUN_SUBCOMMANDS = ("run", "launch", "sweep", "estimate")
NUMBERS = [f for f in FIELDS.values() if f.kind in (int, float) and f.low is not None]
SIMPLE_NUMBERS = [f for f in NUMBERS if f.simple and f.high is not None]


def test_every_field_a_user_sets_has_one_entry_and_every_entry_is_a_field():
    settable = {f.name for f in dataclasses.fields(RunConfig)} - set(SET_BY_TORCHRUN) - set(SET_BY_LAUNCH)
    assert set(FIELDS) == settable
    assert all(name == spec.name for name, spec in FIELDS.items())


def test_every_entry_starts_from_runconfigs_default():
    defaults = RunConfig()
    wrong = {name: (spec.default, getattr(defaults, name)) for name, spec in FIELDS.items()
             if spec.default != getattr(defaults, name)}
    assert not wrong


def test_runconfig_takes_every_catalogued_default_from_the_catalogue_and_writes_none_itself():
    """Derived, not copied: RunConfig's class body defaults every catalogued field to ``_default(name)``, so the
    catalogue is the one place a default is written and the two cannot disagree."""
    source = inspect.getsource(RunConfig)
    body = ast.parse(textwrap.dedent(source)).body[0].body
    written = {node.target.id: node.value for node in body if isinstance(node, ast.AnnAssign) and node.value}
    assert set(FIELDS) <= set(written)
    copied = [name for name in FIELDS if ast.unparse(written[name]) != f"_default({name!r})"]
    assert not copied, f"RunConfig writes its own default for {copied}: take the catalogue's"


def test_every_special_rule_names_what_in_config_holds_it():
    for spec in FIELDS.values():
        if spec.check is not None:
            assert hasattr(config_module, spec.check), f"{spec.name}: config.{spec.check} does not exist"
    assert FIELDS["strategy"].registry == "strategies"


def test_every_entry_has_a_one_sentence_help_and_a_label():
    for spec in FIELDS.values():
        assert spec.label and spec.help.endswith("."), spec.name
        assert spec.help.replace("e.g. ", "").count(". ") == 0, f"{spec.name}: one sentence, got {spec.help!r}"


# --- the command line -------------------------------------------------------------------------


def subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: sub.choices[name] for name in RUN_SUBCOMMANDS}


@pytest.mark.parametrize("command", RUN_SUBCOMMANDS)
def test_every_entry_is_a_flag_with_its_help_bounds_choices_and_parser(command):
    actions = {option: action for action in subcommand_parsers()[command]._actions for option in action.option_strings}
    for spec in FIELDS.values():
        action = actions.get(spec.flag)
        assert action is not None, f"{command} has no {spec.flag}"
        assert action.dest == spec.name and action.default is None  # only typed flags override --config
        assert action.help.replace("%%", "%").startswith(spec.help.rstrip(".")), spec.name
        if spec.kind is bool:
            assert isinstance(action, argparse.BooleanOptionalAction) and f"--no-{spec.flag[2:]}" in actions
            continue
        assert action.type is spec.parse, spec.name
        if spec.registry == "strategies":
            assert action.choices == list(STRATEGIES)
        else:
            assert action.choices == (list(spec.choices) if spec.choices is not None else None), spec.name
        if spec in NUMBERS and spec.high is not None:
            assert spec.allowed in action.help, f"{spec.flag} does not state its bounds: {action.help!r}"


def test_help_lists_every_flag_with_its_help():
    """As a user reads it: the real command, wrapped by argparse."""
    result = subprocess.run([sys.executable, "-m", "trainer_backend", "run", "--help"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    words = " ".join(result.stdout.split())
    for spec in FIELDS.values():
        assert spec.flag in words
        assert " ".join(flag_help(spec).replace("%%", "%").split()) in words, spec.flag


def test_a_tags_flag_reaches_the_config_as_its_tags():
    from trainer_backend.control.cli import config_from_args

    args = build_parser().parse_args(["run", "--tags", "a, b,,c", "--epochs", "2", "--no-compile"])
    config = config_from_args(args)
    assert config.tags == ("a", "b", "c") and config.epochs == 2 and config.compile is False


# --- validation enforces the catalogue ----------------------------------------------------------


def refusal(spec: Field, value) -> str:
    verb = "choose" if spec.choices is not None else "use"
    return f"{spec.name} {shown(value)} is not allowed: {verb} {spec.allowed}"


def just_outside_and_inside(spec: Field) -> list[tuple[object, bool]]:
    """Values around each bound, with whether the catalogue allows them."""
    if spec.kind is int:
        values = [(spec.low - 1, False), (spec.low, True)]
        return values + ([(spec.high, True), (spec.high + 1, False)] if spec.high is not None else [])
    nudge = 1e-9 * max(1.0, abs(spec.high or 1.0))
    values = [(spec.low, not spec.low_open), (spec.low - nudge, False), (spec.low + nudge, True)]
    if spec.high is not None:
        values += [(spec.high, not spec.high_open), (spec.high + nudge, False), (spec.high - nudge, True)]
    return values


@pytest.fixture
def roomy_machine(monkeypatch):
    """Room for 64 loader workers, so the process limit does not hide num_workers' own bound."""
    monkeypatch.setenv("PARALLAX_MAX_CPU_PROCESSES", "4096")


@pytest.mark.parametrize("spec", NUMBERS, ids=lambda s: s.name)
def test_a_number_just_outside_its_bounds_is_refused_and_just_inside_is_taken(spec, roomy_machine):
    for value, allowed in just_outside_and_inside(spec):
        changes = {spec.name: value}
        if spec.name == "warmup_epochs":
            changes["epochs"] = 5
        assert spec.allows(value) is allowed, (spec.name, value)
        if allowed:
            assert getattr(RunConfig(**changes), spec.name) == value
            continue
        with pytest.raises(ConfigError) as refused:
            RunConfig(**changes)
        assert refused.value.field == spec.name
        if spec.simple:  # the others word their own rule (config.<check>)
            assert str(refused.value) == refusal(spec, value)


# Taken however large: a learning rate that makes a run diverge is one a user may want (it is warned of).
UNBOUNDED_ABOVE = {"lr"}


def test_every_simple_number_has_both_bounds_but_the_learning_rate():
    assert {s.name for s in NUMBERS if s.simple} - UNBOUNDED_ABOVE == {s.name for s in SIMPLE_NUMBERS}
    assert all(FIELDS[name].high is None and FIELDS[name].low_open for name in UNBOUNDED_ABOVE)


@pytest.mark.parametrize("spec", [f for f in FIELDS.values() if f.simple and f.kind is not bool and f.choices],
                         ids=lambda s: s.name)
def test_a_choice_outside_the_list_is_refused_with_the_list(spec):
    with pytest.raises(ConfigError) as refused:
        RunConfig(**{spec.name: "nonsense"})
    assert refused.value.field == spec.name and str(refused.value) == refusal(spec, "nonsense")
    assert getattr(RunConfig(**{spec.name: spec.default}), spec.name) == spec.default


@pytest.mark.parametrize("spec", [f for f in FIELDS.values() if f.kind is bool], ids=lambda s: s.name)
def test_a_switch_takes_true_or_false_only(spec):
    assert spec.simple
    for value in (True, False):
        assert getattr(RunConfig(**{spec.name: value}), spec.name) is value
    with pytest.raises(ConfigError) as refused:
        RunConfig(**{spec.name: 1})
    assert str(refused.value) == refusal(spec, 1)


# --- the Launch form ----------------------------------------------------------------------------


def test_a_number_widget_has_the_catalogues_label_key_help_and_step_and_no_clamping_bounds():
    kind, kwargs = widget_spec(FIELDS["epochs"], 3)
    assert kind == "number_input"
    assert kwargs == {"label": "Epochs", "key": "epochs", "value": 3, "step": 1,
                      "help": "Passes over the training images (a whole number from 1 to 10000)."}
    kind, kwargs = widget_spec(FIELDS["lr"], 1e-3)
    assert kwargs["format"] == "%g" and isinstance(kwargs["value"], float) and isinstance(kwargs["step"], float)
    kind, kwargs = widget_spec(FIELDS["warmup_epochs"], 0)
    assert isinstance(kwargs["value"], float) and kwargs["help"] == FIELDS["warmup_epochs"].help


def test_a_choice_widget_is_a_selectbox_of_the_catalogues_list_at_the_value():
    kind, kwargs = widget_spec(FIELDS["val_from"], "train")
    assert kind == "selectbox" and kwargs["options"] == ("test", "train") and kwargs["index"] == 1
    assert kwargs["format_func"]("train") == "a share of the training images"
    kind, kwargs = widget_spec(FIELDS["bands"], None, max_chars=200)
    assert kind == "text_input" and kwargs["value"] == "" and kwargs["max_chars"] == 200
    assert widget_spec(FIELDS["compile"], False)[0] == "checkbox"
    assert widget_spec(FIELDS["profile"], False)[0] == "toggle"  # the catalogue's widget, where the kind's does not fit


def test_a_multiselect_and_a_text_list_go_back_to_what_runconfig_takes():
    kind, kwargs = widget_spec(FIELDS["augment"], "crop,nonsense")
    assert kind == "multiselect" and kwargs["options"] == ("flip", "crop") and kwargs["default"] == ["crop"]
    assert config_value(FIELDS["augment"], []) == "none" and config_value(FIELDS["augment"], ["flip", "crop"]) == "flip,crop"
    assert widget_spec(FIELDS["tags"], ("a", "b"))[1]["value"] == "a, b"
    assert RunConfig(tags=config_value(FIELDS["tags"], "a, b,,")).tags == ("a", "b")
    assert config_value(FIELDS["tags"], " ") == () and config_value(FIELDS["bands"], "  ") is None
    spaced = dataclasses.replace(FIELDS["tags"], separator=" ", parse=str.split)  # a list its parser splits on spaces
    assert widget_spec(spaced, ("--a", "--b"))[1]["value"] == "--a --b" and config_value(spaced, "--a --b") == ["--a", "--b"]
    assert RunConfig(bands=config_value(FIELDS["bands"], "3, 2,1")).bands == (3, 2, 1)
