"""RunConfig validation: every bad value is refused with a message naming it and what is allowed."""

from __future__ import annotations

import json
import math

import pytest

from trainer_backend.control.cli import build_parser, config_from_args
from contract.config import ConfigError, RunConfig, parse_devices


def test_defaults_are_a_quick_cpu_run():
    cfg = RunConfig()
    assert (cfg.dataset, cfg.model, cfg.strategy, cfg.devices) == ("digits", "resnet18", "single", ("cpu",))
    assert cfg.world_size == 1 and cfg.per_device_batch == cfg.batch_size


def test_devices_are_parsed_to_torch_names():
    assert parse_devices("cpu,cpu") == ("cpu", "cpu")
    assert parse_devices("0, 1") == ("cuda:0", "cuda:1")
    assert parse_devices("cuda") == ("cuda:0",)


def test_ddp_batch_is_global_and_split_per_process():
    cfg = RunConfig(strategy="ddp", devices="cpu,cpu", batch_size=128)
    assert cfg.world_size == 2 and cfg.per_device_batch == 64


def test_round_trip_through_json():
    cfg = RunConfig(strategy="mp", devices=("cpu", "cpu"), bands="3,2,1", tags=("a", "b"))
    again = RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg and again.bands == (3, 2, 1)


@pytest.mark.parametrize(
    "changes, field, words",
    [
        ({"epochs": 0}, "epochs", ["epochs 0", "1 to"]),
        ({"epochs": -3}, "epochs", ["epochs -3"]),
        ({"batch_size": 0}, "batch_size", ["batch_size 0"]),
        ({"lr": math.nan}, "lr", ["lr nan"]),
        ({"lr": 0.0}, "lr", ["lr 0.0"]),
        ({"lr": math.inf}, "lr", ["lr inf", "a finite number above 0"]),
        ({"lr": -1e9}, "lr", ["lr -1000000000.0"]),
        ({"image_size": 4}, "image_size", ["image_size 4", "8 to 1024"]),
        ({"val_fraction": 1.5}, "val_fraction", ["val_fraction 1.5"]),
        ({"strategy": "zero3"}, "strategy", ["'zero3'", "single", "ddp"]),
        ({"optimizer": "lion"}, "optimizer", ["'lion'", "adam"]),
        ({"amp": "fp8"}, "amp", ["'fp8'", "bf16"]),
        ({"devices": "tpu"}, "devices", ["'tpu'", "cuda:N"]),
        ({"strategy": "single", "devices": "cpu,cpu"}, "devices", ["single", "one device"]),
        ({"strategy": "mp", "devices": "cpu"}, "devices", ["mp", "at least 2"]),
        ({"strategy": "ddp", "devices": "cpu,cpu", "batch_size": 5}, "batch_size", ["batch_size 5", "multiple of 2"]),
        ({"amp": "fp16"}, "amp", ["needs CUDA"]),
        ({"strategy": "pp", "devices": "cpu,cpu", "amp": "fp16"}, "amp", ["'fp16'", "bf16"]),
        ({"strategy": "pp", "devices": "cpu,cpu", "batch_size": 30}, "batch_size", ["batch_size 30", "4 microbatches"]),
        ({"strategy": "pp", "devices": "cpu," * 4 + "cpu", "batch_size": 20}, "microbatches",
         ["5 stages", "at least 5 microbatches", "got 4"]),
        ({"strategy": "fsdp", "devices": "cpu,cpu", "batch_size": 5}, "batch_size", ["batch_size 5", "FSDP"]),
        ({"pipeline_schedule": "zb"}, "pipeline_schedule", ["'zb'", "1f1b"]),
        ({"strategy": "dp", "devices": "0,1,2,3,4,5,6,7", "batch_size": 9}, "batch_size",
         ["batch_size 9 over 8 GPUs", "2, 2, 2, 2, 1 images", "e.g. 10"]),
        ({"strategy": "dp", "devices": "0,1", "batch_size": 3}, "batch_size", ["2, 1 images", "e.g. 4"]),
        ({"bands": "x,y"}, "bands", ["'x,y'"]),
        ({"epochs": True}, "epochs", ["epochs True"]),
    ],
)
def test_bad_values_name_the_value_and_the_allowed(changes, field, words):
    with pytest.raises(ConfigError) as info:
        RunConfig(**changes)
    assert info.value.field == field
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("lr", [50.0, 1e9])
def test_any_positive_finite_learning_rate_is_taken_and_one_above_the_bound_is_warned_of(lr):
    from contract.config import LR_WARN_ABOVE, recipe_notes

    config = RunConfig(lr=lr)  # a run forced to diverge is a run a user may want
    [warning] = [note for note in recipe_notes(config) if note.startswith("Learning rate")]
    assert f"Learning rate {lr:g} is above {LR_WARN_ABOVE:g}" in warning and "stop" in warning
    assert not [note for note in recipe_notes(RunConfig(lr=LR_WARN_ABOVE)) if note.startswith("Learning rate")]
    parsed = config_from_args(build_parser().parse_args(["run", "--lr", str(lr)]))
    assert parsed.lr == lr


def test_gpus_that_do_not_exist_are_refused():
    with pytest.raises(ConfigError, match="cuda:62 does not exist"):
        RunConfig(strategy="ddp", devices="62,63")


def test_unknown_config_file_field_is_named():
    with pytest.raises(ConfigError, match="batchsize"):
        RunConfig.from_dict({"batchsize": 3})


def test_flags_override_config_file(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"epochs": 7, "strategy": "ddp", "devices": ["cpu", "cpu"], "batch_size": 64}))
    args = build_parser().parse_args(["run", "--config", str(path), "--epochs", "2", "--tags", "x,y"])
    cfg = config_from_args(args)
    assert (cfg.epochs, cfg.strategy, cfg.batch_size, cfg.tags) == (2, "ddp", 64, ("x", "y"))


def test_cli_rejects_bad_config_before_anything_starts(cli, parallax_home):
    result = cli("run", "--epochs", "0", timeout=60)
    assert result.returncode == 2
    assert "epochs 0" in result.stderr and "Traceback" not in result.stderr
    assert "run_id=" not in result.stdout
    assert not (parallax_home / "parallax.db").exists()


GPU_CHECK = """
import sys
from contract.config import ConfigError, RunConfig
RunConfig(strategy="ddp", devices=("cuda:0", "cuda:1"))
try:
    RunConfig(devices=("cuda:2",))
except ConfigError as exc:
    print(exc)
print(sorted(m for m in ("torch", "timm", "torchvision") if m in sys.modules))
"""


def test_a_gpu_config_is_checked_against_nvml_without_importing_torch():
    """The dashboard checks the form's config in its own process, which never imports torch."""
    import os
    import subprocess
    import sys

    from tests.nvml_machines import TWO_GPUS, subprocess_env
    from tests.support import ROOT

    env = subprocess_env(TWO_GPUS, {**os.environ, "PYTHONPATH": str(ROOT)})
    env.pop("CUDA_VISIBLE_DEVICES", None)
    done = subprocess.run([sys.executable, "-c", GPU_CHECK], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    refused, imported = done.stdout.strip().splitlines()
    assert refused == "device cuda:2 does not exist: this machine has GPUs 0..1"
    assert imported == "[]"
