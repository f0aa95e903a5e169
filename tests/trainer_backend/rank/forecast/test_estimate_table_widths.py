"""The estimate's table keeps its columns apart at any size: each column is as wide as its widest
figure (was: fixed widths, so a batch of 65,536 at 1,024 px ran 14352343.0 MB into the column
before it). Through the real ``estimate`` command.

    .venv/bin/python -m pytest tests/trainer_backend/rank/forecast/test_estimate_table_widths.py -q
"""

from __future__ import annotations

import re

import pytest

from trainer_backend.control.cli import main

HEADERS = ["device", "parameters", "gradients", "optimizer", "activations", "comm", "data", "total"]


def right_edges(line: str) -> list[int]:
    return [match.end() for match in re.finditer(r"\S+(?: \S+)?", line)]


@pytest.mark.parametrize("flags", [
    ["--image-size", "1024", "--batch-size", "65536", "--strategy", "ddp", "--devices", "cpu,cpu"],
    ["--image-size", "16", "--batch-size", "8", "--strategy", "single", "--devices", "cpu"],
], ids=["batch-65536-at-1024px", "small"])
def test_every_column_stands_apart_and_lines_up_under_its_header(flags, parallax_home, capsys):
    assert main(["estimate", "--model", "resnet18", *flags]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.endswith(" MB")]  # one a device; then the verdicts and notes
    assert re.split(r"\s{2,}", header) == HEADERS, header
    assert rows
    for row in rows:
        cells = re.split(r"\s{2,}", row)
        assert len(cells) == len(HEADERS), row  # two spaces at least between every pair of cells
        assert all(re.fullmatch(r"\d+\.\d MB", cell) for cell in cells[1:]), cells
        assert right_edges(row)[1:] == right_edges(header)[1:], (header, row)  # figures end under their header
    if "65536" in flags:
        activations = float(re.split(r"\s{2,}", rows[0])[4].split()[0])
        assert activations > 1e7  # a figure wider than the old 13-character column
