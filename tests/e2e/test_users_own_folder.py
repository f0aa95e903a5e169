"""The `parallax` command as installed, run from a user's own folder (not the checkout), as a new user runs it:
the paths typed there (their model file, dataset folder, --config, images to predict, export folders) are that
folder's files, and a run stores them resolved; and `predict` works on the two models a user trains first, their
own built with --model-args and the README's digits run, given an RGB photo of a digit.

    .venv/bin/python -m pytest tests/e2e/test_users_own_folder.py -q
"""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from tests.plugins.user_net import NET_SOURCE
from tests.support import run_dir, run_installed
from tests.trainer_backend.control.test_predict_and_list import write_colour_folder

pytestmark = pytest.mark.processes

SHORT = ("--image-size", "16", "--epochs", "1", "--bn-stats-images", "0", "--quiet")
TINY = ("--model", "test_resnet", "--batch-size", "8", *SHORT)


def write_digit_photo(path: Path) -> Path:
    """What a user has at hand: a phone photo of a 7 in ink on paper, RGB, 120x160, uneven light."""
    rng = np.random.default_rng(7)
    paper = np.linspace(205, 240, 160)[:, None, None] + rng.normal(0, 6, (160, 120, 3))
    image = Image.fromarray(np.clip(paper * np.array([1.0, 0.97, 0.9]), 0, 255).astype(np.uint8))
    ImageDraw.Draw(image).line([(28, 32), (92, 30), (52, 138)], fill=(35, 38, 60), width=11)
    image.save(path)
    return path


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> tuple[Path, Path]:
    """(the user's folder: my_net.py, photo.png, data/colours/, work/; their PARALLAX_HOME)."""
    folder = tmp_path_factory.mktemp("ana")
    (folder / "my_net.py").write_text(NET_SOURCE)
    write_digit_photo(folder / "photo.png")
    write_colour_folder(folder / "data" / "colours", per_class=8, size=16)
    (folder / "work").mkdir()
    return folder, tmp_path_factory.mktemp("home")


def run_id_of(result) -> int:
    last = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0 and last.endswith("status=completed"), result.stdout + result.stderr
    return int(last.split()[0].split("=")[1])


def exported(home: Path, run_id: int, cwd: Path) -> dict:
    result = run_installed("export", str(run_id), cwd=cwd, home=home, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def own_run(user) -> int:
    """Their own network, from the file beside them, sized by --model-args, on digits."""
    folder, home = user
    return run_id_of(run_installed("run", "--model", "my_net.py:Net", "--model-args", '{"width": 16}',
                                   "--batch-size", "64", *SHORT, cwd=folder, home=home, timeout=600))


def test_a_model_file_is_the_one_where_the_user_stands_and_is_stored_resolved(user, own_run):
    folder, home = user
    run = exported(home, own_run, folder)
    source = folder / "my_net.py"
    assert run["config"]["model"] == f"{source}:Net"
    assert run["config"]["model_source"] == f"{source} sha256={hashlib.sha256(source.read_bytes()).hexdigest()}"


def test_predict_builds_the_users_model_with_its_arguments_and_makes_a_photo_what_it_trained_on(user, own_run):
    folder, home = user
    checkpoint = torch.load(run_dir(home, own_run) / "best.pt", weights_only=True)
    assert checkpoint["model_kwargs"] == {"width": 16, "num_classes": 10, "in_chans": 1}  # every argument it took
    result = run_installed("predict", str(own_run), "photo.png", cwd=folder, home=home, timeout=120)
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.strip().splitlines()
    path, label, probability = line.split()
    assert path == str(folder / "photo.png") and label in {str(d) for d in range(10)} and 0.1 <= float(probability) <= 1
    (said,) = result.stderr.strip().splitlines()  # one line: what was done to the photo
    assert said.startswith("predict: 3-channel images made 1-channel (grey, ITU-R 601 luma) as the run's were; "
                           "resized from 120x160 to 16x16; normalised with the training images' mean ("), said


def test_predict_takes_a_photo_with_the_readmes_digits_run(user, shared_runs):
    """`parallax predict RUN photo.png` after a digits run (1 channel), given the RGB photo a user has."""
    folder, _ = user
    run = shared_runs["ddp_tiny"]
    result = run_installed("predict", str(run["run_id"]), "photo.png", "--json", cwd=folder, home=shared_runs.home,
                           timeout=120)
    assert result.returncode == 0, result.stderr
    (prediction,) = json.loads(result.stdout)
    assert prediction["path"] == str(folder / "photo.png") and prediction["class"] in {str(d) for d in range(10)}
    assert "3-channel images made 1-channel" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_dataset_folder_is_one_dataset_however_the_user_spells_it(user):
    folder, home = user
    first = run_id_of(run_installed("run", "--dataset", "data/colours", *TINY, cwd=folder, home=home, timeout=600))
    config = folder / "work" / "colours.json"
    config.write_text(json.dumps({"dataset": "../data/colours", "seed": 1}))
    second = run_id_of(run_installed("run", "--config", "colours.json", *TINY, cwd=folder / "work", home=home,
                                     timeout=600))
    datasets = {exported(home, run_id, folder)["config"]["dataset"] for run_id in (first, second)}
    assert datasets == {str(folder / "data" / "colours")}  # what Compare compares: one dataset

    out = run_installed("export", str(first), "--csv", "out", cwd=folder / "work", home=home, timeout=120)
    assert out.returncode == 0, out.stderr
    with open(folder / "work" / "out" / "epochs.csv") as handle:
        assert [row["epoch"] for row in csv.DictReader(handle)] == ["1"]
    scored = run_installed("predict", str(first), "--folder", "../data/colours", "--json", cwd=folder / "work",
                           home=home, timeout=120)
    assert scored.returncode == 0, scored.stderr
    assert json.loads(scored.stdout)["folder"] == str(folder / "data" / "colours")


def test_a_model_file_that_is_not_there_is_named_where_the_user_stands(user):
    folder, home = user
    result = run_installed("launch", "--model", "nets/missing.py:Net", cwd=folder, home=home, timeout=300)
    assert result.returncode == 2 and "run_id=" not in result.stdout
    assert result.stderr.strip() == (f"error: model '{folder}/nets/missing.py:Net': not importable: "
                                     f"{folder}/nets/missing.py is not a file")


def test_a_module_path_to_a_package_in_the_users_folder_says_how_to_give_it(user):
    """`--model mypkg.nets:Net` beside mypkg/: a module path is imported where a run's supervisor runs, not in the user's
    folder; the refusal says so and gives the file form that works from there (it said 'the working folder', which
    the user took for theirs)."""
    folder, home = user
    (folder / "mypkg").mkdir()
    (folder / "mypkg" / "__init__.py").write_text("")
    (folder / "mypkg" / "nets.py").write_text(NET_SOURCE)
    result = run_installed("run", "--model", "mypkg.nets:Net", *SHORT, cwd=folder, home=home, timeout=300)
    assert result.returncode == 2 and "run_id=" not in result.stdout
    assert result.stderr.strip() == (
        "error: model 'mypkg.nets:Net': not importable: no module named 'mypkg.nets' on the path a run's supervisor imports "
        f"from (Parallax's folder, PYTHONPATH and installed packages); {folder}/mypkg/nets.py is in the folder you run "
        "this in, which a module path is not imported from: give the file (mypkg/nets.py:Net), or put its folder on "
        "PYTHONPATH")
