"""Per-class validation counts: a confusion matrix summed on the device, as part of the val totals.

Validation totals are one float64 vector per process, ``[loss_sum, correct, count]``, summed
across ranks with one all-reduce. With ``num_classes`` C the vector carries C*C more entries,
the confusion counts (row = true class, column = prediction, flattened row-major), so the matrix
is reduced by the same collective as the other totals and read from the device once per epoch.
"""

from __future__ import annotations

import torch

VAL_TOTALS = 3  # loss_sum, correct, count
# Matrices larger than this many classes (65,536 cells) are kept as per-class accuracy only: the
# full matrix would make the run's stored measurements megabytes of JSON.
MAX_STORED_CLASSES = 256


def val_totals(num_classes: int, device: torch.device) -> torch.Tensor:
    """Zeros for ``[loss_sum, correct, count]`` plus the C*C confusion counts."""
    return torch.zeros(VAL_TOTALS + num_classes * num_classes, dtype=torch.float64, device=device)


def accumulate(totals: torch.Tensor, loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
    """Add a batch to ``totals[:VAL_TOTALS]``: its loss times its images, its correct predictions, its images."""
    batch = labels.numel()
    totals[0] += loss.double() * batch
    totals[1] += (logits.argmax(dim=1) == labels).sum()
    totals[2] += batch


def add_confusion(totals: torch.Tensor, predictions: torch.Tensor, labels: torch.Tensor) -> None:
    """Count (label, prediction) pairs into ``totals[VAL_TOTALS:]``; nothing when it has no room."""
    cells = totals.numel() - VAL_TOTALS
    if cells <= 0:
        return
    num_classes = round(cells ** 0.5)
    pairs = (labels.to(predictions.device) * num_classes + predictions).to(totals.device)
    # Added in place, on the device: CUDA's bincount reads its input's min and max back to the host to
    # size its output, two blocking reads per batch that would stall the queue of validation batches.
    totals[VAL_TOTALS:].index_add_(0, pairs, torch.ones(len(pairs), dtype=totals.dtype, device=totals.device))


def confusion_record(epoch: int, class_names: list[str] | tuple[str, ...], counts: list[float]) -> dict:
    """What ``runs.measurements["confusion"]`` holds: the epoch, class names, the matrix (rows
    true, columns predicted; omitted past MAX_STORED_CLASSES) and each class's accuracy (None
    where the validation split holds no image of it)."""
    num_classes = len(class_names)
    matrix = [[int(counts[row * num_classes + col]) for col in range(num_classes)] for row in range(num_classes)]
    per_class = [(matrix[c][c] / sum(matrix[c])) if sum(matrix[c]) else None for c in range(num_classes)]
    record = {"epoch": epoch, "class_names": list(class_names), "per_class_acc": per_class,
              "support": [sum(row) for row in matrix]}
    if num_classes <= MAX_STORED_CLASSES:
        record["matrix"] = matrix
    else:
        record["matrix"] = None
        record["matrix_omitted"] = (f"{num_classes} classes: the matrix is kept only up to {MAX_STORED_CLASSES} "
                                    "classes; per-class accuracy is complete")
    return record
