"""The Slurm fields: refused in one line naming the value and what is allowed, kept in the config as given."""

from __future__ import annotations

import pytest

from contract.config import ConfigError, RunConfig
from contract.fields import FIELDS, SECTIONS, SLURM_SECTION
from contract.slurm_options import processes_per_node
from trainer_backend.control.cli import build_parser, config_from_args

ON_SLURM = {"where": "slurm", "strategy": "ddp"}


def test_the_slurm_fields_are_a_section_of_the_catalogue_and_kept_in_the_config():
    assert SECTIONS[SLURM_SECTION][0] == "where" and "max_requeues" in SECTIONS[SLURM_SECTION]
    assert set(SECTIONS[SLURM_SECTION]) <= set(FIELDS)
    config = RunConfig(**ON_SLURM, slurm_partition="gpu", slurm_nodes=2, slurm_time="1-02:00:00", slurm_mem="64G",
                       slurm_extra=["--constraint=a100", "--exclusive"])
    again = RunConfig.from_dict(config.to_dict())
    assert again == config and again.to_dict()["slurm_extra"] == ["--constraint=a100", "--exclusive"]


@pytest.mark.parametrize("changes, field, words", [
    ({"where": "mars"}, "where", "where 'mars' is not allowed: choose one of local, slurm"),
    ({"where": "slurm", "slurm_nodes": 2}, "slurm_nodes", "slurm_nodes 2 is not allowed with strategy single: it "
     "runs in one process, a one-task job on one node; use 1 node, or ddp, fsdp or pp to span nodes"),
    ({"where": "slurm", "strategy": "mp", "devices": "cpu,cpu", "slurm_nodes": 3}, "slurm_nodes",
     "slurm_nodes 3 is not allowed with strategy mp"),
    ({**ON_SLURM, "slurm_time": "2 hours"}, "slurm_time", "slurm_time '2 hours' is not allowed: give minutes, MM:SS"),
    ({**ON_SLURM, "slurm_mem": "lots"}, "slurm_mem", "slurm_mem 'lots' is not allowed: give a whole number"),
    ({**ON_SLURM, "slurm_partition": "gpu;rm -rf"}, "slurm_partition", "slurm_partition 'gpu;rm -rf' is not allowed"),
    ({**ON_SLURM, "slurm_extra": ["exclusive"]}, "slurm_extra",
     "slurm_extra line 'exclusive' is not allowed: 'exclusive' is not an sbatch option"),
    ({**ON_SLURM, "slurm_extra": ["--comment=a\nb"]}, "slurm_extra", "slurm_extra line '--comment=a\\nb'"),
    ({**ON_SLURM, "slurm_extra": ["--output=/tmp/x"]}, "slurm_extra", "it sets --output, and Parallax sets it itself"),
    ({**ON_SLURM, "devices": "cuda"}, "slurm_gpus_per_node", "slurm_gpus_per_node 0 is not allowed with GPU devices"),
    ({**ON_SLURM, "max_requeues": 101}, "max_requeues", "max_requeues 101 is not allowed: use a whole number from 0 "
     "to 100"),
])
def test_a_bad_slurm_value_is_refused_in_one_line_naming_it(changes, field, words):
    with pytest.raises(ConfigError) as refused:
        RunConfig(**changes)
    assert refused.value.field == field and words in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("strategy, devices, gpus, trains_on", [
    ("single", "cpu", 0, ("cpu",)), ("single", "cuda", 1, ("cuda:0",)), ("single", "cuda", 2, ("cuda:0",)),
    ("dp", "cuda", 2, ("cuda:0", "cuda:1")), ("mp", "cpu,cpu", 0, ("cpu", "cpu")), ("mp", "0,1", 2, ("cuda:0", "cuda:1"))])
def test_every_strategy_runs_on_slurm_one_process_as_a_one_task_job(strategy, devices, gpus, trains_on):
    from trainer_backend.control.slurm_job import check_world, one_task

    config = RunConfig(where="slurm", strategy=strategy, devices=devices, slurm_gpus_per_node=gpus)
    job = check_world(config)  # what the job's one process trains on: the node's GPUs (single, the first)
    assert one_task(config) and job.devices == trains_on and job.world_size == 1 and job.nodes == 1
    assert not one_task(RunConfig(where="slurm", strategy="ddp"))


def test_the_command_line_takes_the_extra_options_as_one_text():
    args = build_parser().parse_args(["launch", "--where", "slurm", "--strategy", "ddp", "--slurm-nodes", "2",
                                      "--slurm-extra", "--constraint=a100 --exclusive"])
    config = config_from_args(args)
    assert config.slurm_extra == ("--constraint=a100", "--exclusive") and config.slurm_nodes == 2


def test_processes_per_node_are_the_gpus_asked_for_or_the_cpu_devices_over_the_nodes():
    assert processes_per_node(RunConfig(**ON_SLURM, devices="cpu,cpu,cpu,cpu", slurm_nodes=2)) == 2
    assert processes_per_node(RunConfig(**ON_SLURM, devices="cpu", slurm_nodes=2)) == 1
    assert processes_per_node(RunConfig(**ON_SLURM, devices="cuda", slurm_gpus_per_node=8)) == 8
