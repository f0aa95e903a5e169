"""The command speaks as users type it: ``parallax`` in its usage lines and refusals however it was started,
and a listing in JSON lines (one object a line) where the README promises one line per run.

    .venv/bin/python -m pytest tests/trainer_backend/control/test_cli_words.py -q
"""

from __future__ import annotations

import json

import pytest

from db import store
from trainer_backend.control.cli import build_parser, main


@pytest.mark.parametrize("command", ["run", "launch", "sweep", "estimate", "list", "export", "predict"])
def test_each_commands_help_names_the_command_parallax(command, capsys):
    with pytest.raises(SystemExit) as ended:
        build_parser().parse_args([command, "--help"])
    assert ended.value.code == 0
    usage = capsys.readouterr().out
    assert usage.startswith(f"usage: parallax {command}") and "trainer_backend" not in usage


def test_a_refused_flag_points_to_parallax_help(capsys):
    with pytest.raises(SystemExit) as ended:
        build_parser().parse_args(["run", "--strategy", "zero3"])
    assert ended.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: argument --strategy: invalid choice: 'zero3'") and line.endswith(
        "(see parallax run --help)")


def test_list_json_prints_one_json_object_a_line(engine, db_url, capsys):
    first = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": "single",
                                      "devices": ["cpu"], "tags": ["a"]}, status="failed")
    second = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": "ddp",
                                       "devices": ["cpu", "cpu"]}, status="completed")
    assert main(["--db", db_url, "list", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [json.loads(line) for line in lines]  # each line whole, as `jq -c` and `grep` read them
    assert [row["run_id"] for row in rows] == [second, first] and len(lines) == 2
    assert rows[1]["tags"] == ["a"] and rows[0]["status"] == "completed"
