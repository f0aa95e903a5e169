"""Your own data through the real CLI: a train/ + val/ folder and path,label list files (with and without a
validation list) train on the training split and validate on the one given, said in the run's notes, and
the confusion matrix of the export counts exactly the validation images, under the data's class names."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.support import run_cli

RUN_FLAGS = ("--model", "test_resnet", "--image-size", "16", "--epochs", "1", "--batch-size", "4")


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("home")


def write_png(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((20, 20, 3), value, dtype=np.uint8)).save(path)


def train_and_export(home: Path, dataset: Path, *flags: str) -> dict:
    result = run_cli("run", "--dataset", str(dataset), *RUN_FLAGS, *flags, home=home, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    run_id = result.stdout.strip().splitlines()[-1].split()[0].split("=")[1]
    exported = run_cli("export", run_id, home=home)
    assert exported.returncode == 0, exported.stderr
    return {**json.loads(exported.stdout), "printed": result.stdout}


def write_list(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("".join(f"{p},{label}\n" for p, label in rows))
    return path


def test_a_train_and_val_folder_validates_on_val(tmp_path, home):
    root = tmp_path / "pets"
    for split, counts in (("train", {"cat": 6, "dog": 6}), ("val", {"cat": 2, "dog": 3})):
        for index, (name, count) in enumerate(counts.items()):
            for i in range(count):
                write_png(root / split / name / f"{i}.png", 120 * index + i)
    run = train_and_export(home, root)
    assert run["status"] == "completed"
    assert any("the val/ folder of pets (5 images)" in note for note in run["notes"]), run["notes"]
    confusion = run["measurements"]["confusion"]
    assert confusion["class_names"] == ["cat", "dog"] and confusion["support"] == [2, 3]


def test_a_list_with_a_validation_list_validates_on_it(tmp_path, home):
    folder = tmp_path / "photos"
    train_rows, val_rows = [], []
    for i in range(12):
        write_png(folder / "img" / f"{i}.png", 20 * i)
        (train_rows if i < 9 else val_rows).append((f"img/{i}.png", ("rose", "tulip", "iris")[i % 3]))
    train = write_list(folder / "train.csv", train_rows)
    write_list(folder / "val.csv", val_rows + [("img/0.png", "rose")])
    run = train_and_export(home, train)
    assert run["status"] == "completed"
    assert any("the list val.csv beside train.csv (4 images)" in note for note in run["notes"]), run["notes"]
    confusion = run["measurements"]["confusion"]
    assert confusion["class_names"] == ["iris", "rose", "tulip"] and confusion["support"] == [1, 2, 1]


def test_a_list_alone_holds_out_a_stratified_share(tmp_path, home):
    folder = tmp_path / "photos"
    rows = []
    for i in range(12):
        write_png(folder / "img" / f"{i}.png", 20 * i)
        rows.append((f"img/{i}.png", str(i % 2 * 10)))
    repeated = rows[:2] + [("./" + rows[2][0], rows[2][1])]  # copies that could land in both splits
    run = train_and_export(home, write_list(folder / "labels.csv", rows + repeated), "--val-fraction", "0.5")
    assert run["status"] == "completed"
    assert any("held out stratified" in note and "(6 images" in note for note in run["notes"]), run["notes"]
    dropped = ("dropped 3 lines of labels.csv that repeat an image it lists already under the same label (e.g. line 13 "
               "repeats line 1)")
    assert any(note.startswith(dropped) for note in run["notes"]) and f"note: {dropped}" in run["printed"], run["notes"]
    confusion = run["measurements"]["confusion"]
    assert confusion["class_names"] == ["0", "10"] and confusion["support"] == [3, 3]


def test_a_list_giving_an_image_two_labels_is_refused_before_the_run(tmp_path, home):
    folder = tmp_path / "photos"
    for i in range(4):
        write_png(folder / "img" / f"{i}.png", i)
    listed = write_list(folder / "train.csv", [(f"img/{i}.png", "ab"[i % 2]) for i in range(4)] + [("img/1.png", "a")])
    result = run_cli("run", "--dataset", str(listed), *RUN_FLAGS, home=home, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line == (f"error: image img/1.png is listed under two labels, b and a ({listed} lines 2 and 5): give each "
                    "image one label"), line
    assert "run_id=" not in result.stdout


def test_a_list_naming_a_missing_image_is_refused_before_the_run(tmp_path, home):
    folder = tmp_path / "photos"
    for i in range(4):
        write_png(folder / "img" / f"{i}.png", i)
    listed = write_list(folder / "train.csv", [(f"img/{i}.png", "ab"[i % 2]) for i in range(4)]
                        + [("img/gone.png", "a")])
    result = run_cli("run", "--dataset", str(listed), *RUN_FLAGS, home=home, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "train.csv line 5: image img/gone.png does not exist" in result.stderr
    assert "Traceback" not in result.stderr and "run_id=" not in result.stdout
