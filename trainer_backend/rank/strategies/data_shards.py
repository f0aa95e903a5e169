"""Which data each process of a strategy reads: its share of the training set (a sampler), of the validation set
(indices), whether short last batches are dropped, whether validation totals are summed across processes, and
what a batch becomes on the model's replicas. A strategy owns one (``strategy.shards``):

    WholeData        single, mp, dp on CPU: one process reads everything
    ScatteredBatches dp on GPUs: DataParallel cuts each batch over the GPUs
    RankShards       ddp: each process its shard of training and validation
    ShardedModel     fsdp: each process its shard of training; every process validates the whole set
    StageFeed        pp: every stage the same batches; only the first reads images, only the last labels

    sampler = strategy.shards.train_sampler(len(data.train), seed)   # None: the loader shuffles itself
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.utils.data import DistributedSampler, Sampler


class WholeData:
    """One process reads every training and validation image."""

    drop_last_train = False
    # Validation totals are summed across processes (each holds a shard, or zeros); False where
    # every process evaluates the whole set (FSDP) and one copy of the numbers is the answer.
    sum_val_across_ranks = True

    def train_sampler(self, dataset_len: int, seed: int) -> Sampler | None:
        return None  # the loader shuffles with a seeded generator

    def val_indices(self, dataset_len: int) -> Iterable[int] | None:
        return None

    def feed(self, data):
        """The data this process reads its batches from (a PreparedData): all of it, unless the
        process computes on only part of each batch (a pipeline's stages)."""
        return data

    def replica_batches(self, images: int) -> list[int]:
        """The batches a batch of ``images`` becomes on the model's replicas (one here)."""
        return [images] if images else []


class ScatteredBatches(WholeData):
    """DataParallel over GPUs: one process, each batch cut over ``replicas`` GPUs."""

    def __init__(self, replicas: int):
        self.replicas = replicas

    def replica_batches(self, images: int) -> list[int]:
        # DataParallel scatters with Tensor.chunk: 3 images over 2 GPUs are 2 and 1, 5 over 4 are 2, 2 and 1.
        if not images:
            return []
        return [len(part) for part in torch.arange(images).chunk(self.replicas)]


class RankShards(WholeData):
    """One process per device, each training and validating on its own shard."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size

    def train_sampler(self, dataset_len: int, seed: int) -> Sampler:
        # DistributedSampler only needs len(); pads the last shard so every rank takes the same
        # number of steps (DDP's all-reduce needs that).
        return DistributedSampler(
            range(dataset_len), num_replicas=self.world_size, rank=self.rank, shuffle=True, seed=seed
        )

    def val_indices(self, dataset_len: int) -> Iterable[int]:
        # Strided shards with no padding: each validation image is counted exactly once. Evaluation
        # runs on the unwrapped module, so unequal shard lengths need no matching collectives.
        return range(self.rank, dataset_len, self.world_size)


class ShardedModel(RankShards):
    """FSDP: training shards as DDP's; a sharded forward is a collective, so every rank runs the same
    validation batches, the whole set."""

    sum_val_across_ranks = False

    def val_indices(self, dataset_len: int) -> None:
        return None


class StageFeed(WholeData):
    """A pipeline: every stage takes the same batches, in the same seeded order, but only the first
    reads their images and only the last their labels."""

    drop_last_train = True  # microbatch shapes are fixed by the first step

    def __init__(self, is_first: bool, is_last: bool):
        self.is_first, self.is_last = is_first, is_last

    def feed(self, data):
        """The first stage reads the images (and keeps them on its GPU where they fit); every other
        stage reads the labels at most (the last stage), from the same seeded order, so each runs
        the same steps."""
        from trainer_backend.datasets.labels_only import LabelsOnly
        from trainer_backend.datasets.prepare import PreparedData

        if self.is_first:
            return data
        return PreparedData(LabelsOnly.of(data.train, labels=self.is_last),
                            LabelsOnly.of(data.val, labels=self.is_last), data.info)
