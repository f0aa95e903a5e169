"""Names from the outside world (file and folder names in a dataset, paths) cannot forge output: a
newline, an ANSI escape or a bidi override in them is shown escaped, and the name quoted, on the
terminal (the real CLI in a subprocess) and in the pages (Markdown and Plotly labels).

    .venv/bin/python -m pytest tests/contract/test_printable_forged_names.py -q
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from tests.support import run_cli
from contract.printable import one_line, printable_lines, shown_name
from reports.confusion_charts import confusion_figure
from ui.text import escape_markdown
from contract.printable import plotly_text

FORGED_FILE = "x\nerror: forged line\x1b[31mRED.png"
FORGED_CLASS = "<br>c\nerror: fake\x1b[2J"
FORGED_IGNORED = "notes\nnote: forged\u202e.txt"
INVISIBLE = ("\n", "\r", "\x1b", "\x07", "\x85", "\u2028", "\u202e", "\x00")


def write_images(folder, count: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(folder / f"{i}.png")


def assert_nothing_invisible(text: str) -> None:
    assert not any(char in text for char in INVISIBLE), repr(text[-2000:])


def test_a_forged_file_name_in_an_error_is_one_quoted_escaped_line(tmp_path, parallax_home):
    for label in ("a", "b"):
        write_images(tmp_path / "set" / label, 3)
    (tmp_path / "set" / "a" / FORGED_FILE).write_bytes(b"not a png")
    result = run_cli("run", "--dataset", str(tmp_path / "set"), "--model", "test_resnet", "--image-size", "16",
                     "--epochs", "1", "--quiet", home=parallax_home, timeout=120)
    assert result.returncode == 2, result.stderr
    assert_nothing_invisible(result.stderr.rstrip("\n"))
    (line,) = result.stderr.strip().split("\n")
    assert line.startswith(f"error: cannot read image '{tmp_path}/set/a/x\\nerror: forged line\\x1b[31mRED.png': "), line


def test_forged_class_and_file_names_are_escaped_in_notes_list_and_pages(tmp_path, parallax_home):
    root = tmp_path / "set"
    for label in ("a", FORGED_CLASS):
        write_images(root / label, 4)
    (root / "a" / FORGED_IGNORED).write_text("not an image")
    result = run_cli("run", "--dataset", str(root), "--model", "test_resnet", "--image-size", "16", "--epochs", "1",
                     "--val-fraction", "0.5", "--batch-size", "4", home=parallax_home, timeout=180)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    lines = result.stdout.strip().split("\n")
    for line in lines:
        assert_nothing_invisible(line)
    assert not [line for line in lines if line.startswith(("error:", "note: forged"))], lines
    ignored = "'a/notes\\nnote: forged\\u202e.txt'"
    assert f"note: ignored 1 files that are not images (e.g. {ignored})" in lines, lines

    listed = run_cli("list", home=parallax_home, timeout=60).stdout
    assert listed.count("\n") == 1 and f"dataset={root}" in listed

    exported = json.loads(run_cli("export", "1", home=parallax_home, timeout=60).stdout)
    assert any(ignored in note for note in exported["notes"]), exported["notes"]
    record = exported["measurements"]["confusion"]
    assert FORGED_CLASS in record["class_names"]  # stored as it is; shown escaped
    figure, _ = confusion_figure(record)
    for label in figure.data[0].x:
        assert_nothing_invisible(label)
        assert "<" not in label, label
    assert "&lt;br&gt;c\\nerror: fake\\x1b[2J" in figure.data[0].x


@pytest.mark.parametrize("text", [FORGED_FILE, FORGED_CLASS, FORGED_IGNORED, "tab\there", "nul\x00", "bell\x07"])
def test_every_way_of_showing_a_name_escapes_what_is_invisible(text):
    for shown in (one_line(text), shown_name(text), escape_markdown(text), plotly_text(text)):
        assert_nothing_invisible(shown)
    assert shown_name(text).startswith("'")


@pytest.mark.parametrize("text", ["digits", "/data/my set/cats", "résumé", "test_resnet"])
def test_ordinary_names_are_shown_as_they_are(text):
    assert one_line(text) == shown_name(text) == plotly_text(text) == text


def test_a_traceback_keeps_its_lines_and_loses_its_escapes():
    assert printable_lines("Traceback:\n  open('x\x1b[2J')\nOSError") == "Traceback:\n  open('x\\x1b[2J')\nOSError"
