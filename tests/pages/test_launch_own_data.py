"""The Launch page with your own data in a data root: a train/ + val/ folder is summarised with the split that
validates it, and a list file whose validation list names an unknown label is refused in the dataset field."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

import db
from tests.support import ROOT


def write_png(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((12, 12, 3), value, dtype=np.uint8)).save(path)


def launch_page_with(dataset: Path, root: Path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("PARALLAX_DATA_ROOTS", str(root))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=90).switch_page("pages/launch.py").run()
    at.selectbox(key="dataset").set_value(str(dataset.resolve())).run()
    assert not at.exception
    return at


def test_a_split_folder_is_summarised_with_the_split_that_validates_it(tmp_path, parallax_home, monkeypatch):
    root = tmp_path / "roots"
    for split, count in (("train", 3), ("val", 2)):
        for name in ("cat", "dog"):
            for i in range(count):
                write_png(root / "pets" / split / name / f"{i}.png", i)
    at = launch_page_with(root / "pets", root, monkeypatch)
    captions = [c.value for c in at.caption]
    assert any("10 images · 2 classes" in text and "validates on the val/ folder of pets (4 images)" in text
               for text in captions), captions
    assert not at.error, [e.value for e in at.error]
    db.dispose_engines()


def test_a_validation_list_with_an_unknown_label_is_named_in_the_dataset_field(tmp_path, parallax_home,
                                                                              monkeypatch):
    root = tmp_path / "roots"
    folder = root / "photos"
    for i in range(6):
        write_png(folder / "img" / f"{i}.png", i)
    (folder / "train.csv").write_text("".join(f"img/{i}.png,{'ab'[i % 2]}\n" for i in range(4)))
    (folder / "val.csv").write_text("img/4.png,a\nimg/5.png,zebra\n")
    at = launch_page_with(folder / "train.csv", root, monkeypatch)
    shown = [e.value for e in at.error]
    assert any("val.csv line 2: label zebra is not a label of train.csv" in text for text in shown), shown
    db.dispose_engines()
