"""Outsized and odd input is one short line: a config file nested 100,000 levels or saved as UTF-16,
a 50-million-character model name, a dataset path longer than the OS allows, a pretrained tag timm
does not have, an in-memory SQLite URL. Exit code 2, nothing recorded, and the value echoed only
as a short, shortened excerpt.

    .venv/bin/python -m pytest tests/trainer_backend/control/test_cli_outsized_input.py -q
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.trainer_backend.control.test_cli_bad_input import BASE, assert_nothing_left
from trainer_backend.control.cli import main
from contract.config import ConfigError, RunConfig

LONGEST_LINE = 800  # characters: one line (the allowed values included), whatever was given

NESTED = b"[" * 100_000 + b"]" * 100_000
HUGE_WHOLE_NUMBER = b'{"seed": ' + b"9" * 5000 + b"}"

# (id, --config file bytes or None, flags, words the one line must hold)
CASES = [
    ("config-nested-100000-deep", NESTED, [], ["config file '{config}' nests its values too deeply"]),
    ("config-utf16", '{"epochs": 1}'.encode("utf-16"), [],
     ["config file '{config}' is not UTF-8 text (it starts with a UTF-16 byte-order mark)", "save it as UTF-8"]),
    ("config-latin1", '{"tags": ["café"]}'.encode("latin-1"), [], ["config file '{config}' is not UTF-8 text: byte"]),
    ("config-over-a-mebibyte", b'{"model": "' + b"a" * 2**20 + b'"}', [], ["config file '{config}' is larger than 1 MiB"]),
    ("config-whole-number-of-5000-digits", HUGE_WHOLE_NUMBER, [], ["config file '{config}' is not valid JSON"]),
    ("config-model-900000-characters", b'{"model": "' + b"m" * 900_000 + b'"}', ["--model", None],
     ["model 'mmmm", "(900,000 characters) is not allowed", "at most 128 characters"]),
    ("config-field-name-huge", b'{"' + b"f" * 500_000 + b'": 1}', [], ["unknown config field(s) ['ffff", "…]; allowed: "]),
    ("config-strategy-huge", b'{"strategy": "' + b"s" * 100_000 + b'"}', [], ["strategy 'ssss", "choose one of"]),
    ("model-50-million-characters", None, ["--model", "r" * 50_000_000],
     ["--model 'rrrr", "(50,000,000 characters) is not allowed", "at most 65,536"]),
    ("model-over-the-name-limit", None, ["--model", "r" * 5000], ["model 'rrrr", "(5,000 characters)"]),
    ("choice-long", None, ["--strategy", "z" * 5000], ["invalid choice: 'zzzz", "…", "'single'"]),
    ("dataset-path-too-long", None, ["--dataset", "/tmp/" + "a/" * 3000],
     ["dataset '/tmp/a/a/", "(6,005 characters) is not allowed: a path has at most 4096 characters"]),
    ("dataset-name-too-long", None, ["--dataset", "/tmp/" + "a" * 300],
     ["dataset path has a part 'aaaa", "(300 characters) longer than the 255 bytes"]),
    ("bands-too-many", None, ["--bands", ",".join(["1"] * 5000)], ["bands lists 5000 indices, more than the 4096"]),
    ("device-long", None, ["--devices", "cuda:" + "9" * 5000], ["device 'cuda:9999", "'cpu', 'cuda:N'"]),
    ("pretrained-tag-unknown", None, ["--model", "resnet18.no_such_tag"],
     ["model 'resnet18.no_such_tag': 'resnet18' has no pretrained tag 'no_such_tag' (its tags are a1_in1k",
      "give a known tag or the bare name resnet18"]),
    ("sqlite-in-memory", None, ["--db", "sqlite://"],
     ["database URL sqlite:// is an in-memory SQLite database", "give a file, e.g. sqlite:////"]),
    ("sqlite-memory-file", None, ["--db", "sqlite:///:memory:"], ["sqlite:///:memory: is an in-memory SQLite"]),
]


@pytest.mark.parametrize("case, config, flags, words", CASES, ids=[c[0] for c in CASES])
def test_outsized_or_odd_input_is_one_short_line_and_records_nothing(case, config, flags, words, tmp_path,
                                                                       parallax_home, capsys):
    argv = list(BASE)
    if flags[:1] == ["--db"]:
        argv = flags + argv
    elif flags[1:2] == [None]:  # drop a flag of BASE, so that the config file's value is the one used
        index = argv.index(flags[0])
        del argv[index:index + 2]
    else:
        argv += flags
    path = tmp_path / "config.json"
    if config is not None:
        path.write_bytes(config)
        argv += ["--config", str(path)]
    started = time.monotonic()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refuses a flag by exiting
        code = exc.code
    elapsed = time.monotonic() - started
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err[:2000]
    assert len(lines[0]) <= LONGEST_LINE, lines[0][:2000]
    for word in words:
        assert word.replace("{config}", str(path)) in lines[0], lines[0]
    assert elapsed < 60, f"refusing {case} took {elapsed:.1f} s"  # the first case imports torch and timm
    assert_nothing_left(parallax_home)


def test_a_fifty_million_character_model_name_is_refused_before_any_search():
    """The dashboard and config files build a RunConfig directly: the bound holds there too, at once."""
    started = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        RunConfig(model="resnet" * 8_000_000)
    assert time.monotonic() - started < 1.0
    assert refused.value.field == "model" and len(str(refused.value)) < 200, str(refused.value)[:500]
    assert "(48,000,000 characters) is not allowed" in str(refused.value)


def test_the_model_check_bounds_the_name_before_the_closest_name_search():
    from trainer_backend.rank.models import ModelError, check_model_name

    started = time.monotonic()
    with pytest.raises(ModelError, match=r"\(50,000,000 characters\) is not allowed"):
        check_model_name("x" * 50_000_000)
    assert time.monotonic() - started < 2.0
    check_model_name("resnet18.a1_in1k")  # a real pretrained tag passes


@pytest.mark.parametrize("value", ["a" * 10_000, ["a"] * 10_000, 10**4000, "x\n\x1b[31m" * 100])
def test_a_refused_value_is_echoed_short_and_escaped(value):
    from contract.config import shown

    text = shown(value)
    assert len(text) <= 60 and "\n" not in text and "\x1b" not in text, text


def test_a_path_within_the_limits_still_reaches_the_data_check(tmp_path, parallax_home, capsys):
    deep = Path("/tmp") / ("b" * 255)
    code = main([*BASE, "--dataset", str(deep)])
    line = capsys.readouterr().err.strip()
    assert code == 2 and "does not exist" in line and "255 bytes" not in line, line
