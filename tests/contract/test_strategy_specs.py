"""The strategy specs: one per strategy, each naming a class that runs it and agreeing with it, and
the only place outside the strategies that names one (tests/project/test_strategy_names.py checks the rest)."""

from __future__ import annotations

import importlib
import inspect
import os

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from contract import config as config_module
from contract.config import STRATEGIES, RunConfig, strategy_notes
from contract.strategy_specs import (SPECS, STRATEGY_SPECS, baseline, find, memory_saver, spec,
                                                    sweep_base_for)
from trainer_backend.rank.strategies import Strategy
from trainer_backend.rank.strategies.process_group import ProcessGroup
from trainer_backend.rank.strategies.registry import strategy_class

from tests.support import run_python

STRATEGY_MODULES = ("base", "dp", "ddp", "mp", "pp", "fsdp")


def test_an_unknown_name_fails_naming_the_value_and_the_allowed_ones():
    allowed = "allowed: single, dp, ddp, mp, pp, fsdp"
    for lookup in (spec, strategy_class):
        with pytest.raises(ValueError, match=rf"^Unknown strategy \('nope'\); {allowed}$"):
            lookup("nope")
    with pytest.raises(ValueError, match=rf"^Unknown strategy \(\['ddp'\]\); {allowed}$"):
        spec(["ddp"])
    assert find("nope") is None and find(["ddp"]) is None and find("ddp") is spec("ddp")


def test_the_config_offers_the_specs_names_and_descriptions_in_their_order():
    assert list(STRATEGIES) == list(STRATEGY_SPECS) == ["single", "dp", "ddp", "mp", "pp", "fsdp"]
    assert all(STRATEGIES[name] == s.description and s.name == name for name, s in STRATEGY_SPECS.items())


def _defined_strategy_classes() -> dict[str, type]:
    """Every class in the strategies' modules that runs a strategy (it sets its own ``name``)."""
    found = {}
    for module_name in STRATEGY_MODULES:
        module = importlib.import_module(f"trainer_backend.rank.strategies.{module_name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Strategy) and cls.__module__ == module.__name__ and "name" in vars(cls):
                assert cls.name not in found, f"two classes run {cls.name}: {found[cls.name]} and {cls}"
                found[cls.name] = cls
    return found


def test_every_spec_names_the_class_that_runs_it_and_every_class_has_a_spec():
    classes = _defined_strategy_classes()
    assert sorted(classes) == sorted(STRATEGY_SPECS)
    for name, cls in classes.items():
        assert strategy_class(name) is cls
        assert spec(name).implementation == f"{cls.__module__}:{cls.__qualname__}"


def _config(name: str, devices: tuple[str, ...]) -> RunConfig:
    n = 1 if spec(name).one_device else len(devices)
    return RunConfig(strategy=name, devices=devices[:n], batch_size=8, microbatches=2)


@pytest.mark.parametrize("name", list(STRATEGY_SPECS))
def test_a_specs_process_and_batch_flags_agree_with_its_class(name, monkeypatch):
    """Set up on two CPU devices, a distributed strategy forms a process group of one process per device
    (the group's start is recorded, not run: one process cannot be two ranks) and the others none; one
    that splits the batch samples a share per rank, one that scatters it gives each GPU a part."""
    config = _config(name, ("cpu", "cpu"))
    started = []
    monkeypatch.setattr(dist, "init_process_group", lambda *args, **kwargs: started.append(kwargs["world_size"]))
    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    strategy = strategy_class(name)(config, 0, store_host="127.0.0.1", store_port=store.port)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # a rank takes its share of the cores; not this one
    strategy.setup()
    s = spec(name)
    assert (started == [len(config.devices)]) == s.distributed, started
    assert isinstance(strategy.group, ProcessGroup) == s.distributed
    assert strategy.world_size == config.world_size == (len(config.devices) if s.distributed else 1)
    assert isinstance(strategy.shards.train_sampler(16, 0), DistributedSampler) == s.splits_batch
    # The schedule that cuts batches into microbatches runs the steps itself and computes the loss on its last stage.
    assert (type(strategy).train_step is not Strategy.train_step) == s.microbatched == s.records_on_last_rank
    assert s.recording_rank(len(config.devices)) == (len(config.devices) - 1 if s.records_on_last_rank else 0)

    # On GPUs (named, never touched: no strategy here is set up), what one process computes on.
    monkeypatch.setattr(config_module, "cuda_device_count", lambda: 2)
    on_gpus = strategy_class(name)(_config(name, ("cuda:0", "cuda:1")), 0)
    assert (len(on_gpus.devices) > 1) == s.spans_devices, on_gpus.devices
    assert (len(on_gpus.shards.replica_batches(8)) > 1) == s.scatters_batch


@pytest.mark.processes
def test_the_pipeline_module_is_imported_only_for_a_pipeline():
    code = ("import sys\nfrom trainer_backend.rank.strategies.registry import strategy_class\n"
            "[strategy_class(n) for n in ('single', 'dp', 'ddp', 'mp', 'fsdp')]\n"
            "print('torch.distributed.pipelining' in sys.modules)\nstrategy_class('pp')\n"
            "print('torch.distributed.pipelining' in sys.modules)")
    done = run_python(["-c", code], env=dict(os.environ), timeout=120)
    assert done.returncode == 0 and done.stdout.split() == ["False", "True"], done.stdout + done.stderr


def test_the_specs_rules_and_notes_are_the_configs():
    """A strategy's rules reach the user as the config's errors, its notes as the config's notes."""
    with pytest.raises(config_module.ConfigError, match="batch_size 7 is the global batch") as refused:
        RunConfig(strategy="fsdp", devices=("cpu", "cpu"), batch_size=7)
    assert refused.value.field == "batch_size"
    assert spec("pp").problem(RunConfig(strategy="ddp", devices=("cpu", "cpu"), batch_size=6, microbatches=4)) == (
        "batch_size", "batch_size 6 must divide evenly into 4 microbatches: use a multiple of 4, or change the "
        "number of microbatches")
    pipeline = RunConfig(strategy="pp", devices=("cpu", "cpu"), batch_size=8, microbatches=2)
    assert spec("pp").notes(pipeline)[0] in strategy_notes(pipeline)
    assert spec("single").notes(RunConfig()) == []


def test_the_roles_other_code_asks_for_are_the_specs():
    """What used to be a name written elsewhere: the baseline, the strategy a sweep's shared fields are checked
    under, the one suggested where memory is short, and a new sweep's strategies."""
    assert baseline() is spec("single") and RunConfig().strategy == "single"
    assert sweep_base_for(1) is spec("single") and sweep_base_for(2) is spec("mp") and sweep_base_for(8) is spec("mp")
    # mp adds no batch or speed-switch rule: a sweep's shared fields fail under it only where they fail for all.
    assert not spec("mp").compile_refusal and not spec("mp").channels_last_refusal and not spec("mp").splits_batch
    assert memory_saver() is spec("fsdp")
    assert [s.name for s in SPECS if s.in_first_sweep] == ["single", "ddp", "mp", "pp"]
