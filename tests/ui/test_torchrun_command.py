"""The torchrun command the Launch page offers: its flags parse back through the CLI's own parser
into the form's config, bad values are named, and the page shows it for ddp, fsdp and pp only.

    .venv/bin/python -m pytest tests/ui/test_torchrun_command.py -q
"""

from __future__ import annotations

import shlex

import pytest
from streamlit.testing.v1 import AppTest

from tests.support import ROOT
from tests.nvml_machines import cpu_machine, fake_nvml  # noqa: F401
from trainer_backend.control.cli import build_parser, config_from_args
from contract.config import ConfigError, RunConfig
from ui.torchrun_command import torchrun_command

PREFIX = ("PYTHONSAFEPATH=1 torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint node0:29400 --rdzv-id job-1 "
          "-m trainer_backend run ")


def parse_back(command: str) -> RunConfig:
    argv = shlex.split(command)
    return config_from_args(build_parser().parse_args(argv[argv.index("trainer_backend") + 1:]))


def command(config: RunConfig, **changes) -> str:
    return torchrun_command(config, **{"nodes": 2, "procs_per_node": 2, "endpoint": "node0:29400", "job_id": "job-1",
                                       **changes})


@pytest.mark.parametrize("config", [
    RunConfig(strategy="ddp", devices=("cpu", "cpu")),
    # Two processes with one loader worker each: within the process limit of a 2-core machine.
    RunConfig(dataset="/data/my set", model="resnet50", strategy="fsdp", devices=("cpu",) * 2, batch_size=64,
              epochs=7, lr=3e-4, optimizer="sgd", weight_decay=1e-4, pretrained=True, profile=True,
              profile_active=5, tags=("a", "b c"), bands=(3, 2, 1), band_scale=4000.0, val_fraction=0.25, seed=7,
              num_workers=1, amp="off", image_size=64),
    RunConfig(strategy="pp", devices=("cpu", "cpu"), microbatches=8, pipeline_schedule="1f1b", batch_size=64),
], ids=["ddp-defaults", "fsdp-every-field", "pp"])
def test_the_commands_flags_parse_back_into_the_same_config(config):
    built = command(config)
    assert built.startswith(PREFIX)
    assert parse_back(built) == config


def test_restarts_and_quoting():
    built = command(RunConfig(strategy="ddp", devices=("cpu", "cpu"), dataset="/data/it's here"), max_restarts=3)
    assert "--rdzv-id job-1 --max-restarts 3 -m trainer_backend run" in built
    assert parse_back(built).dataset == "/data/it's here"
    assert built.startswith("PYTHONSAFEPATH=1 TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun ")  # agents that count restarts apart
    assert command(RunConfig(strategy="ddp", devices=("cpu", "cpu")), nodes=1, max_restarts=3).startswith("PYTHONSAFEPATH=1 torchrun ")


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"endpoint": "node0"}, "endpoint", "rendezvous endpoint 'node0' is not allowed: use HOST:PORT"),
    ({"endpoint": "node0:70000"}, "endpoint", "use HOST:PORT"),
    ({"nodes": 0}, "nodes", "nodes 0 is not allowed: use a whole number from 1 to"),
    ({"procs_per_node": 0}, "procs_per_node", "processes per node 0 is not allowed"),
    ({"job_id": "two words"}, "job_id", "job id 'two words' is not allowed"),
    ({"nodes": 3, "procs_per_node": 1}, "batch_size", "must divide evenly over 3 DDP processes"),
])
def test_bad_values_are_named(changes, field, words):
    with pytest.raises(ConfigError, match=words) as raised:
        command(RunConfig(strategy="ddp", devices=("cpu", "cpu"), batch_size=128), **changes)
    assert raised.value.field == field


def test_single_process_strategies_have_no_torchrun_command():
    with pytest.raises(ConfigError, match="strategy mp runs in one process and cannot join torchrun's world of 4"):
        command(RunConfig(strategy="mp", devices=("cpu", "cpu")))


def test_the_launch_page_offers_the_command_for_ddp_only(parallax_home, cpu_machine):  # noqa: F811
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=90)
    at.switch_page("pages/launch.py").run()
    assert not [e for e in at.expander if e.label == "Run across machines with torchrun"]  # single
    at.radio(key="strategy").set_value("ddp").run()
    at.text_input(key="torchrun_endpoint").set_value("node0:29400").run()
    (code,) = at.code
    assert code.value.startswith("PYTHONSAFEPATH=1 torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d "
                                 "--rdzv-endpoint node0:29400 --rdzv-id parallax-")
    assert parse_back(code.value) == RunConfig(strategy="ddp", devices=("cpu", "cpu"), epochs=3)
    at.number_input(key="torchrun_nodes").set_value(3).run()
    assert not at.code and "must divide evenly over 6 DDP processes" in at.error[0].value
