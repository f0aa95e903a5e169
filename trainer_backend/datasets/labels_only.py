"""A split's batches without their pixels: what a pipeline stage that takes no images reads.

    train = LabelsOnly.of(data.train, labels=True)      # the last stage: labels, no images
    images, labels = train.__getitems__([3, 1, 4])      # (3, 0) uint8 and (3,) int64

Only a pipeline's first stage computes on the images and only its last on the labels. The other
stages still take one batch per step from a loader over the same seeded order (so every stage runs
the same steps), but nothing is read, decoded or cropped for them: each batch holds zero-width
placeholders, of the batch's length, where a stage takes nothing.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset


class LabelsOnly(Dataset):
    """``length`` rows; ``__getitems__`` gives (a (n, 0) uint8 placeholder for the images, the
    rows' labels or a (n, 0) int64 placeholder when ``labels`` is None)."""

    stored_bytes = 0  # nothing to keep on a device
    on_device = False

    def __init__(self, length: int, labels: torch.Tensor | None, *, num_classes: int, normalise):
        self.length, self.labels, self.num_classes, self.normalise = length, labels, num_classes, normalise

    @classmethod
    def of(cls, split, *, labels: bool) -> LabelsOnly:
        """``split`` (an ImageTensorDataset or StreamingImages) without its images, and without its
        labels unless ``labels``."""
        return cls(len(split), split.labels if labels else None, num_classes=split.num_classes,
                   normalise=split.normalise)

    def __len__(self) -> int:
        return self.length

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = len(indices)
        images = torch.empty((rows, 0), dtype=torch.uint8)
        if self.labels is None:
            return images, torch.empty((rows, 0), dtype=torch.int64)
        return images, self.labels.index_select(0, torch.as_tensor(indices, dtype=torch.int64))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = self.__getitems__([index])
        return images[0], labels[0]
