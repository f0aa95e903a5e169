"""What a user takes away from a run: a checkpoint that says how to use it, ``predict`` with the run's own
preprocessing, and ``list`` filtered and read by programs. A tiny run is trained on a folder of images by
the real CLI; ``predict`` and ``list`` run as processes of their own.

    .venv/bin/python -m pytest tests/trainer_backend/control/test_predict_and_list.py -q
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.support import run_cli, run_dir
from db import make_engine, store

pytestmark = pytest.mark.processes

CLASSES = ("blue", "red")


def write_colour_folder(root: Path, per_class: int = 12, size: int = 20) -> Path:
    """Two classes of noisy images, mostly blue or mostly red; not at the training size (resized, then cropped)."""
    rng = np.random.default_rng(0)
    for channel, name in ((2, "blue"), (0, "red")):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 90, (size, size, 3), dtype=np.uint8)
            pixels[:, :, channel] = rng.integers(150, 255, (size, size), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i:02d}.png")
    return root


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path, int]:
    """(PARALLAX_HOME, dataset folder, run id) of a completed two-epoch run on a colour folder."""
    home = tmp_path_factory.mktemp("home")
    folder = write_colour_folder(tmp_path_factory.mktemp("data") / "colours")
    result = run_cli("run", "--dataset", str(folder), "--model", "test_resnet", "--epochs", "2", "--batch-size", "8",
                     "--image-size", "16", "--stored-size", "20", "--tags", "tiny", "--quiet", home=home, timeout=300)
    last = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0 and last.endswith("status=completed"), result.stdout + result.stderr
    return home, folder, int(last.split()[0].split("=")[1])


def engine_view(home: Path, run_id: int):
    """The run's checkpoint, and every image of its dataset as Parallax's validation made it (stored
    pixels, normalised, centre-cropped), in the folder's order."""
    import torch

    from contract.config import RunConfig
    from trainer_backend.rank.augment import centre_crop
    from trainer_backend.rank.trainer import load_data

    run = store.get_run(make_engine(f"sqlite:///{home / 'parallax.db'}"), run_id)
    checkpoint = torch.load(run_dir(home, run_id) / "best.pt", weights_only=True)
    old_home = os.environ.get("PARALLAX_HOME")
    os.environ["PARALLAX_HOME"] = str(home)  # the run's dataset cache
    try:
        data = load_data(RunConfig.from_dict(run.config))
    finally:
        os.environ.pop("PARALLAX_HOME") if old_home is None else os.environ.__setitem__("PARALLAX_HOME", old_home)
    images = centre_crop(data.train.normalise(data.train.pool_images), run.config["image_size"])
    return checkpoint, data, images


def test_checkpoint_holds_what_using_it_needs(trained):
    home, _, run_id = trained
    checkpoint, data, _ = engine_view(home, run_id)
    assert checkpoint["model_name"] == "test_resnet"
    assert checkpoint["model_kwargs"] == {"num_classes": 2, "in_chans": 3}
    assert checkpoint["class_names"] == list(CLASSES)
    prep = checkpoint["preprocessing"]
    assert prep["image_size"] == 16 and prep["stored_size"] == 20 and prep["bands"] is None
    assert prep["mean"] == pytest.approx(data.train.mean.tolist()) and len(prep["mean"]) == 3
    assert prep["std"] == pytest.approx(data.train.std.tolist()) and min(prep["std"]) > 0


def test_predict_uses_the_runs_preprocessing_and_model(trained):
    """predict's inputs are Parallax's validation inputs, to float rounding; its classes and its folder
    accuracy are what the checkpoint's model says on those inputs."""
    import torch

    from trainer_backend.rank.models import create_model
    from trainer_backend.control.predict import Predictor

    home, folder, run_id = trained
    checkpoint, _, engine_inputs = engine_view(home, run_id)
    paths = [folder / name / f"{i:02d}.png" for name in CLASSES for i in range(12)]
    predictor = Predictor(run_dir(home, run_id) / "best.pt", run_id)
    assert torch.allclose(predictor.inputs(paths), engine_inputs, atol=1e-4)

    model = create_model("test_resnet", num_classes=2, in_chans=3)
    model.load_state_dict(checkpoint["model"])
    with torch.no_grad():
        expected = model.eval()(engine_inputs).argmax(dim=1)
    labels = torch.tensor([0] * 12 + [1] * 12)

    picked = [str(paths[0]), str(paths[13]), str(paths[5])]
    result = run_cli("predict", str(run_id), *picked, home=home, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == picked
    assert [line.split()[1] for line in lines] == [CLASSES[int(expected[i])] for i in (0, 13, 5)]
    assert all(0.5 <= float(line.split()[2]) <= 1.0 for line in lines)

    result = run_cli("predict", str(run_id), "--folder", str(folder), "--json", home=home, timeout=120)
    assert result.returncode == 0, result.stderr
    scored = json.loads(result.stdout)
    assert scored["images"] == 24
    assert scored["accuracy"] == pytest.approx(float((expected == labels).float().mean()))
    assert set(scored["per_class_accuracy"]) == set(CLASSES)


def test_predict_refuses_what_it_cannot_use_in_one_line(trained, tmp_path):
    home, folder, run_id = trained
    strange = write_colour_folder(tmp_path / "strange", per_class=1)
    (strange / "red").rename(strange / "green")
    for args, words in (((str(run_id),), "needs image files or --folder"),
                        ((str(run_id), str(tmp_path / "missing.png")), "is not a file"),
                        (("999", str(folder / "red" / "00.png")), "no run with id 999"),
                        ((str(run_id), "--folder", str(strange)), "class folder(s) green the run was not trained on")):
        result = run_cli("predict", *args, home=home, timeout=120)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and words in lines[0], result.stderr


def test_list_filters_by_status_and_tag_and_shows_accuracy_and_speed(trained):
    home, _, run_id = trained
    engine = make_engine(f"sqlite:///{home / 'parallax.db'}")
    other = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": "single",
                                      "devices": ["cpu"], "tags": ["other"]}, status="failed")
    exported = json.loads(run_cli("export", str(run_id), home=home, timeout=60).stdout)

    listed = [json.loads(line) for line in run_cli("list", "--json", home=home, timeout=60).stdout.splitlines()]
    assert [row["run_id"] for row in listed] == [other, run_id]
    mine = listed[1]
    assert mine["status"] == "completed" and mine["tags"] == ["tiny"] and mine["epochs_done"] == 2
    assert mine["best_val_acc"] == pytest.approx(max(e["val_acc"] for e in exported["epochs"]))
    assert mine["images_per_s"] > 0 and listed[0]["best_val_acc"] is None and listed[0]["images_per_s"] is None

    def ids(*flags: str) -> list[int]:
        result = run_cli("list", *flags, "--json", home=home, timeout=60)
        assert result.returncode == 0, result.stderr
        return [json.loads(line)["run_id"] for line in result.stdout.splitlines()]

    assert ids("--status", "completed") == [run_id]
    assert ids("--status", "failed", "--status", "completed") == [other, run_id]
    assert ids("--tag", "tiny") == [run_id] and ids("--tag", "nothing") == []
    assert ids("--status", "failed", "--tag", "tiny") == []

    text = run_cli("list", "--status", "completed", home=home, timeout=60).stdout.strip().splitlines()
    assert len(text) == 1 and text[0].startswith(f"run_id={run_id} status=completed")
    assert f"best_val_acc={mine['best_val_acc']:.4f}" in text[0] and f"images_per_s={mine['images_per_s']:.1f}" in text[0]
    refused = run_cli("list", "--status", "done", home=home, timeout=60)
    assert refused.returncode == 2 and "--status 'done' is not allowed: choose from queued" in refused.stderr


@pytest.mark.parametrize("damage, words", [("cut in half", "is cut short: its "), ("cut at its end", "is cut short: "),
                                           ("random bytes", "is not a checkpoint: its "), ("empty", "is empty (0 bytes)"),
                                           ("a zip of another file", "cannot be read (RuntimeError: ")])
def test_predict_on_a_damaged_checkpoint_is_one_line_naming_the_file(trained, tmp_path, damage, words):
    import zipfile

    home, folder, run_id = trained
    checkpoint = run_dir(home, run_id) / "best.pt"
    good = checkpoint.read_bytes()
    if damage == "a zip of another file":
        with zipfile.ZipFile(tmp_path / "other.zip", "w") as archive:
            archive.writestr("notes.txt", "not a checkpoint")
        damaged = (tmp_path / "other.zip").read_bytes()
    else:
        damaged = {"cut in half": good[:len(good) // 2], "cut at its end": good[:-30],
                   "random bytes": os.urandom(len(good)), "empty": b""}[damage]
    checkpoint.write_bytes(damaged)
    try:
        result = run_cli("predict", str(run_id), str(folder / "red" / "00.png"), home=home, timeout=120)
    finally:
        checkpoint.write_bytes(good)
    (line,) = result.stderr.strip().splitlines()  # was a traceback: OSError [Errno 22], UnpicklingError ...
    assert result.returncode == 2 and line.startswith(f"error: run {run_id}'s checkpoint {checkpoint} {words}"), line
    assert line.endswith("train the run again (or put back a copy of the file)"), line
