"""A pipeline feeds images to its first stage and labels to its last only: on three real gloo
ranks, the middle and last stages never gather, decode or crop an image (the middle stage no label
either), every stage still runs the same steps, and the run trains to the same numbers as when
every stage read the whole batch.

    .venv/bin/python -m pytest tests/trainer_backend/rank/strategies/test_pp_feed.py -q
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support import leave_with_results, world_results
from contract.config import RunConfig

STAGES = 3
CONFIG = dict(model="test_resnet", image_size=16, strategy="pp", devices=("cpu",) * STAGES, batch_size=128,
              microbatches=4, bn_stats_images=256, augment="flip")
SPAWN_TIMEOUT_S = 600


def _pp_world(rank: int, port: int, out_path: str) -> None:
    from trainer_backend.datasets.tensor_dataset import ImageTensorDataset
    from trainer_backend.rank.inputs import DeviceInputs
    from trainer_backend.rank.strategies.data_shards import StageFeed
    from trainer_backend.rank.trainer import RankSpec, build_on, load_data, make_strategy, run_epoch

    touched = torch.zeros(2, dtype=torch.float64)  # image gathers; batches made the model's input (cropped, flipped)
    gather, prepare, feed = ImageTensorDataset.__getitems__, DeviceInputs.__call__, StageFeed.feed

    def counted_gather(self, indices):
        touched[0] += 1
        return gather(self, indices)

    def counted_inputs(self, pixels, **kwargs):
        touched[1] += 1
        return prepare(self, pixels, **kwargs)

    ImageTensorDataset.__getitems__, DeviceInputs.__call__ = counted_gather, counted_inputs
    config = RunConfig(**CONFIG)
    results, strategy = {}, None
    try:
        for fed in ("every stage", "by stage"):
            # "every stage": how a pipeline was fed before each stage read only what it uses.
            StageFeed.feed = (lambda self, data: data) if fed == "every stage" else feed
            touched.zero_()
            torch.manual_seed(config.seed)
            data = load_data(config)
            strategy = make_strategy(config, rank, in_chans=data.info.in_chans, store_host="127.0.0.1",
                                     store_port=port)
            strategy.setup()
            built = build_on(strategy, RankSpec(config, rank, 0, ""), data, Path(out_path).parent)
            metrics = run_epoch(1, built.model, built.loaders, built.optimizer, strategy, built.amp_dtype,
                                built.scaler, bn_loader=built.bn_loader)
            labels = [labels for _, labels in built.loaders[0]]  # after training: not counted above
            slots = torch.zeros(STAGES, 4, dtype=torch.float64)
            slots[rank] = torch.cat([touched, torch.tensor([len(labels), sum(batch.numel() for batch in labels)])])
            strategy.all_reduce(slots)
            results[fed] = {"stages": [dict(zip(("gathers", "inputs", "steps", "labels"), row)) for row in slots.tolist()],
                            **{k: getattr(metrics, k) for k in ("train_loss", "train_acc", "val_loss", "val_acc")}}
    finally:
        if strategy is not None:
            strategy.teardown()
    leave_with_results(rank, results, out_path)


@pytest.fixture(scope="module")
def pipeline_runs(tmp_path_factory) -> dict:
    return world_results(tmp_path_factory, _pp_world, STAGES, timeout_s=SPAWN_TIMEOUT_S)


@pytest.mark.processes
def test_only_the_first_stage_reads_images_and_only_the_last_labels(pipeline_runs):
    first, middle, last = pipeline_runs["by stage"]["stages"]
    assert first["gathers"] > 0 and first["inputs"] > 0
    for stage in (middle, last):
        assert stage["gathers"] == 0 and stage["inputs"] == 0, pipeline_runs["by stage"]["stages"]
    assert middle["labels"] == 0 and last["labels"] == first["labels"] > 0
    assert first["steps"] == middle["steps"] == last["steps"] > 0  # every stage runs the same steps
    # Fed whole, as every stage was before, each stage gathers every batch's images.
    assert all(stage["gathers"] == first["gathers"] for stage in pipeline_runs["every stage"]["stages"])


@pytest.mark.processes
def test_the_run_trains_to_the_same_numbers_as_when_every_stage_read_everything(pipeline_runs):
    fed, every = pipeline_runs["by stage"], pipeline_runs["every stage"]
    for key in ("train_loss", "train_acc", "val_loss", "val_acc"):
        assert fed[key] == every[key], key


def test_a_later_stage_decodes_no_image_of_a_folder_decoded_in_the_workers(parallax_home, tmp_path, monkeypatch):
    """The mean/std sample the first stage decodes at the start is not decoded by the other stages either."""
    from tests.trainer_backend.datasets.test_streaming_decode import make_jpeg_folder
    from trainer_backend.datasets import streaming
    from trainer_backend.rank.trainer import load_data

    make_jpeg_folder(tmp_path / "jpegs", 12, 40)
    decoded = []
    real = streaming.decode_image_file
    monkeypatch.setattr(streaming, "decode_image_file", lambda path, *args: decoded.append(path) or real(path, *args))
    config = RunConfig(**{**CONFIG, "dataset": str(tmp_path / "jpegs"), "decode": "workers", "batch_size": 8})
    later = load_data(config, rank=1)
    assert decoded == [] and len(later.train) + len(later.val) == 12
    first = load_data(config, rank=0)
    assert len(decoded) == len(first.train)  # the sample: every training image of so small a folder
    assert torch.equal(later.train.labels, first.train.labels)  # the same split, so the same batches' labels
