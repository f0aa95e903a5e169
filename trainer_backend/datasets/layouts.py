"""The three ways a dataset path lays out its images, each listed without decoding into one ``FolderListing``.

    listing = list_dataset("/data/flowers", roots)        # one sub-folder per class: held-out validation
    listing = list_dataset("/data/imagenette", roots)     # train/ and val/ (or validation/) trees: the official split
    listing = list_dataset("/data/photos/train.csv", roots)  # path,label lines; val.csv beside it validates

A list file (``.csv`` or ``.txt``) holds one ``path,label`` per line, the path relative to the list's
folder (a ``.txt`` line without a comma may separate them by spaces, as Caffe's lists do); blank
lines, ``#`` comments and a first line ``path,label`` are skipped. A list named ``train.csv`` (or
``train.txt``) validates on ``val.csv``/``val.txt``/``validation.csv``/``validation.txt`` beside it,
whose labels must all be labels of the training list. An image is one file however its path is spelled
(``img/a.png``, ``./img/a.png``, a link to it): listed twice under two labels, in one list or across the
two, it is refused, naming it, both labels and both lines; listed again under its own label, the repeat
is dropped and counted in the run's notes, so that no copy of it trains while another validates. Class names are the folders' names or the
list's labels, sorted (as numbers when every label is a whole number). Every path read goes through
``paths.py``: with ``roots`` (the dashboard) a file or link leading outside them is refused.
"""

from __future__ import annotations

import csv
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from contract.printable import shown_name
from trainer_backend.datasets.errors import DatasetError
from trainer_backend.datasets.folder import FolderListing, is_hidden, list_image_folder, resolve_folder
from trainer_backend.datasets.image_files import IMAGE_SUFFIXES, is_image_file
from trainer_backend.datasets.paths import check_inside, entry_stat, folder_entries, open_checked
from trainer_backend.datasets.roots import LIST_SUFFIXES, VAL_NAMES

TRAIN_NAME = "train"
# A list file larger than this is refused before it is read (2 million lines of 100 characters fit in 256 MB).
MAX_LIST_BYTES = 256 * 2**20


def is_list_file(dataset: str | Path) -> bool:
    return Path(dataset).suffix.lower() in LIST_SUFFIXES


def list_dataset(dataset: str | Path, roots: list[Path] | None = None) -> FolderListing:
    """The listing of a class-folder tree, a train/ + val/ folder or a list file (with its validation list)."""
    if is_list_file(dataset) and not Path(dataset).expanduser().is_dir():
        return list_files_of(Path(os.path.abspath(Path(dataset).expanduser())), roots)
    root = resolve_folder(str(dataset))
    split = split_folders(root, roots)
    if split is None:
        return list_image_folder(root, roots)
    return split_listing(root, *split, roots)


def split_folders(root: Path, roots: list[Path] | None) -> tuple[Path, Path] | None:
    """(train, val) sub-folders of ``root`` when it has ``train/`` and ``val/`` (or ``validation/``), else None."""
    check_inside(root, roots)
    folders = {path.name: path for path in folder_entries(root)
               if not is_hidden(path.name) and stat.S_ISDIR(entry_stat(path, roots).st_mode)}
    vals = [folders[name] for name in VAL_NAMES if name in folders]
    if TRAIN_NAME not in folders or not vals:
        return None
    if len(vals) > 1:
        raise DatasetError(f"dataset folder {root} has both val/ and validation/: keep one, so that it is clear "
                           "which validates")
    return folders[TRAIN_NAME], vals[0]


def split_listing(root: Path, train_dir: Path, val_dir: Path, roots: list[Path] | None) -> FolderListing:
    """One listing of ``train_dir``'s classes with ``val_dir``'s images as its official validation split."""
    train, val = list_image_folder(train_dir, roots), list_image_folder(val_dir, roots)
    unknown = [name for name in val.class_names if name not in train.class_names]
    if unknown:
        raise DatasetError(
            f"class {shown_name(unknown[0])} in {val_dir} has no folder in {train_dir} (its classes: "
            f"{', '.join(map(shown_name, train.class_names))}): every validation class must be a training class")
    val_files = dict(zip(val.class_names, val.files_by_class))
    others = sorted(path.name for path in folder_entries(root) if not is_hidden(path.name)
                    and path not in (train_dir, val_dir))

    def under_root(listing: FolderListing, folder: Path):
        return tuple((str(Path(folder.name, entry[0])), *entry[1:]) for entry in listing.fingerprint)

    return FolderListing(
        root=root,
        class_names=train.class_names,
        files_by_class=train.files_by_class,
        ignored_files=tuple(sorted(train.ignored_files + val.ignored_files)),
        stray_files=train.stray_files + val.stray_files,
        fingerprint=under_root(train, train_dir) + under_root(val, val_dir),
        roots=train.roots,
        val_files_by_class=tuple(val_files.get(name, ()) for name in train.class_names),
        layout="split folder",
        val_source=f"the {val_dir.name}/ folder of {root.name}",
        notes=(f"ignored what lies beside {train_dir.name}/ and {val_dir.name}/ in {root.name}: "
               f"{', '.join(map(shown_name, others[:5]))}{', ...' if len(others) > 5 else ''}",) if others else (),
    )


def list_files_of(list_path: Path, roots: list[Path] | None) -> FolderListing:
    """The listing of a list file, and of its validation list if one lies beside it (``val_list_for``)."""
    train = read_list_file(list_path, roots)
    train_rows, train_digest = train.rows, train.digest
    labels = sorted({row[1] for row in train_rows}, key=label_order([row[1] for row in train_rows]))
    val_path = val_list_for(list_path)
    val = read_list_file(val_path, roots, known=labels, train_path=list_path) if val_path else None
    val_rows, val_digest = (val.rows, val.digest) if val is not None else ([], "")
    if val is not None:
        refuse_two_labels(train, val)
    index = {label: i for i, label in enumerate(labels)}

    def by_class(rows):
        grouped = [[] for _ in labels]
        for path, label, _ in rows:
            grouped[index[label]].append(path)
        return tuple(tuple(files) for files in grouped)

    # As folder.file_fingerprint: a listed link re-pointed at another image changes the key too.
    fingerprint = [(os.path.relpath(path, list_path.parent), result.st_size, result.st_mtime_ns, result.st_ctime_ns,
                    result.st_dev, result.st_ino, os.path.realpath(path)) for path, _, result in train_rows + val_rows]
    trained = {(result.st_dev, result.st_ino) for _, _, result in train_rows}
    repeated = [path for path, _, result in val_rows if (result.st_dev, result.st_ino) in trained]
    many = len(repeated) != 1
    notes = tuple(note for note in (train.dropped_note(), val.dropped_note() if val is not None else None) if note)
    notes += (f"{len(repeated)} image{'s' * many} of {val_path.name} {'are' if many else 'is'} also in {list_path.name} (e.g. "
              f"{shown_name(os.path.relpath(repeated[0], list_path.parent))}): validation then measures images the "
              "model trained on",) if repeated else ()
    return FolderListing(
        root=list_path,
        class_names=tuple(labels),
        files_by_class=by_class(train_rows),
        ignored_files=(),
        stray_files=(),
        fingerprint=tuple(fingerprint),
        roots=tuple(roots) if roots is not None else None,
        val_files_by_class=by_class(val_rows) if val_path else None,
        layout="list",
        val_source=f"the list {val_path.name} beside {list_path.name}" if val_path else "",
        digest=train_digest + val_digest,
        notes=notes,
    )


def val_list_for(list_path: Path) -> Path | None:
    """The validation list beside a list named train.csv/train.txt, or None (then a share is held out)."""
    if list_path.stem.lower() != TRAIN_NAME:
        return None
    found = [list_path.with_name(name + suffix) for name in VAL_NAMES for suffix in LIST_SUFFIXES
             if list_path.with_name(name + suffix).is_file()]
    if len(found) > 1:
        raise DatasetError(f"{list_path.parent} has {len(found)} validation lists beside {list_path.name} "
                           f"({', '.join(p.name for p in found)}): keep one, so that it is clear which validates")
    return found[0] if found else None


def label_order(labels: list[str]):
    """Sort key for class names: numerically when every label is a whole number ("2" before "10"), else as text."""
    if labels and all(label.lstrip("-").isdigit() for label in labels):
        return lambda label: (int(label), label)
    return lambda label: label


@dataclass(frozen=True)
class ListedImages:
    """What one list file lists: ``rows`` (image path, label, its stat), each image once; ``lines`` the line each
    row came from; ``dropped`` the (line, line it repeats) of lines that listed an image again under its label;
    ``digest`` the sha256 of the file's bytes."""

    path: Path
    rows: list[tuple[Path, str, os.stat_result]]
    lines: list[int]
    dropped: list[tuple[int, int]]
    digest: str

    def by_image(self) -> dict[tuple[int, int], int]:
        """Each image (its device and inode: one file however its path is spelled) to its row."""
        return {(result.st_dev, result.st_ino): index for index, (_, _, result) in enumerate(self.rows)}

    def dropped_note(self) -> str | None:
        if not self.dropped:
            return None
        line, first = self.dropped[0]
        many = len(self.dropped) != 1
        return (f"dropped {len(self.dropped)} line{'s' * many} of {self.path.name} that repeat{'' if many else 's'} an "
                f"image it lists already under the same label (e.g. line {line} repeats line {first}): each image is "
                "kept once, so that no copy of it trains while another validates")


def refuse_two_labels(train: ListedImages, val: ListedImages) -> None:
    """DatasetError for an image the training and validation lists give different labels."""
    trained = train.by_image()
    for index, (_, label, result) in enumerate(val.rows):
        other = trained.get((result.st_dev, result.st_ino))
        if other is not None and train.rows[other][1] != label:
            raise two_labels(train.rows[other][0], (train.path, train.lines[other], train.rows[other][1]),
                             (val.path, val.lines[index], label))


def two_labels(image: Path, first: tuple[Path, int, str], second: tuple[Path, int, str]) -> DatasetError:
    (first_list, first_line, first_label), (second_list, second_line, second_label) = first, second
    where = (f"{first_list} lines {first_line} and {second_line}" if first_list == second_list else
             f"{first_list} line {first_line} and {second_list} line {second_line}")
    return DatasetError(f"image {shown_name(os.path.relpath(image, first_list.parent))} is listed under two labels, "
                        f"{shown_name(first_label)} and {shown_name(second_label)} ({where}): give each image one "
                        "label")


def read_list_file(list_path: Path, roots: list[Path] | None, known: list[str] | None = None,
                   train_path: Path | None = None) -> ListedImages:
    """What ``list_path`` lists (``ListedImages``). A line that is not ``path,label``, an image that is missing,
    not an image file, a folder, a broken link or (with ``roots``) outside them, an image listed again under
    another label, or (with ``known``, a validation list) a label not among ``known`` raises DatasetError
    naming the list, the line and the value. An image listed again under its own label is dropped and counted."""
    entry_stat(list_path, roots)  # a missing list, a broken link or a path outside the roots: one line
    with open_checked(list_path, roots) as handle:
        if os.fstat(handle.fileno()).st_size > MAX_LIST_BYTES:
            raise DatasetError(f"list file {list_path} is larger than {MAX_LIST_BYTES // 2**20} MB: split the "
                               "dataset, or give a folder with one sub-folder per class")
        data = handle.read()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"list file {list_path} is not UTF-8 text (byte {exc.start}): save it as UTF-8") from None
    rows, lines, dropped, first = [], [], [], True
    seen: dict[tuple[int, int], int] = {}  # image (device, inode) -> its row: one file however its path is spelled
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"list file {list_path} line {number}"
        fields = split_line(line, list_path)
        if first and [f.lower() for f in fields] == ["path", "label"]:
            first = False
            continue  # a header
        first = False
        if len(fields) != 2 or not all(fields):
            raise DatasetError(f"{where} is {shown_name(line.strip()[:120])!s}: expected path,label (the image's "
                               "path relative to the list, a comma, its class label)")
        name, label = fields
        if known is not None and label not in known:
            raise DatasetError(f"{where}: label {shown_name(label)} is not a label of {train_path.name} (its labels: "
                               f"{', '.join(map(shown_name, known[:20]))}{', ...' if len(known) > 20 else ''})")
        path = list_path.parent / name
        result = checked_image(path, where, name, roots)
        first = seen.get((result.st_dev, result.st_ino))
        if first is not None and rows[first][1] != label:
            raise two_labels(rows[first][0], (list_path, lines[first], rows[first][1]), (list_path, number, label))
        if first is not None:
            dropped.append((number, lines[first]))
            continue
        seen[(result.st_dev, result.st_ino)] = len(rows)
        rows.append((path, label, result))
        lines.append(number)
    if not rows:
        raise DatasetError(f"list file {list_path} lists no image: give one path,label line per image")
    return ListedImages(list_path, rows, lines, dropped, hashlib.sha256(data).hexdigest())


def split_line(line: str, list_path: Path) -> list[str]:
    if list_path.suffix.lower() == ".txt" and "," not in line:
        return [field.strip() for field in line.strip().rsplit(None, 1)]
    return [field.strip() for field in next(csv.reader([line]))]


def checked_image(path: Path, where: str, name: str, roots: list[Path] | None) -> os.stat_result:
    """``path``'s stat if it is an image file that can be read (inside ``roots``, if given), else DatasetError."""
    if not os.path.lexists(path):
        raise DatasetError(f"{where}: image {shown_name(name)} does not exist ({path})")
    try:
        result = entry_stat(path, roots)
    except DatasetError as exc:
        raise DatasetError(f"{where}: {exc}") from None
    if stat.S_ISDIR(result.st_mode):
        raise DatasetError(f"{where}: {shown_name(name)} is a folder, not an image file")
    if not is_image_file(path):
        raise DatasetError(f"{where}: {shown_name(name)} is not an image file (allowed: "
                           f"{', '.join(IMAGE_SUFFIXES)})")
    return result
