"""The dashboard's door to the backend (trainer_backend/control/inspect.py): questions that need torch are
answered by a child process, the asking process imports neither torch, timm nor torchvision, and a child that
dies is replaced at the next question. Run in a new interpreter (this test process may have imported torch).

    .venv/bin/python -m pytest tests/trainer_backend/control/test_inspect.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.processes

ASKER = r"""
import json, os, signal, sys
from contract.config import RunConfig
from trainer_backend.control import inspect as ask

seen = {"ready_before": ask.ready()}
ask.warm_up()
seen["ready_after"] = ask.ready()
names = ask.model_names()
seen["models"] = len(names)
seen["has_resnet18"] = "resnet18" in names
seen["resnet18_parameters"] = ask.parameter_count("resnet18", 10, 3)
seen["problem"] = ask.model_problem("resnet19x")
seen["no_problem"] = ask.model_problem("resnet18")
seen["digits"] = ask.describe_dataset("digits", ask.data_roots())
seen["missing"] = ask.describe_dataset(sys.argv[1], [os.path.dirname(sys.argv[1])])
try:
    ask.stored_split_size(sys.argv[1], 32)
except ValueError as exc:
    seen["size_error"] = str(exc)
config = RunConfig(model="test_resnet", image_size=16, batch_size=8)
estimate = ask.estimate_memory(config, 10, 1)
seen["estimate_devices"] = sorted(estimate["devices"])
seen["fits"] = [fit.fits for fit in ask.fits({"cpu": 10.0}, {"cpu": 20.0})]
seen["torch_before_the_crash"] = sorted(m for m in ("torch", "timm", "torchvision") if m in sys.modules)

seen["kept"] = ask.parameter_count("resnet18", 10, 3)  # timm's answers are kept: the child is not asked again
os.kill(ask._inspector.process.pid, signal.SIGKILL)
seen["kept_after_the_kill"] = ask.parameter_count("resnet18", 10, 3)
try:
    ask.describe_dataset("digits", ask.data_roots())
except ask.InspectorUnavailable as exc:
    seen["after_the_kill"] = str(exc)
seen["ready_after_the_kill"] = ask.ready()
seen["asked_again"] = ask.parameter_count("resnet50", 10, 3)

from PIL import Image  # a folder of 8 images, to be described under two limits on images
folder = os.path.join(os.path.dirname(sys.argv[1]), "eight")
for label in ("a", "b"):
    os.makedirs(os.path.join(folder, label), exist_ok=True)
    for i in range(4):
        Image.new("L", (8, 8), i * 40).save(os.path.join(folder, label, f"{i}.png"))
seen["eight"] = ask.describe_dataset(folder, [os.path.dirname(folder)]).get("problems", [])
os.environ["PARALLAX_MAX_IMAGES"] = "5"  # the settings change after the child started
seen["ready_under_new_settings"] = ask.ready()
seen["eight_of_5"] = ask.describe_dataset(folder, [os.path.dirname(folder)]).get("problems", [])
seen["torch"] = sorted(m for m in ("torch", "timm", "torchvision") if m in sys.modules)
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def asked(tmp_path_factory) -> dict:
    home = tmp_path_factory.mktemp("home")
    missing = home / "datasets" / "gone"
    env = {**os.environ, "PARALLAX_HOME": str(home), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", ASKER, str(missing)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_asking_process_imports_neither_torch_timm_nor_torchvision(asked):
    assert asked["torch_before_the_crash"] == [] and asked["torch"] == []


def test_the_child_answers_what_timm_knows(asked):
    assert (asked["ready_before"], asked["ready_after"]) == (False, True)
    assert asked["models"] > 1000 and asked["has_resnet18"]
    assert asked["resnet18_parameters"] == 11_181_642  # 512 x 10 + 10 in its head, not ImageNet's 1,000 classes
    assert "resnet19x" in asked["problem"] and "resnet" in asked["problem"].split("resnet19x", 1)[1]
    assert asked["no_problem"] is None


def test_the_child_describes_datasets_and_estimates_memory(asked):
    digits = asked["digits"]
    assert (digits["kind"], digits["num_images"], digits["num_classes"], digits["image_shape"]) == (
        "builtin", 1797, 10, [8, 8])
    assert asked["missing"]["problems"] and "gone" in asked["missing"]["problems"][0]
    assert "gone" in asked["size_error"]
    assert asked["estimate_devices"] == ["cpu"]
    assert asked["fits"] == [True]


def test_a_child_that_dies_is_said_to_and_the_next_question_starts_another(asked):
    assert asked["after_the_kill"].startswith("the inspector process ended (exit status -9)")
    assert asked["ready_after_the_kill"] is False
    assert asked["kept"] == asked["kept_after_the_kill"] == 11_181_642
    assert asked["asked_again"] == 23_528_522  # resnet50 with 10 classes, from a new child


def test_a_child_started_under_other_settings_is_replaced_before_it_answers(asked):
    """A limit set after the child started (PARALLAX_MAX_IMAGES here) holds: the old child would not know it."""
    assert asked["eight"] == [] and asked["ready_under_new_settings"] is False
    (problem,) = asked["eight_of_5"]
    assert "has 8 images, more than the 5 Parallax decodes (PARALLAX_MAX_IMAGES)" in problem
