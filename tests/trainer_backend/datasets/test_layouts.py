"""The dataset layouts besides class folders, on real PNG files: train/ + val/ trees and path,label list files,
validated on the split they give, and every bad list refused in one line naming the line and the value."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from trainer_backend.datasets import DatasetError, inspect_dataset, prepare_data, stored_split_size
from trainer_backend.datasets.layouts import list_dataset, read_list_file

pytestmark = pytest.mark.usefixtures("own_data_dir", "parallax_home")


def write_png(path: Path, value: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((12, 12, 3), value, dtype=np.uint8)).save(path)
    return path


def make_split_folder(root: Path, train: dict[str, int], val: dict[str, int], val_name: str = "val") -> Path:
    """train/<class>/ and <val_name>/<class>/ trees; each val image is brighter than every train image, so the
    pool's pixels tell which tree an image came from."""
    for split, counts, base in (("train", train, 0), (val_name, val, 200)):
        for index, (name, count) in enumerate(counts.items()):
            for i in range(count):
                write_png(root / split / name / f"{i}.png", base + 10 * index + i)
    return root


def make_list(folder: Path, name: str, rows: list[tuple[str, str]], header: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(("path,label\n" if header else "") + "".join(f"{p},{label}\n" for p, label in rows))
    return path


def labelled_images(folder: Path, labels: list[str], start: int = 0) -> list[tuple[str, str]]:
    """One PNG per label under folder/img/, named by its position; (relative path, label) rows."""
    rows = []
    for i, label in enumerate(labels, start=start):
        write_png(folder / "img" / f"{i}.png", i)
        rows.append((f"img/{i}.png", label))
    return rows


def stored_values(split) -> list[int]:
    return split.images[:, 0, 0, 0].tolist()


@pytest.mark.parametrize("val_name", ["val", "validation"])
def test_a_train_and_val_folder_trains_on_train_and_validates_on_val(tmp_path, val_name):
    root = make_split_folder(tmp_path / "pets", {"cat": 4, "dog": 5}, {"cat": 2, "dog": 3}, val_name)
    write_png(root / "test" / "cat" / "0.png", 1)  # neither split: ignored, and said
    data = prepare_data(str(root), image_size=8)
    assert f"ignored what lies beside train/ and {val_name}/ in pets: test" in data.info.warnings
    assert data.info.class_names == ("cat", "dog")
    assert (data.info.num_train, data.info.num_val) == (9, 5)
    assert Counter(data.val.labels.tolist()) == {0: 2, 1: 3}
    assert all(v >= 200 for v in stored_values(data.val)) and all(v < 200 for v in stored_values(data.train))
    assert f"the {val_name}/ folder of pets" in data.info.val_split and "official split" in data.info.val_split


def test_val_from_train_holds_out_training_images_of_a_split_folder(tmp_path):
    root = make_split_folder(tmp_path / "pets", {"cat": 4, "dog": 4}, {"cat": 2, "dog": 2})
    data = prepare_data(str(root), image_size=8, val_from="train", val_fraction=0.5)
    assert (data.info.num_train, data.info.num_val) == (4, 4)
    assert all(v < 200 for v in stored_values(data.train) + stored_values(data.val))
    assert "held out stratified" in data.info.val_split


def test_a_single_tree_keeps_the_stratified_hold_out(tmp_path):
    root = tmp_path / "flowers"
    for index, name in enumerate(("rose", "tulip")):
        for i in range(5):
            write_png(root / name / f"{i}.png", 10 * index + i)
    data = prepare_data(str(root), image_size=8, val_fraction=0.4)
    assert (data.info.num_train, data.info.num_val) == (6, 4)
    assert "held out stratified" in data.info.val_split and "no val/ folder or validation list" in data.info.val_split


def test_a_val_class_missing_from_train_is_refused_naming_it(tmp_path):
    root = make_split_folder(tmp_path / "pets", {"cat": 3, "dog": 3}, {"cat": 1, "emu": 1})
    with pytest.raises(DatasetError, match=r"class emu in .*val has no folder in .*train \(its classes: cat, dog\)"):
        prepare_data(str(root), image_size=8)
    with pytest.raises(DatasetError, match="emu"):
        inspect_dataset(str(root))


def test_a_folder_with_both_val_and_validation_is_refused(tmp_path):
    root = make_split_folder(tmp_path / "pets", {"cat": 3, "dog": 3}, {"cat": 1, "dog": 1})
    make_split_folder(root, {}, {"cat": 1}, "validation")
    with pytest.raises(DatasetError, match="both val/ and validation/"):
        prepare_data(str(root), image_size=8)


def test_an_empty_val_tree_is_a_problem_before_decoding(tmp_path):
    root = make_split_folder(tmp_path / "pets", {"cat": 3, "dog": 3}, {})
    (root / "val" / "cat").mkdir(parents=True)
    info = inspect_dataset(str(root))
    assert info["layout"] == "split folder"
    assert any("validation split (the val/ folder of pets) holds no image" in p for p in info["problems"])


def test_a_list_with_a_validation_list_validates_on_it_with_sorted_labels(tmp_path):
    folder = tmp_path / "photos"
    labels = ["10", "2", "10", "2", "0", "0", "2", "10", "0"]
    train = make_list(folder, "train.csv", labelled_images(folder, labels), header=True)
    make_list(folder, "val.csv", labelled_images(folder, ["2", "0", "2"], start=100))
    data = prepare_data(str(train), image_size=8)
    assert data.info.class_names == ("0", "2", "10")  # whole-number labels sort as numbers
    assert (data.info.num_train, data.info.num_val) == (9, 3)
    assert sorted(stored_values(data.val)) == [100, 101, 102]
    # image 100 is labelled "2" (class 1), 101 "0" (class 0), 102 "2"
    assert dict(zip(stored_values(data.val), data.val.labels.tolist())) == {100: 1, 101: 0, 102: 1}
    assert Counter(data.train.labels.tolist()) == {0: 3, 1: 3, 2: 3}
    assert "the list val.csv beside train.csv" in data.info.val_split


def test_a_list_without_a_validation_list_holds_out_a_stratified_share(tmp_path):
    folder = tmp_path / "photos"
    listed = make_list(folder, "all.csv", labelled_images(folder, ["b", "a"] * 5))
    data = prepare_data(str(listed), image_size=8, val_fraction=0.4)
    assert data.info.class_names == ("a", "b")
    assert (data.info.num_train, data.info.num_val) == (6, 4)
    assert Counter(data.val.labels.tolist()) == {0: 2, 1: 2}
    assert "held out stratified" in data.info.val_split


def test_a_txt_list_may_separate_by_spaces_and_skips_comments(tmp_path):
    folder = tmp_path / "photos"
    rows = labelled_images(folder, ["x", "y", "x", "y"])
    listed = folder / "train.txt"
    listed.write_text("# path label\n\n" + "".join(f"{p} {label}\n" for p, label in rows))
    listing = list_dataset(listed)
    assert listing.class_names == ("x", "y") and listing.num_images == 4 and listing.val_files_by_class is None


@pytest.mark.parametrize(("line", "expected"), [
    ("img/missing.png,cat", r"list file .*train\.csv line 3: image img/missing\.png does not exist"),
    ("img/0.png", r"list file .*train\.csv line 3 is img/0\.png: expected path,label"),
    ("img/0.png,cat,extra", r"line 3 is img/0\.png,cat,extra: expected path,label"),
    (",cat", r"line 3 is ,cat: expected path,label"),
    ("notes.md,cat", r"line 3: notes\.md is not an image file"),
    ("img,cat", r"line 3: img is a folder, not an image file"),
])
def test_a_bad_list_line_is_refused_naming_the_line_and_the_value(tmp_path, line, expected):
    folder = tmp_path / "photos"
    rows = labelled_images(folder, ["cat", "dog"])
    (folder / "notes.md").write_text("not an image")
    listed = folder / "train.csv"
    listed.write_text("".join(f"{p},{label}\n" for p, label in rows) + line + "\n")
    with pytest.raises(DatasetError, match=expected):
        read_list_file(listed, None)
    with pytest.raises(DatasetError, match=expected):
        prepare_data(str(listed), image_size=8)


def test_a_listed_file_that_cannot_be_decoded_is_named(tmp_path):
    folder = tmp_path / "photos"
    rows = labelled_images(folder, ["cat", "dog"] * 2)
    (folder / "img" / "broken.png").write_bytes(b"not a png at all")
    listed = make_list(folder, "all.csv", rows + [("img/broken.png", "dog")])
    with pytest.raises(DatasetError, match=r"cannot read image .*img/broken\.png"):
        prepare_data(str(listed), image_size=8)


def test_a_validation_list_with_an_unknown_label_is_refused_naming_it(tmp_path):
    folder = tmp_path / "photos"
    train = make_list(folder, "train.csv", labelled_images(folder, ["cat", "dog"] * 2))
    make_list(folder, "validation.csv", labelled_images(folder, ["dog", "emu"], start=10))
    with pytest.raises(DatasetError, match=r"validation\.csv line 2: label emu is not a label of train\.csv "
                                           r"\(its labels: cat, dog\)"):
        list_dataset(train)
    with pytest.raises(DatasetError, match="label emu"):
        inspect_dataset(str(train))


def test_a_validation_list_repeating_training_images_is_warned_of(tmp_path):
    folder = tmp_path / "photos"
    rows = labelled_images(folder, ["cat", "dog"] * 2)
    train = make_list(folder, "train.csv", rows)
    make_list(folder, "val.csv", rows[:1] + labelled_images(folder, ["dog"], start=10))
    data = prepare_data(str(train), image_size=8)
    assert "1 image of val.csv is also in train.csv (e.g. img/0.png)" in " ".join(data.info.warnings)
    assert inspect_dataset(str(train))["warnings"][0].startswith("1 image of val.csv is also in train.csv")


def test_two_validation_lists_beside_train_are_refused(tmp_path):
    folder = tmp_path / "photos"
    train = make_list(folder, "train.csv", labelled_images(folder, ["cat", "dog"] * 2))
    make_list(folder, "val.csv", labelled_images(folder, ["dog"], start=10))
    make_list(folder, "val.txt", labelled_images(folder, ["cat"], start=11))
    with pytest.raises(DatasetError, match=r"2 validation lists beside train\.csv \(val\.csv, val\.txt\)"):
        list_dataset(train)


def test_the_cache_key_covers_the_list_content(tmp_path):
    """Relabelling the same files (the list's size and mtime unchanged) must not reuse the old labels."""
    folder = tmp_path / "photos"
    listed = make_list(folder, "all.csv", labelled_images(folder, ["a", "b"] * 4))
    first = prepare_data(str(listed), image_size=8, val_fraction=0.5)
    stat = listed.stat()
    listed.write_text(listed.read_text().replace(",a", ",c"))  # same length: a -> c
    os.utime(listed, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    second = prepare_data(str(listed), image_size=8, val_fraction=0.5)
    assert first.info.class_names == ("a", "b") and second.info.class_names == ("b", "c")
    assert first.info.cache_file != second.info.cache_file


def test_a_list_line_leading_outside_the_data_roots_is_refused(tmp_path):
    roots = [tmp_path / "roots"]
    folder = roots[0] / "photos"
    rows = labelled_images(folder, ["cat", "dog", "cat", "dog"])
    outside = write_png(tmp_path / "elsewhere" / "secret.png", 7)
    (folder / "img" / "link.png").symlink_to(outside)
    listed = make_list(folder, "train.csv", rows + [("img/link.png", "cat")])
    with pytest.raises(DatasetError, match=r"line 5: dataset path .*link\.png leads outside the data roots"):
        inspect_dataset(str(listed), data_roots=roots)
    with pytest.raises(DatasetError, match="leads outside the data roots"):
        prepare_data(str(listed), image_size=8, data_roots=roots)
    assert list_dataset(listed).num_images == 5  # the CLI, unconfined, reads it


def test_a_val_tree_linking_outside_the_data_roots_is_refused(tmp_path):
    roots = [tmp_path / "roots"]
    root = make_split_folder(roots[0] / "pets", {"cat": 2, "dog": 2}, {"cat": 1, "dog": 1})
    outside = make_split_folder(tmp_path / "elsewhere", {}, {"emu": 1}, "val") / "val" / "emu"
    (root / "val" / "dog" / "linked").symlink_to(outside / "0.png")
    with pytest.raises(DatasetError, match="leads outside the data roots"):
        inspect_dataset(str(root), data_roots=roots)


def test_decode_workers_validate_on_the_given_split(tmp_path):
    root = make_split_folder(tmp_path / "pets", {"cat": 3, "dog": 3}, {"cat": 1, "dog": 2})
    data = prepare_data(str(root), image_size=8, decode="workers")
    assert (data.info.num_train, data.info.num_val) == (6, 3)
    assert all("/val/" in str(path) for path in data.val.paths)
    assert data.val.labels.tolist() == [0, 1, 1]
    assert "the val/ folder of pets" in data.info.val_split


def test_stored_split_size_counts_the_splits_a_run_keeps(tmp_path):
    root = make_split_folder(tmp_path / "pets", {"cat": 3, "dog": 3}, {"cat": 1, "dog": 2})
    assert stored_split_size(str(root), 8) == (9 * 3 * 8 * 8, 9)
    assert stored_split_size(str(root), 8, val_from="train") == (6 * 3 * 8 * 8, 6)


def test_inspect_dataset_describes_each_layout(tmp_path):
    root = make_split_folder(tmp_path / "pets", {"cat": 3, "dog": 3}, {"cat": 1, "dog": 2})
    info = inspect_dataset(str(root))
    assert (info["layout"], info["num_images"], info["num_val_images"], info["problems"]) == (
        "split folder", 9, 3, [])
    assert info["images_per_class"] == {"cat": 3, "dog": 3} and info["image_shape"] == (12, 12)


@pytest.mark.parametrize("spelling", ["img/1.png", "./img/1.png", "img/../img/1.png", "link.png"])
def test_an_image_listed_under_two_labels_is_refused_naming_it_both_labels_and_both_lines(tmp_path, spelling):
    # Was trained on silently, as two images with two labels.
    folder = tmp_path / "photos"
    rows = labelled_images(folder, ["cat", "dog", "cat", "dog"])
    (folder / "link.png").symlink_to(folder / "img" / "1.png")
    listed = make_list(folder, "all.csv", rows + [(spelling, "cat")], header=True)
    expected = (r"image img/1\.png is listed under two labels, dog and cat \(.*all\.csv lines 3 and 6\): give each "
                r"image one label")
    with pytest.raises(DatasetError, match=expected):
        list_dataset(listed)
    with pytest.raises(DatasetError, match=expected):
        prepare_data(str(listed), image_size=8)


def test_an_image_labelled_one_way_in_train_and_another_in_val_is_refused(tmp_path):
    folder = tmp_path / "photos"
    rows = labelled_images(folder, ["cat", "dog"] * 2)
    train = make_list(folder, "train.csv", rows)
    make_list(folder, "val.csv", labelled_images(folder, ["dog"], start=10) + [("img/0.png", "dog")])
    with pytest.raises(DatasetError, match=r"image img/0\.png is listed under two labels, cat and dog \(.*train\.csv "
                                           r"line 1 and .*val\.csv line 2\)"):
        list_dataset(train)


def test_repeated_lines_are_dropped_and_counted_so_no_image_lands_in_both_splits(tmp_path):
    # Was: every copy kept, so a held-out share could validate on a copy of an image another copy trained on.
    folder = tmp_path / "photos"
    rows = labelled_images(folder, ["a", "b"] * 5)
    listed = make_list(folder, "all.csv", rows + rows[:3] + [("./" + rows[0][0], "a")])
    listing = list_dataset(listed)
    assert listing.num_images == 10
    data = prepare_data(str(listed), image_size=8, val_fraction=0.4)
    assert (data.info.num_train, data.info.num_val) == (6, 4)
    assert not set(stored_values(data.train)) & set(stored_values(data.val))  # each image in one split only
    assert ("dropped 4 lines of all.csv that repeat an image it lists already under the same label (e.g. line 11 "
            "repeats line 1): each image is kept once") in " ".join(data.info.warnings)
    assert inspect_dataset(str(listed))["warnings"][0].startswith("dropped 4 lines of all.csv")
