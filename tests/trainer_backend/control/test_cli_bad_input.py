"""Bad input is refused in seconds with one line naming the value and what is allowed, exit code 2,
no traceback, and nothing left behind: no run row, no run folder.

Most cases go in-process through ``trainer_backend.control.cli.main`` (the very code ``python -m
trainer_backend run`` runs: argument parsing, RunConfig, the database check, preflight); a few go
through the real CLI in a subprocess. A full disk while writing a checkpoint or a profiler trace
is made real with a small tmpfs mounted on ``PARALLAX_HOME/runs`` (or, where mounting is not
allowed, a file size limit in the child, which gives EFBIG).

    .venv/bin/python -m pytest tests/trainer_backend/control/test_cli_bad_input.py -q
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.support import ROOT, run_cli, run_dir
from trainer_backend.control.cli import main

BASE = ["run", "--model", "test_resnet", "--image-size", "16", "--epochs", "1", "--quiet"]


def write_images(folder: Path, count: int, size: tuple[int, int] = (8, 8)) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(folder / f"{i}.png")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Path:
    """One folder per kind of bad dataset."""
    root = tmp_path_factory.mktemp("datasets")
    (root / "empty").mkdir()
    write_images(root / "one_class" / "cats", 4)
    for name in ("corrupt", "odd_sizes", "good"):
        write_images(root / name / "a", 4)
        write_images(root / name / "b", 4)
    (root / "corrupt" / "a" / "broken.png").write_bytes(b"not a png at all")
    write_images(root / "odd_sizes" / "a", 1, size=(3, 200))
    write_images(root / "odd_sizes" / "b", 1, size=(1, 1))
    for label in ("a", "b"):
        (root / "text_only" / label).mkdir(parents=True)
        for i in range(3):
            (root / "text_only" / label / f"{i}.txt").write_text("not an image")
    return root


# (id, flags, words the one line must hold, extra environment)
CASES = [
    ("batch-zero", ["--batch-size", "0"], ["batch_size 0", "1 to 65536"], {}),
    ("batch-negative", ["--batch-size", "-5"], ["batch_size -5", "1 to 65536"], {}),
    ("batch-absurd", ["--batch-size", "99999999"], ["batch_size 99999999", "1 to 65536"], {}),
    ("batch-not-a-number", ["--batch-size", "abc"], ["--batch-size", "invalid int value: 'abc'"], {}),
    ("epochs-zero", ["--epochs", "0"], ["epochs 0", "1 to 10000"], {}),
    ("epochs-absurd", ["--epochs", "1000000"], ["epochs 1000000", "1 to 10000"], {}),
    ("lr-nan", ["--lr", "nan"], ["lr nan", "a finite number above 0"], {}),
    ("lr-inf", ["--lr", "inf"], ["lr inf", "a finite number above 0"], {}),
    ("lr-negative", ["--lr", "-1"], ["lr -1.0", "a finite number above 0"], {}),
    ("lr-zero", ["--lr", "0"], ["lr 0.0"], {}),
    ("image-size-zero", ["--image-size", "0"], ["image_size 0", "8 to 1024"], {}),
    ("image-size-absurd", ["--image-size", "100000"], ["image_size 100000", "8 to 1024"], {}),
    ("microbatches-zero", ["--strategy", "pp", "--devices", "cpu,cpu", "--microbatches", "0"],
     ["microbatches 0", "1 to 1024"], {}),
    ("workers-negative", ["--num-workers", "-1"], ["num_workers -1", "0 to 64"], {}),
    ("workers-absurd", ["--num-workers", "999"], ["num_workers 999", "0 to 64"], {}),
    ("profile-wait-negative", ["--profile", "--profile-wait", "-1"], ["profile_wait -1", "0 to 100"], {}),
    ("profile-active-zero", ["--profile", "--profile-active", "0"], ["profile_active 0", "1 to 100"], {}),
    ("profile-active-absurd", ["--profile", "--profile-active", "1000000"], ["profile_active 1000000"], {}),
    # digits: 1,437 training images in batches of 128 are 12 steps an epoch
    ("profile-wait-past-epoch", ["--profile", "--profile-wait", "20"],
     ["--profile-wait 20 and --profile-warmup 1 start the profiled window at step 22", "an epoch has 12 steps",
      "add up to at most 11"], {}),
    ("val-fraction", ["--val-fraction", "1.5"], ["val_fraction 1.5", "(0.0, 0.9]"], {}),
    ("unknown-strategy", ["--strategy", "zero3"], ["--strategy", "'zero3'", "single", "fsdp"], {}),
    ("unknown-optimizer", ["--optimizer", "lion"], ["--optimizer", "'lion'", "adamw"], {}),
    ("unknown-model", ["--model", "resnet_nope"], ["unknown model 'resnet_nope'", "did you mean"], {}),
    # a path, made absolute where the command runs: named so
    ("unknown-dataset", ["--dataset", "imagenet"], ["/imagenet' is neither a built-in", "digits", "existing folder"],
     {}),
    ("single-on-two-devices", ["--devices", "cpu,cpu"], ["strategy single", "got 2 (cpu,cpu)"], {}),
    ("mp-on-one-device", ["--strategy", "mp"], ["strategy mp", "at least 2 devices"], {}),
    ("pp-on-one-device", ["--strategy", "pp"], ["strategy pp", "at least 2 devices"], {}),
    ("gpu-not-present", ["--strategy", "ddp", "--devices", "cuda:62,cuda:63"], ["cuda:62 does not exist"], {}),
    ("device-malformed", ["--devices", "gpu0"], ["'gpu0'", "'cpu', 'cuda:N'"], {}),
    ("device-index-malformed", ["--devices", "cuda:x"], ["'cuda:x'", "'cpu', 'cuda:N'"], {}),
    ("devices-empty", ["--devices", ","], ["device ''", "'cpu', 'cuda:N'"], {}),
    ("cpu-and-gpu-mixed", ["--strategy", "ddp", "--devices", "cpu,0"], ["mix CPU and GPU"], {}),
    ("data-on-device-unknown", ["--data-on-device", "always"], ["--data-on-device", "'always'", "'auto', 'on', 'off'"], {}),
    ("data-on-device-on-a-cpu", ["--data-on-device", "on"], ["data_on_device on keeps the dataset on a GPU",
                                                             "trains on cpu", "use auto or off"], {}),
    ("ddp-batch-uneven", ["--strategy", "ddp", "--devices", "cpu,cpu", "--batch-size", "5"],
     ["batch_size 5", "multiple of 2"], {}),
    ("folder-missing", ["--dataset", "{root}/missing"], ["{root}/missing", "does not exist"], {}),
    ("folder-empty", ["--dataset", "{root}/empty"], ["{root}/empty has no class sub-folders"], {}),
    ("folder-one-class", ["--dataset", "{root}/one_class"], ["1 class sub-folder (cats)", "at least 2"], {}),
    ("folder-corrupt-image", ["--dataset", "{root}/corrupt"], ["cannot read image {root}/corrupt/a/broken.png"], {}),
    ("folder-no-images", ["--dataset", "{root}/text_only"], ["class 'a'", "0 image(s)", "at least 2"], {}),
    ("folder-is-a-file", ["--dataset", "{root}/good/a/0.png"], ["is not a directory"], {}),
    ("folder-too-many-images", ["--dataset", "{root}/good"], ["8 images, more than the 5", "PARALLAX_MAX_IMAGES"],
     {"PARALLAX_MAX_IMAGES": "5"}),
    ("folder-too-large-decoded", ["--dataset", "{root}/good", "--image-size", "1024"],
     ["would take 0.0 GiB", "image_size 1024", "PARALLAX_MAX_DECODED_MB"], {"PARALLAX_MAX_DECODED_MB": "1"}),
    ("decode-limit-malformed", ["--dataset", "{root}/good"], ["PARALLAX_MAX_IMAGES='lots'", "whole number"],
     {"PARALLAX_MAX_IMAGES": "lots"}),
    ("image-size-model-cannot-take", ["--model", "vit_tiny_patch16_224", "--image-size", "16"],
     ["'vit_tiny_patch16_224' cannot take 16x16 images", "larger --image-size"], {}),
    ("database-url-malformed", ["--db", "notaurl"], ["'notaurl' is not a database URL"], {}),
    ("database-unreachable", ["--db", "postgresql+psycopg://parallax:secret@127.0.0.1:1/parallax"],
     ["cannot open the database postgresql+psycopg://parallax:***@127.0.0.1:1/parallax", "Connection refused"], {}),
    ("config-file-nan-batch", ["--config", "{root}/bad.json"], ["batch_size nan"], {}),
]


def expand(items: list[str], root: Path) -> list[str]:
    return [item.replace("{root}", str(root)) for item in items]


def argv_for(flags: list[str]) -> list[str]:
    # --db is a flag of the program, before the command.
    if flags[:1] == ["--db"]:
        return flags[:2] + BASE + flags[2:]
    return BASE + flags


def assert_nothing_left(home: Path) -> None:
    """No run row and no run folder: a refused command leaves nothing to clean up."""
    runs = home / "runs"
    assert not runs.exists() or not any(runs.iterdir()), list(runs.rglob("*"))
    database = home / "parallax.db"
    if database.exists():
        import sqlite3

        with contextlib.closing(sqlite3.connect(database)) as connection:
            assert connection.execute("select count(*) from runs").fetchone() == (0,)


@pytest.mark.parametrize("case, flags, words, env", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_line_and_leaves_nothing(case, flags, words, env, folders, parallax_home,
                                                        monkeypatch, capsys):
    (folders / "bad.json").write_text('{"batch_size": NaN}')
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    started = time.monotonic()
    try:
        code = main(argv_for(expand(flags, folders)))
    except SystemExit as exc:  # argparse refuses a flag by exiting
        code = exc.code
    elapsed = time.monotonic() - started
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("error: ") and "Traceback" not in err
    for word in expand(words, folders):
        assert word in lines[0], lines[0]
    assert elapsed < 15, f"refusing {case} took {elapsed:.1f} s"
    assert_nothing_left(parallax_home)


def test_images_of_odd_sizes_are_resized_with_a_warning(folders, parallax_home):
    from trainer_backend.datasets import prepare_data

    data = prepare_data(str(folders / "odd_sizes"), image_size=16)
    assert tuple(data.train.images.shape[1:]) == (3, 16, 16)
    assert any("different sizes" in w and "resized to 16x16" in w for w in data.info.warnings), data.info.warnings


# --- the real CLI, in a subprocess --------------------------------------------------------------

SUBPROCESS_CASES = [
    ("unknown-strategy", ["--strategy", "zero3"], "invalid choice: 'zero3'", {}),
    ("folder-corrupt-image", ["--dataset", "{root}/corrupt"], "cannot read image", {}),
    ("pretrained-offline", ["--model", "resnet18", "--pretrained"], "pretrained weights for 'resnet18' are not in",
     {"HF_HUB_OFFLINE": "1"}),
    ("database-unreachable", ["--db", "postgresql+psycopg://parallax@127.0.0.1:1/parallax"],
     "cannot open the database", {}),
]


@pytest.mark.parametrize("case, flags, words, env", SUBPROCESS_CASES, ids=[c[0] for c in SUBPROCESS_CASES])
def test_cli_refuses_in_one_line_with_nothing_left(case, flags, words, env, folders, parallax_home):
    started = time.monotonic()
    result = run_cli(*argv_for(expand(flags, folders)), home=parallax_home, timeout=60, env_extra=env)
    elapsed = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], result.stderr
    assert "Traceback" not in result.stderr and "run_id=" not in result.stdout
    assert elapsed < 30, f"{case} took {elapsed:.1f} s"
    listed = run_cli("list", home=parallax_home, timeout=60)
    assert listed.returncode == 0 and listed.stdout == "", listed.stdout + listed.stderr
    assert_nothing_left(parallax_home)


@contextlib.contextmanager
def mounted_tmpfs(path: Path, *options: str):
    """A tmpfs on ``path`` (root only); raises PermissionError where mounting is not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(path)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise PermissionError(result.stderr.strip())
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def read_only_dir(tmp_path):
    """A folder nobody can write into: a read-only tmpfs as root, else a folder without write permission."""
    folder = tmp_path / "read-only"
    try:
        with mounted_tmpfs(folder, "ro", "size=1m"):
            yield folder
    except PermissionError:
        if os.geteuid() == 0:
            pytest.fail("cannot make a read-only folder: mounting is not permitted here and root ignores permissions")
        folder.mkdir(exist_ok=True)
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)


def test_database_in_a_read_only_folder_is_named(read_only_dir, parallax_home, capsys):
    url = f"sqlite:///{read_only_dir / 'parallax.db'}"
    assert main(["--db", url, *BASE]) == 2
    line = capsys.readouterr().err.strip()
    assert line == (f"error: cannot open the database {url}: unable to open database file (the folder "
                    f"{read_only_dir} is read-only); check that it exists, is reachable and writable, or give "
                    "another with --db or PARALLAX_DB_URL")
    assert_nothing_left(parallax_home)


FILE_SIZE_LIMIT = 5 * 2**18  # 1.25 MiB


def run_with_a_small_disk(home: Path, *flags: str) -> subprocess.CompletedProcess:
    """``trainer_backend run`` with ``home/runs`` on a 48 KiB tmpfs (as root), else with a 1.25 MiB
    file size limit in the child (EFBIG), which the database and the digits cache stay under and
    test_resnet's 1.5 MB checkpoint does not."""
    try:
        with mounted_tmpfs(home / "runs", "size=48k"):
            return run_cli("run", *flags, home=home, timeout=300)
    except PermissionError:
        env = {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        env.pop("PARALLAX_DB_URL", None)
        command = [sys.executable, "-m", "trainer_backend", "run", *flags]

        def limit_file_size():
            resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))

        return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                              preexec_fn=limit_file_size)


@pytest.mark.parametrize("what, flags, path, epochs_kept", [
    ("checkpoint", [], "best.pt", [1]),
    ("profiler trace", ["--profile", "--profile-wait", "0", "--profile-warmup", "0", "--profile-active", "1"],
     "profile/rank0.json", []),  # the trace is written inside epoch 1, before any epoch ends
], ids=["checkpoint", "trace"])
def test_disk_full_fails_the_run_with_the_reason_and_keeps_its_metrics(what, flags, path, epochs_kept, parallax_home):
    result = run_with_a_small_disk(parallax_home, "--dataset", "digits", "--model", "test_resnet", "--image-size", "16",
                                   "--epochs", "1", "--batch-size", "256", "--quiet", *flags)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1] == "run_id=1 status=failed"
    error_line = result.stderr.strip().splitlines()[-1]
    folder = run_dir(parallax_home, 1)
    assert error_line.startswith(f"error: disk full while writing {what} {folder}/{path} ("), result.stderr
    assert "the metrics recorded so far are kept" in error_line and "Traceback" not in result.stderr
    exported = json.loads(run_cli("export", "1", home=parallax_home).stdout)
    assert exported["status"] == "failed" and exported["error"] == error_line.removeprefix("error: ")
    assert [epoch["epoch"] for epoch in exported["epochs"]] == epochs_kept
    left = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    partial = [name for name in left if name.endswith(("best.pt", ".part", ".tmp")) or name.startswith("profile/")]
    assert partial == [], left


# --- the Launch form ----------------------------------------------------------------------------


def test_launch_form_shows_bad_values_next_to_their_fields_and_does_not_launch(folders, parallax_home, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from db import dispose_engines, list_runs, make_engine

    monkeypatch.setenv("PARALLAX_DATA_ROOTS", str(folders))
    monkeypatch.setenv("PARALLAX_MAX_IMAGES", "5")
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=90).run()
    at.selectbox(key="dataset").set_value(str((folders / "good").resolve()))
    at.number_input(key="image_size").set_value(4)
    at.number_input(key="lr").set_value(0.0).run()

    def errors_beside(label: str) -> list[str]:
        column = [c for c in at.columns if any(w.label.startswith(label) for w in [*c.number_input, *c.selectbox])][-1]
        return [e.value for e in column.error]

    # The Data column: each error right under its own field, in the order of the fields.
    dataset_error, size_error = errors_beside("Dataset")
    assert "good has 8 images, more than the 5" in dataset_error and "PARALLAX_MAX_IMAGES" in dataset_error
    assert size_error == "image_size 4 is not allowed: use a whole number from 8 to 1024"
    assert errors_beside("Learning rate") == ["lr 0.0 is not allowed: use a finite number above 0"]
    launch = next(b for b in at.button if b.label == "Launch")
    assert launch.disabled  # a browser cannot press it (AppTest refuses to, too)
    at.run()
    assert list_runs(make_engine()) == [] and not (parallax_home / "runs").exists()
    dispose_engines()
