"""The speed switches and the evaluation figures: device-side augmentation, uint8 batches normalised
on the device, channels_last, torch.compile (timed apart), and the best epoch's confusion matrix.

torch.compile runs on this CPU (gcc is there: TorchInductor compiles C++); it is tried on a
three-layer model at 8 px, which compiles in seconds, and once end to end on timm's test_resnet.
"""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainer_backend.rank.augment import random_flip, random_resized_crop
from trainer_backend.control.cli import main
from contract.config import ConfigError, RunConfig
from trainer_backend.rank.confusion import add_confusion, confusion_record, val_totals
from trainer_backend.rank.inputs import DeviceInputs
from trainer_backend.rank.speed import compile_model, compile_warmup, to_memory_format
from trainer_backend.rank.strategies import Strategy
from trainer_backend.rank.trainer import build_loaders, load_data

HAS_COMPILER = shutil.which("gcc") is not None or shutil.which("cc") is not None


def ramp_images(count: int, size: int = 8) -> torch.Tensor:
    """Images whose every pixel holds its own x coordinate plus 100 x the image's index."""
    x = torch.arange(size, dtype=torch.float32).view(1, 1, 1, size).expand(count, 3, size, size)
    return x + 100 * torch.arange(count, dtype=torch.float32).view(count, 1, 1, 1)


# --- augmentation ---


def test_flip_mirrors_some_images_and_leaves_the_others():
    images = ramp_images(64)
    flipped = random_flip(images, torch.Generator().manual_seed(0))
    assert flipped.shape == images.shape
    mirrored = [bool(torch.equal(f, i.flip(-1))) for f, i in zip(flipped, images)]
    kept = [bool(torch.equal(f, i)) for f, i in zip(flipped, images)]
    assert all(m != k for m, k in zip(mirrored, kept))  # each image either mirrored or untouched
    assert 16 < sum(mirrored) < 48  # about half, per image


def test_crop_stays_inside_each_image_and_really_crops():
    images = ramp_images(32)
    cropped = random_resized_crop(images, torch.Generator().manual_seed(0), area=(0.25, 0.25), aspect=(1.0, 1.0))
    assert cropped.shape == images.shape
    for index, image in enumerate(cropped):
        x = image - 100 * index  # back to x coordinates: the image's own pixels, never another's
        assert x.min() >= -1e-4 and x.max() <= 7 + 1e-4
        assert x.max() - x.min() <= 3.5 + 1e-3  # half the width: a quarter of the area at aspect 1
        assert torch.all(x[..., 1:] >= x[..., :-1] - 1e-4)  # a crop, not a flip
    whole = random_resized_crop(images, None, area=(1.0, 1.0), aspect=(1.0, 1.0))
    assert torch.allclose(whole, images, atol=1e-4)  # the whole image at its own size is itself


def test_training_batches_are_augmented_on_the_device_and_validation_batches_never(parallax_home):
    config = RunConfig(image_size=8, augment="crop,flip")
    assert config.augment == "flip,crop"  # one canonical order, whatever was typed
    data = load_data(config)
    pixels, labels = data.train.__getitems__(list(range(64)))
    strategy = Strategy(config)
    strategy.inputs = DeviceInputs.for_run(config, data.train.normalise, strategy.input_device)
    train_images, train_labels = strategy.to_device(pixels, labels, train=True)
    val_images, val_labels = strategy.to_device(pixels, labels)
    assert train_images.shape == val_images.shape == (64, 1, 8, 8) and train_images.dtype == torch.float32
    assert torch.equal(train_labels, labels) and torch.equal(val_labels, labels)
    assert torch.equal(val_images, data.train.normalise(pixels))
    assert not torch.allclose(train_images, val_images)
    again = DeviceInputs.for_run(config, data.train.normalise, strategy.input_device)(pixels, train=True)
    assert torch.equal(again, train_images)  # seeded: a run repeats


# --- uint8 to the device ---


@pytest.mark.parametrize("source", ["digits", "tiff"])
def test_stored_pixels_normalised_on_the_device_match_the_float_pipeline(source, parallax_home, tmp_path):
    from tests.trainer_backend.datasets.test_prepare import make_tiff_folder

    dataset = "digits" if source == "digits" else str(make_tiff_folder(tmp_path / "eurosat"))
    config = RunConfig(dataset=dataset, image_size=16)
    data = load_data(config)
    pixels, _ = data.val.__getitems__(list(range(len(data.val))))
    assert pixels.dtype == (torch.uint8 if source == "digits" else torch.float16)  # a quarter / half the bytes
    # What the loader used to hand over: float32 in [0, 1], then (x - mean) / std per channel.
    # (A constant band has std 0, clamped: compared in pixel units, within 1/255 of full scale.)
    unit = pixels.float() / (255 if pixels.dtype == torch.uint8 else 1)
    mean, std = data.train.mean.view(-1, 1, 1), data.train.std.clamp(min=1e-6).view(-1, 1, 1)
    before = (unit - mean) / std
    after = DeviceInputs.for_run(config, data.val.normalise, torch.device("cpu"))(pixels)
    assert after.dtype == torch.float32 and after.shape == before.shape
    assert torch.allclose(after * std + mean, before * std + mean, atol=1 / 255)
    if source == "digits":
        assert torch.allclose(after, before, atol=(1 / 255) / std.min().item())


# --- channels_last and torch.compile ---


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def first_losses(config: RunConfig, steps: int = 3) -> tuple[list[float], float | None, list[torch.Tensor]]:
    """Training losses of the first ``steps`` steps, the compile warm-up's seconds (None without
    compile) and the BatchNorm buffers the warm-up left."""
    data = load_data(config)
    strategy = Strategy(config)
    strategy.inputs = DeviceInputs.for_run(config, data.train.normalise, strategy.input_device)
    loaders = build_loaders(data, config, strategy)
    model = strategy.wrap(to_memory_format(small_model(), config))
    before = [b.clone() for b in model.buffers()]
    warmup_s = None
    if config.compile:
        compile_model(model, strategy)
        warmup_s = compile_warmup(model, loaders, strategy, None)
    after_warmup = [b.clone() for b in model.buffers()]
    assert all(torch.equal(a, b) for a, b in zip(before, after_warmup))  # the warm-up left no trace
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    model.train()
    for step, batch in enumerate(loaders[0]):
        if step == steps:
            break
        images, labels = strategy.to_device(*batch, train=True)
        if config.channels_last:
            assert images.is_contiguous(memory_format=torch.channels_last)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, warmup_s, after_warmup


def test_channels_last_gives_the_eager_losses(parallax_home):
    config = RunConfig(image_size=8, batch_size=64)
    eager, _, _ = first_losses(config)
    channels_last, _, _ = first_losses(config.replace(channels_last=True))
    assert channels_last == pytest.approx(eager, rel=1e-4)


@pytest.mark.skipif(not HAS_COMPILER, reason="torch.compile on CPU needs a C++ compiler (gcc); none here")
@pytest.mark.timeout(300)
@pytest.mark.processes  # inductor compiles in worker processes
def test_compile_gives_the_eager_losses_and_times_its_warmup_apart(parallax_home):
    config = RunConfig(image_size=8, batch_size=64)
    eager, _, _ = first_losses(config)
    compiled, warmup_s, _ = first_losses(config.replace(compile=True))
    assert warmup_s > 0
    assert compiled == pytest.approx(eager, rel=1e-3)


# --- confusion matrix ---


def test_confusion_counts_equal_a_hand_count():
    labels = torch.tensor([0, 0, 1, 1, 1, 2, 2, 0])
    predictions = torch.tensor([0, 1, 1, 1, 2, 2, 0, 0])
    totals = val_totals(3, torch.device("cpu"))
    add_confusion(totals, predictions, labels)
    add_confusion(totals, predictions[:2], labels[:2])  # a second batch adds on
    hand = [[2 + 1, 1 + 1, 0], [0, 2, 1], [1, 0, 1]]  # rows true, columns predicted; + the second batch
    record = confusion_record(4, ["a", "b", "c"], totals[3:].tolist())
    assert record["matrix"] == hand and record["epoch"] == 4 and record["class_names"] == ["a", "b", "c"]
    assert record["per_class_acc"] == pytest.approx([3 / 5, 2 / 3, 1 / 2])
    assert record["support"] == [5, 3, 2]
    empty = confusion_record(1, ["a", "b"], [0, 0, 0, 0])
    assert empty["per_class_acc"] == [None, None]  # no image of a class: no accuracy, not 0 %


def test_ddp_sums_the_confusion_matrix_over_ranks(shared_runs):
    run = shared_runs["ddp_tiny"]
    record = run["measurements"]["confusion"]
    best = max(run["epochs"], key=lambda e: e["val_acc"])
    assert record["epoch"] == best["epoch"] and record["class_names"] == [str(d) for d in range(10)]
    matrix = torch.tensor(record["matrix"])
    # Each rank evaluated its own strided shard; the sum holds every validation image once.
    assert matrix.sum().item() == 360
    assert matrix.diagonal().sum().item() / 360 == pytest.approx(best["val_acc"])
    assert "confusion" not in best.get("extra", {})  # kept once per run, not in every epoch


def test_compile_time_is_recorded_apart_and_noted(db_url, parallax_home):
    from db import make_engine, store
    from db.recorded_by import parallax_version
    from trainer_backend.rank.trainer import _record_compile_time
    from trainer_backend.telemetry.recorder import Recorder

    config = RunConfig(image_size=8, compile=True)
    engine = make_engine(db_url)
    run_id = store.create_run(engine, config.to_dict(), status="running", world_size=1)
    _record_compile_time(Recorder(engine, run_id), Strategy(config), 12.3456)
    assert store.get_run(engine, run_id).measurements == {"compile_time_s": 12.346, "parallax_version": parallax_version()}
    note, = store.get_run(engine, run_id).notes
    assert note.startswith("torch.compile: compiling the training step took 12.3 s before epoch 1")
    # One batch shape, one compiled graph: a compiled run's training drops the short last batch.
    train_loader, _ = build_loaders(load_data(config), config, Strategy(config))
    assert train_loader.drop_last and not build_loaders(load_data(config), config.replace(compile=False),
                                                        Strategy(config))[0].drop_last


# --- refused values ---


@pytest.mark.parametrize("flags, words", [
    (["--augment", "rotate"], ["augment 'rotate' is not allowed", "flip, crop"]),
    (["--augment", "flip,none"], ["augment 'flip,none'"]),
    (["--compile", "--strategy", "pp", "--devices", "cpu,cpu"], ["compile is not allowed with strategy pp"]),
    (["--compile", "--strategy", "dp"], ["compile is not allowed with strategy dp", "use single, ddp"]),
    (["--compile", "--strategy", "fsdp", "--devices", "cpu,cpu"], ["compile is not allowed with strategy fsdp"]),
    (["--channels-last", "--strategy", "pp", "--devices", "cpu,cpu"], ["channels_last is not allowed with strategy pp"]),
    (["--channels-last", "--strategy", "fsdp", "--devices", "cpu,cpu"], ["channels_last is not allowed with strategy fsdp"]),
])
def test_bad_switches_are_refused_in_one_line(flags, words, parallax_home, capsys):
    code = main(["run", "--model", "test_resnet", "--image-size", "8", "--epochs", "1", "--quiet", *flags])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    for word in words:
        assert word in lines[0], lines[0]


def test_config_files_are_checked_like_flags():
    assert RunConfig.from_dict({"augment": ["crop", "flip"]}).augment == "flip,crop"
    assert RunConfig(augment="").augment == "none"
    for bad in ({"augment": 3}, {"channels_last": "yes"}, {"compile": 1}):
        with pytest.raises(ConfigError) as caught:
            RunConfig.from_dict(bad)
        assert caught.value.field == next(iter(bad))


# --- Run page ---


def test_confusion_figure_caps_the_classes_it_draws_and_says_so():
    from reports.confusion_charts import confusion_figure, per_class_frame

    names = [f"c{i}" for i in range(40)]
    matrix = [[(10 + i if i == j else 1) for j in range(40)] for i in range(40)]
    record = confusion_record(2, names, [v for row in matrix for v in row])
    figure, caption = confusion_figure(record, max_classes=30)
    heatmap = figure.data[0]
    assert len(heatmap.x) == len(heatmap.y) == 30 and "c39" in heatmap.x and "c0" not in heatmap.x  # most images
    assert "40 classes" in caption and "10 left out" in caption
    assert heatmap.z[-1][-1] == pytest.approx(49 / 88)  # shares of the true class's row, all 40 columns counted
    frame = per_class_frame(record)
    assert len(frame) == 40 and frame["accuracy"].iloc[0] == pytest.approx(10 / 49)


def test_run_page_shows_per_class_accuracy_and_the_matrix(db_url, parallax_home):
    from streamlit.testing.v1 import AppTest

    import db
    from tests.support import ROOT
    from db import store

    engine = db.make_engine(db_url)
    run_id = store.create_run(engine, RunConfig(image_size=8).to_dict(), status="completed")
    store.log_epoch(engine, run_id, {"epoch": 1, "train_loss": 1.0, "val_loss": 1.0, "train_acc": 0.5, "val_acc": 0.5,
                                     "epoch_time_s": 2.0, "train_time_s": 1.8, "images_per_s": 100.0,
                                     "peak_memory_mb": {"cpu": 900.0}})
    store.set_measurements(engine, run_id, {"confusion": confusion_record(1, ["cat", "dog"], [3, 1, 1, 1])})
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=90)
    at.session_state["run_id"] = run_id
    at.switch_page("pages/run.py").run()
    assert not at.exception, at.exception
    assert "Per class (best epoch)" in [h.value for h in at.subheader]
    table = next(d.value for d in at.dataframe if "class" in d.value.columns)
    assert table["class"].tolist() == ["cat", "dog"] and table["accuracy"].tolist() == [0.75, 0.5]
    assert sum("Confusion matrix" in chart.proto.spec for chart in at.get("plotly_chart")) == 1
    db.dispose_engines()


def test_launch_form_sets_the_switches_in_its_advanced_section(parallax_home):
    from streamlit.testing.v1 import AppTest

    from tests.support import ROOT

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=90).run()
    advanced = next(e for e in at.expander if e.label == "Advanced")
    assert {w.key for w in [*advanced.multiselect, *advanced.checkbox]} >= {"augment", "channels_last", "compile"}
    at.radio(key="strategy").set_value("dp")
    at.checkbox(key="compile").check().run()
    errors = [e.value for e in next(e for e in at.expander if e.label == "Advanced").error]
    assert any(error.startswith("compile is not allowed with strategy dp") for error in errors), errors
    assert next(b for b in at.button if b.label == "Launch").disabled
