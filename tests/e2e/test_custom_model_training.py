"""Your own model end to end on CPU: a network from a file outside the checkout trains under single, ddp and
mp through the real CLI (real processes, gloo), one from an importable module path too, a torchvision model on a
10-class folder, and a broken one is refused before anything is queued."""

from __future__ import annotations

import hashlib
import textwrap

import numpy as np
import pytest
import torch

from tests.plugins.user_net import NET_SOURCE
from tests.support import DDP_ON_CPU, run_cli, run_dir, train_and_export

pytestmark = pytest.mark.processes

MYNET = NET_SOURCE + textwrap.dedent('''

    class Bare(nn.Module):
        def forward(self, x):
            return x.flatten(1)[:, :3] * undefined_scale
''')
SHORT = ("--image-size", "16", "--epochs", "1", "--batch-size", "64", "--bn-stats-images", "0")


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def mynet(tmp_path_factory):
    path = tmp_path_factory.mktemp("outside") / "mynet.py"
    path.write_text(MYNET)
    return path


@pytest.mark.parametrize("strategy", [("--strategy", "single"), DDP_ON_CPU, ("--strategy", "mp", "--devices", "cpu,cpu")],
                         ids=["single", "ddp", "mp"])
def test_a_model_from_a_file_outside_the_checkout_trains_under_each_strategy(home, mynet, strategy):
    run = train_and_export(home, "--model", f"{mynet}:Net", "--model-args", '{"width": 6}', *SHORT, *strategy)
    assert run["_cli"].returncode == 0, run["_cli"].stderr
    assert run["status"] == "completed" and len(run["epochs"]) == 1
    assert run["config"]["model"] == f"{mynet}:Net" and run["config"]["model_args"] == '{"width": 6}'
    assert run["config"]["model_source"] == f"{mynet} sha256={hashlib.sha256(mynet.read_bytes()).hexdigest()}"
    note = next(n for n in run["notes"] if n.startswith(f"model {mynet}:Net"))
    assert 'with {"width": 6} takes num_classes=10 and in_chans=1 from the dataset' in note


def test_a_model_from_an_importable_module_path_trains(home):
    run = train_and_export(home, "--model", "tests.plugins.tiny_net:TinyNet", *SHORT)
    assert run["status"] == "completed" and len(run["epochs"]) == 1, run["error"]
    assert run["config"]["model_source"].startswith(f"{'/'.join(__file__.split('/')[:-2])}/plugins/tiny_net.py sha256=")


def test_a_broken_model_is_refused_before_it_is_queued_in_one_line(home, mynet):
    for command in ("launch", "run"):
        result = run_cli(command, "--dataset", "digits", "--model", f"{mynet}:Bare", *SHORT, home=home, timeout=300)
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.strip() == (f"error: model '{mynet}:Bare': raises in forward on a 2x1x16x16 batch: "
                                         "NameError: name 'undefined_scale' is not defined (at mynet.py:18 in forward)")
        assert "run_id=" not in result.stdout
    mp = run_cli("launch", "--dataset", "digits", "--model", "torch.nn:Identity", "--strategy", "mp", "--devices",
                 "cpu,cpu", *SHORT, home=home, timeout=300)
    assert mp.returncode == 2 and "wrong output shape" in mp.stderr and len(mp.stderr.strip().splitlines()) == 1
    listed = run_cli("list", home=home)
    assert not any(f"{mynet}:Bare" in line for line in listed.stdout.splitlines())


def test_a_torchvision_model_trains_on_a_ten_class_folder(home, tmp_path):
    """A model from another library: torchvision's factory takes **kwargs, and is given the folder's 10 classes."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for label in range(10):  # 10 classes of 5 small RGB images, each class its own brightness
        (tmp_path / "ten" / f"c{label}").mkdir(parents=True)
        for i in range(5):
            pixels = rng.integers(0, 60, (16, 16, 3), dtype=np.uint8) + np.uint8(19 * label)
            Image.fromarray(pixels).save(tmp_path / "ten" / f"c{label}" / f"{i}.png")
    result = run_cli("run", "--dataset", str(tmp_path / "ten"), "--model", "torchvision.models:resnet18",
                     "--image-size", "16", "--epochs", "1", "--batch-size", "8", "--bn-stats-images", "0",
                     home=home, timeout=600)
    assert result.returncode == 0 and result.stdout.strip().endswith("status=completed"), result.stdout + result.stderr
    assert "note: model torchvision.models:resnet18 takes num_classes=10 from the dataset" in result.stdout
    run_id = result.stdout.strip().splitlines()[-1].split()[0].split("=")[1]
    checkpoint = torch.load(run_dir(home, int(run_id)) / "best.pt", weights_only=True)
    assert checkpoint["model_kwargs"] == {"num_classes": 10} and checkpoint["model"]["fc.weight"].shape == (10, 512)
    predicted = run_cli("predict", run_id, str(tmp_path / "ten" / "c3" / "0.png"), home=home, timeout=120)
    assert predicted.returncode == 0 and predicted.stdout.split()[1].startswith("c"), predicted.stderr
