"""A run in which some process would have no batch to train on is refused before launch, naming
the numbers (was: a ZeroDivisionError after the only, short batch was dropped).

    .venv/bin/python -m pytest tests/trainer_backend/supervisor/test_preflight_degenerate_split.py -q
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from tests.trainer_backend.control.test_cli_bad_input import BASE, assert_nothing_left, write_images
from trainer_backend.control.cli import main
from contract.config import RunConfig
from trainer_backend.supervisor.preflight import train_steps
from trainer_backend.rank.trainer import build_loaders, make_strategy


@pytest.fixture(scope="module")
def small_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("small")
    for name, per_class in (("two_each", 2), ("four_each", 4)):
        for label in ("a", "b"):
            write_images(root / name / label, per_class)
    return root


@pytest.mark.parametrize("flags, words", [
    (["--dataset", "{root}/two_each", "--strategy", "ddp", "--devices", "cpu,cpu", "--batch-size", "4"],
     ["the training split has 2 images; over 2 DDP processes each takes 1, fewer than its batch of 2 "
      "(batch_size 4 / 2)", "BatchNorm cannot train on one", "use more training images or fewer processes"]),
    (["--dataset", "{root}/two_each", "--strategy", "fsdp", "--devices", "cpu,cpu", "--batch-size", "4"],
     ["over 2 FSDP processes each takes 1"]),
    (["--dataset", "{root}/four_each", "--strategy", "pp", "--devices", "cpu,cpu", "--batch-size", "8",
      "--microbatches", "2"],
     ["the training split has 4 images; fewer than the batch of 8", "a pipeline drops every short batch",
      "use a batch_size of at most 4"]),
], ids=["ddp", "fsdp", "pp"])
def test_a_process_without_a_batch_is_refused_before_launch_naming_the_numbers(flags, words, small_folders,
                                                                                 parallax_home, capsys):
    argv = [*BASE, "--val-fraction", "0.5", *(f.replace("{root}", str(small_folders)) for f in flags)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    for word in words:
        assert word in lines[0], lines[0]
    assert_nothing_left(parallax_home)


CASES = [(strategy, devices, batch, compile_, n)
         for (strategy, devices, batch, compile_), n in itertools.product(
             [("single", 1, 4, False), ("single", 1, 4, True), ("ddp", 2, 4, False), ("ddp", 3, 6, False),
              ("fsdp", 2, 8, False), ("pp", 2, 4, False), ("mp", 2, 4, False)],
             [1, 2, 3, 5, 7, 8, 9, 13])]


class HostRows(list):
    """Rows in host memory, as a cached split is: only their number matters to the loaders' counts."""

    on_device = False

    def __init__(self, n: int):
        super().__init__(range(n))


@pytest.mark.parametrize("strategy, devices, batch, compile_, n", CASES)
def test_the_counted_steps_are_the_real_loaders_steps(strategy, devices, batch, compile_, n):
    """The check counts batches by the loader's rules: compared with the real DataLoader of every rank."""
    config = RunConfig(model="test_resnet", strategy=strategy, devices=("cpu",) * devices, batch_size=batch,
                       microbatches=2, compile=compile_)
    share, steps = train_steps(config, n)
    data = SimpleNamespace(train=HostRows(n), val=HostRows(2))
    for rank in range(config.world_size):
        train, _ = build_loaders(data, config, make_strategy(config, rank))
        assert (len(train.sampler), len(train)) == (share, steps), (rank, config.process_batch)
