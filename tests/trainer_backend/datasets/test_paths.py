"""What a dataset read may touch, on real files and real links: paths inside the data roots only
(links followed and checked, the file opened being the file checked), a header that declares more
pixels than allowed refused before decoding, CIFAR pickles that may hold only data, and broken links,
link loops and unreadable folders named in one line.

    .venv/bin/python -m pytest tests/trainer_backend/datasets/test_paths.py -q
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

import db
from tests.support import ROOT, run_cli
from db import store
from contract.config import RunConfig
from trainer_backend.datasets import DatasetError, inspect_dataset, prepare_data
from trainer_backend.datasets.builtin import load_cifar_pickle
from trainer_backend.datasets.cache import ImageWriter
from trainer_backend.datasets.folder import decode_image_folder, list_image_folder

# Downloading, decoding and caching are what these tests check: datasets under each test's own home.
pytestmark = pytest.mark.usefixtures("own_data_dir")

TINY_RUN = ("--model", "test_resnet", "--image-size", "8", "--epochs", "1")


def png_set(folder: Path, classes=("forest", "river"), per_class: int = 4) -> Path:
    for index, name in enumerate(classes):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.new("RGB", (8, 8), (60 * index, 20 * i, 90)).save(folder / name / f"{i}.png")
    return folder


@pytest.fixture
def roots(tmp_path):
    """A data root holding a good set, and a folder outside it with a class and a 'secret' image."""
    root = tmp_path / "roots"
    png_set(root / "set")
    outside = png_set(tmp_path / "outside", classes=("secret_class",))
    return root, outside


def one_line(message: str) -> str:
    assert "\n" not in message and "Traceback" not in message, message
    return message


# --- links out of the data roots ---------------------------------------------------------------


def test_a_class_folder_linking_out_of_the_roots_is_refused_where_the_cli_still_follows_it(roots, parallax_home):
    root, outside = roots
    (root / "set" / "leak").symlink_to(outside / "secret_class")
    for read in (lambda: prepare_data(str(root / "set"), image_size=8, data_roots=[root]),
                 lambda: inspect_dataset(str(root / "set"), [root])):
        with pytest.raises(DatasetError) as refused:
            read()
        assert one_line(str(refused.value)).startswith(f"dataset path {root / 'set' / 'leak'} leads outside the data "
                                                       f"roots (to {outside / 'secret_class'})")
    # The CLI reads any folder its user can: the link is followed, the class is there.
    assert "leak" in prepare_data(str(root / "set"), image_size=8).info.class_names


def test_a_file_linking_out_of_the_roots_is_refused_and_a_link_within_them_is_read(roots, parallax_home):
    root, outside = roots
    (root / "set" / "river" / "inside.png").symlink_to(root / "set" / "forest" / "0.png")  # within: fine
    data = prepare_data(str(root / "set"), image_size=8, data_roots=[root])
    assert data.info.num_train + data.info.num_val == 9
    (root / "set" / "river" / "zz.png").symlink_to(outside / "secret_class" / "0.png")
    with pytest.raises(DatasetError, match=f"dataset path {root / 'set' / 'river' / 'zz.png'} leads outside"):
        prepare_data(str(root / "set"), image_size=8, data_roots=[root])


def test_a_file_swapped_for_a_link_after_listing_is_refused_when_opened(roots, parallax_home):
    root, outside = roots
    listing = list_image_folder(root / "set", [root])
    victim = root / "set" / "river" / "1.png"
    victim.unlink()
    victim.symlink_to(outside / "secret_class" / "0.png")  # in the gap between listing and decoding
    with pytest.raises(DatasetError, match=f"dataset path {victim} leads outside the data roots"):
        decode_image_folder(listing, 8, None, None, ImageWriter(io.BytesIO(), parallax_home))


def test_a_run_launched_from_the_dashboard_fails_naming_a_class_link_out_of_the_roots(roots, parallax_home, db_url):
    """The real supervisor process: the top folder is inside the roots, a class folder in it is not."""
    from trainer_backend.control.lifecycle import launch

    root, outside = roots
    (root / "set" / "leak").symlink_to(outside / "secret_class")
    run_id = launch(RunConfig(dataset=str(root / "set"), model="test_resnet", image_size=8, epochs=1),
                    db_url=db_url, data_roots=[root])
    engine = db.make_engine(db_url)
    deadline = time.monotonic() + 120
    while store.get_run(engine, run_id).status in ("queued", "running") and time.monotonic() < deadline:
        time.sleep(0.5)
    run = store.get_run(engine, run_id)
    assert run.status == "failed"
    assert one_line(run.error).startswith(f"dataset path {root / 'set' / 'leak'} leads outside the data roots")
    db.dispose_engines()


# --- broken links, link loops, unreadable folders -------------------------------------------------


def test_a_link_loop_in_a_class_folder_is_one_line_from_the_cli(tmp_path, parallax_home):
    folder = png_set(tmp_path / "set")
    loop = folder / "forest" / "loop.png"
    loop.symlink_to(loop)
    done = run_cli("run", "--dataset", str(folder), *TINY_RUN, home=parallax_home, timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: dataset path {loop} is a link loop (it leads back to itself): remove or fix the link"]


@pytest.mark.parametrize("make", ["broken file link", "broken class link", "loop class link", "folder link loop"])
def test_broken_links_and_loops_are_named_in_one_line(tmp_path, parallax_home, make):
    folder = png_set(tmp_path / "set")
    if make == "broken file link":
        bad = folder / "river" / "gone.png"
        bad.symlink_to(tmp_path / "nowhere.png")
    elif make == "broken class link":
        bad = folder / "lake"
        bad.symlink_to(tmp_path / "no-such-class")
    elif make == "loop class link":
        bad = folder / "lake"
        bad.symlink_to(folder / "lake")
    else:  # a link to a folder above: not followed, so the walk cannot go round
        (folder / "river" / "up").symlink_to(folder)
        data = prepare_data(str(folder), image_size=8)
        assert data.info.num_train + data.info.num_val == 8
        assert any("ignored 1 files that are not images (e.g. river/up)" in w for w in data.info.warnings)
        return
    with pytest.raises(DatasetError) as refused:
        prepare_data(str(folder), image_size=8)
    assert one_line(str(refused.value)).startswith(f"dataset path {bad} is a ")
    # The Launch page reads the same listing (see the page test below).
    with pytest.raises(DatasetError, match=f"dataset path {bad} is a "):
        inspect_dataset(str(folder))


def test_the_launch_page_names_a_link_loop_in_the_dataset_field(tmp_path, parallax_home, monkeypatch):
    from streamlit.testing.v1 import AppTest

    root = tmp_path / "roots"
    folder = png_set(root / "looped")
    loop = folder / "river" / "loop.png"
    loop.symlink_to(loop)
    monkeypatch.setenv("PARALLAX_DATA_ROOTS", str(root))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=90).switch_page("pages/launch.py").run()
    at.selectbox(key="dataset").set_value(str(folder.resolve())).run()
    assert not at.exception
    shown = [e.value for e in at.error]
    assert any(f"dataset path {loop} is a link loop" in text for text in shown), shown
    db.dispose_engines()


def unprivileged(tmp_path: Path) -> tuple[Path, list[str]]:
    """(a folder, a command prefix) to run a process to which a folder with mode 000 is unreadable:
    as root every folder is readable, so there the process runs as nobody, in a folder nobody may reach."""
    if os.geteuid() != 0:
        return Path(tempfile.mkdtemp(dir=tmp_path)), []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot read as another user")
    return (Path(tempfile.mkdtemp(prefix="parallax-unreadable-", dir="/tmp")),
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"])


def test_an_unreadable_class_folder_is_named_in_one_line(tmp_path, parallax_home):
    base, command_prefix = unprivileged(tmp_path)
    try:
        folder = png_set(base / "set")
        home = base / "home"
        home.mkdir()
        for path in [base, home, *folder.rglob("*"), folder]:
            path.chmod(0o777 if path.is_dir() else 0o644)
        (folder / "river").chmod(0o000)
        env = {**os.environ, "PARALLAX_HOME": str(home), "PYTHONPATH": str(ROOT)}
        env.pop("PARALLAX_DB_URL", None)
        done = subprocess.run([*command_prefix, sys.executable, "-m", "trainer_backend", "run", "--dataset", str(folder),
                               *TINY_RUN], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip().splitlines() == [
            f"error: dataset path {folder / 'river'} cannot be read (permission denied): make it readable to this "
            "user, or move it out of the dataset folder"]
    finally:
        (base / "set" / "river").chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)


def test_the_launch_form_skips_an_unreadable_data_root(tmp_path):
    base, command_prefix = unprivileged(tmp_path)
    try:
        png_set(base / "readable" / "set")
        (base / "locked").mkdir()
        for path in [base, *base.rglob("*")]:
            path.chmod(0o777 if path.is_dir() else 0o644)
        (base / "locked").chmod(0o000)
        env = {**os.environ, "PARALLAX_HOME": str(base / "home"), "PYTHONPATH": str(ROOT),
               "PARALLAX_DATA_ROOTS": f"{base / 'locked'}:{base / 'readable'}"}
        done = subprocess.run([*command_prefix, sys.executable, "-c",
                               "from ui.options import dataset_folders; print(dataset_folders())"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        assert done.stdout.strip() == repr([str(base / "readable" / "set")])
    finally:
        (base / "locked").chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)


# --- a header that declares more than it holds ------------------------------------------------------


def tiff_declaring(path: Path, height: int, width: int, bands: int = 13) -> Path:
    """A real tiled TIFF of 32x32 pixels whose header then claims ``height`` x ``width``: a few
    kilobytes on disk, gigabytes once decoded."""
    tifffile.imwrite(path, np.zeros((32, 32, bands), np.uint16), tile=(16, 16), photometric="minisblack",
                     planarconfig="contig")
    with tifffile.TiffFile(path, mode="r+b") as tiff:
        tiff.pages[0].tags["ImageWidth"].overwrite(width)
        tiff.pages[0].tags["ImageLength"].overwrite(height)
    return path


def test_a_tiff_declaring_43_gb_is_refused_before_decoding_in_the_dashboard_and_the_run(tmp_path, parallax_home):
    folder = tmp_path / "set"
    for name in ("Forest", "River"):
        (folder / name).mkdir(parents=True)
        for i in range(2):
            tifffile.imwrite(folder / name / f"{i}.tif", np.full((8, 8, 13), 100, np.uint16))
    bomb = tiff_declaring(folder / "Forest" / "0.tif", 40960, 40960)  # the first file: the one inspected
    assert bomb.stat().st_size < 64 * 1024
    # In a child whose address space is capped: were the header trusted, decoding would fail there
    # (MemoryError) instead of filling this machine's memory.
    probe = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, 8 * 2**30))\n"
        "from trainer_backend.datasets import DatasetError, inspect_dataset, prepare_data\n"
        "print(inspect_dataset(sys.argv[1])['problems'][0])\n"
        "try:\n"
        "    prepare_data(sys.argv[1], image_size=8)\n"
        "except DatasetError as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "PARALLAX_HOME": str(parallax_home), "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", probe, str(folder)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    expected = (f"image {bomb} declares 40960 x 40960 x 13 pixels (40.6 GiB decoded, 83,200 MiB at the decode's "
                "peak), more than the 1024 MiB one image may take (PARALLAX_MAX_IMAGE_MB): it is not decoded")
    assert [line.split("; remove")[0] for line in done.stdout.splitlines()] == [expected, expected]
    assert time.monotonic() - started < 60


def test_a_png_over_the_image_limit_is_refused_from_its_header(tmp_path, parallax_home, monkeypatch):
    folder = png_set(tmp_path / "set")
    Image.new("RGB", (1200, 1000)).save(folder / "river" / "big.png")  # 3.4 MiB decoded, a few KB on disk
    monkeypatch.setenv("PARALLAX_MAX_IMAGE_MB", "2")
    # PIL holds it in 4.6 MiB (four bytes a pixel); shrunk in uint8 before it is made float.
    with pytest.raises(DatasetError, match=r"image .*big.png declares 1000 x 1200 x 3 pixels \(0.0 GiB decoded, 5 MiB "
                                           r"at the decode's peak\), more than the 2 MiB"):
        prepare_data(str(folder), image_size=8)
    monkeypatch.setenv("PARALLAX_MAX_IMAGE_MB", "6")
    data = prepare_data(str(folder), image_size=8)
    assert data.info.num_train + data.info.num_val == 9


# --- CIFAR-10 pickles hold data, never code ---------------------------------------------------------


class RunsACommand:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def write_cifar(folder: Path, protocol: int, poisoned: object | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for batch in range(1, 6):
        labels = list(range(10))
        entry = {b"batch_label": f"batch {batch} of 5".encode(), b"labels": labels,
                 b"data": np.repeat(np.array(labels, dtype=np.uint8)[:, None] * 25, 3072, axis=1),
                 b"filenames": [f"img{i}.png".encode() for i in labels]}
        if poisoned is not None and batch == 3:
            entry[b"data"] = poisoned
        (folder / f"data_batch_{batch}").write_bytes(pickle.dumps(entry, protocol=protocol))


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_a_cifar_batch_in_its_format_loads(parallax_home, protocol):
    write_cifar(parallax_home / "data" / "cifar-10-batches-py", protocol)
    data = prepare_data("cifar10", image_size=8)
    assert (data.info.num_train, data.info.num_val, data.info.in_chans) == (40, 10, 3)


def test_a_cifar_batch_that_would_run_a_command_is_refused_in_one_line(parallax_home, tmp_path):
    marker = tmp_path / "ran"
    write_cifar(parallax_home / "data" / "cifar-10-batches-py", 2, poisoned=RunsACommand(marker))
    with pytest.raises(DatasetError) as refused:
        prepare_data("cifar10", image_size=8)
    assert one_line(str(refused.value)) == (
        f"cannot read cifar10 batch {parallax_home / 'data' / 'cifar-10-batches-py' / 'data_batch_3'}: it names "
        f"{os.system.__module__}.system, which a CIFAR-10 file never holds (only dicts, lists, bytes and numpy "
        "arrays); refused without running it")
    assert not marker.exists()
    # Any other callable is refused the same way, e.g. builtins.eval.
    with pytest.raises(pickle.UnpicklingError, match="builtins.eval"):
        load_cifar_pickle(io.BytesIO(b"cbuiltins\neval\n(S'1+1'\ntR."))
