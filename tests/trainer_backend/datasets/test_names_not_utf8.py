"""Folder and file names that are not UTF-8 (Latin-1 bytes, as an old camera or a Windows share
writes them). Class folders and files inside a dataset are trained on, their classes named with
those bytes escaped (``caf\\xe9``); a dataset folder whose own path is not UTF-8 is refused in one
line, since its path is recorded as text. Messages show such bytes as ``\\xe9``.

    .venv/bin/python -m pytest tests/trainer_backend/datasets/test_names_not_utf8.py -q
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.trainer_backend.control.test_cli_bad_input import assert_nothing_left
from contract.printable import one_line, shown_name
from trainer_backend.control.cli import main
from trainer_backend.datasets import DatasetError, prepare_data
from trainer_backend.datasets.folder import list_image_folder

pytestmark = pytest.mark.usefixtures("own_data_dir")


def latin1_set(root: bytes, *, bad_file: bool = False) -> str:
    """A folder with class folders ``caf\\xe9`` (Latin-1 é) and ``plain``, four images each, named
    ``img\\xe9N.png``; with ``bad_file``, one more that is no image."""
    for index, cls in enumerate((b"caf\xe9", b"plain")):
        os.makedirs(os.path.join(root, cls))
        for i in range(4):
            pixels = np.full((16, 16, 3), 60 * index + 10 * i, dtype=np.uint8)
            Image.fromarray(pixels, mode="RGB").save(os.fsdecode(os.path.join(root, cls, b"img\xe9%d.png" % i)))
    if bad_file:
        with open(os.path.join(root, b"plain", b"bad\xe9.png"), "wb") as handle:
            handle.write(b"not a png")
    return os.fsdecode(root)


def test_class_folders_and_files_not_in_utf8_are_read_with_escaped_names(parallax_home, tmp_path):
    root = latin1_set(os.fsencode(tmp_path / "set"))
    listing = list_image_folder(Path(root))
    assert listing.class_names == ("caf\\xe9", "plain")
    data = prepare_data(root, image_size=16)
    assert data.info.class_names == ("caf\\xe9", "plain")
    for name in data.info.class_names:
        name.encode("utf-8")  # what a database, a page and a JSON file can hold
    assert any("8 image files have names (or class folders) that are not UTF-8, e.g. 'caf\\xe9/img\\xe90.png'" in w
               for w in data.info.warnings), data.info.warnings


def test_a_run_on_them_records_escaped_class_names(cli, parallax_home, tmp_path):
    root = latin1_set(os.fsencode(tmp_path / "set"))
    result = cli("run", "--dataset", root, "--epochs", "1", "--image-size", "16", "--batch-size", "4")
    assert result.returncode == 0, result.stderr
    exported = cli("export", "1")
    assert exported.returncode == 0, exported.stderr
    run = json.loads(exported.stdout)
    assert run["status"] == "completed"
    assert run["measurements"]["confusion"]["class_names"] == ["caf\\xe9", "plain"]
    assert any("not UTF-8, e.g. 'caf\\xe9/img\\xe90.png'" in note for note in run["notes"]), run["notes"]


def test_a_file_not_in_utf8_that_cannot_be_read_is_named_with_its_bytes_escaped(parallax_home, tmp_path):
    root = latin1_set(os.fsencode(tmp_path / "set"), bad_file=True)
    with pytest.raises(DatasetError) as caught:
        prepare_data(root, image_size=16)
    assert one_line(caught.value).startswith(f"cannot read image '{tmp_path}/set/plain/bad\\xe9.png': ")


def test_a_dataset_folder_not_in_utf8_is_refused_in_one_line(parallax_home, tmp_path, capsys):
    root = latin1_set(os.fsencode(tmp_path) + b"/s\xe9t")
    code = main(["run", "--dataset", root, "--epochs", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err == (
        f"error: dataset '{tmp_path}/s\\xe9t' is not allowed: its name holds bytes that are not UTF-8 (shown "
        "escaped); rename the folder to a UTF-8 name (e.g. convmv -f latin1 -t utf8 -r --notest FOLDER) or link "
        "to it from a UTF-8 path\n")
    assert_nothing_left(parallax_home)


@pytest.mark.parametrize("name, shown, line", [
    ("caf\udce9", "'caf\\xe9'", "caf\\xe9"),
    ("a\\udce9\udce9", "'a\\\\udce9\\xe9'", "a\\udce9\\xe9"),  # a real backslash is not taken for an escape
    ("plain", "plain", "plain"),
    ("x\ny\udcff", "'x\\ny\\xff'", "x\\ny\\xff"),
])
def test_names_show_bytes_that_are_not_utf8_as_escapes(name, shown, line):
    assert shown_name(name) == shown
    assert one_line(name) == line
