"""BatchNorm statistics that describe the weights being validated.

Validation runs BatchNorm in eval mode, on running averages updated with momentum 0.1 during
training: they mostly remember the last ten or so steps' weights. When the weights change fast
(a short run, a few steps per epoch) those averages trail them and validation accuracy reads far
below training accuracy although the model has learnt. Before each validation Parallax
therefore re-estimates the statistics from a fixed sample of training images with the current
weights, in train mode, without gradients, as an equal-weight average over the batches
("precise BN", Wu and Johnson, *Rethinking "Batch" in BatchNorm*, 2021). The weights are untouched.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, Subset

# Validation accuracy this far below training accuracy, with running averages this young, is
# what lagging statistics look like (overfitting on a dataset this size takes more steps).
LAG_GAP = 0.3
LAG_MIN_TRAIN_ACC = 0.5
LAG_MAX_STEPS = 500


def batchnorm_layers(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    return [m for m in model.modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]


def statistics_loader(train_loader: DataLoader, max_images: int, seed: int, *, full_batches: bool) -> DataLoader | None:
    """The same fixed sample of training images every epoch and on every rank (a sharded forward
    needs every rank to run as many batches), in batches of the training batch; None when too
    few images make a batch (train-mode BatchNorm needs two; a pipeline needs a whole batch)."""
    dataset, batch = train_loader.dataset, train_loader.batch_size
    count = min(len(dataset), max_images)
    if count < (batch if full_batches else 2):
        return None
    indices = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:count].tolist()
    # A last batch of one image breaks train-mode BatchNorm; pipelines take whole batches only.
    drop_last = full_batches or count % batch == 1
    return DataLoader(Subset(dataset, indices), batch_size=batch, shuffle=False, drop_last=drop_last,
                      collate_fn=train_loader.collate_fn)


@torch.no_grad()
def reestimate(model: nn.Module, loader: DataLoader, forward: Callable[[torch.Tensor, torch.Tensor], object]) -> bool:
    """Reset ``model``'s BatchNorm statistics and recompute them with ``forward(images, labels)``
    over ``loader``. Returns False (and changes nothing) when the model has no BatchNorm."""
    layers = batchnorm_layers(model)
    if not layers:
        return False
    momenta = [layer.momentum for layer in layers]
    was_training = model.training
    for layer in layers:
        layer.reset_running_stats()
    # An equal-weight average over every forward call below (a pipeline calls each layer once per
    # micro-batch). BatchNorm's own cumulative mode (momentum None) reads num_batches_tracked on the
    # host in every layer, a device sync per layer and batch on a GPU; a host count per layer gives
    # the same average: the k-th call moves the statistics 1/k of the way.
    hooks = [layer.register_forward_pre_hook(_cumulative_momentum(layer)) for layer in layers]
    model.train()
    try:
        # The momentum changes at every call, which a torch.compile'd model would guard and
        # recompile on; eager is faster here.
        with torch.compiler.set_stance("force_eager"):
            for images, labels in loader:
                forward(images, labels)
    finally:
        for hook in hooks:
            hook.remove()
        for layer, momentum in zip(layers, momenta):
            layer.momentum = momentum
        model.train(was_training)
    return True


def _cumulative_momentum(layer: nn.modules.batchnorm._BatchNorm) -> Callable:
    calls = 0

    def before_forward(module, inputs):
        nonlocal calls
        calls += 1
        layer.momentum = 1.0 / calls

    return before_forward


def lag_note(*, train_acc: float, val_acc: float, epoch: int, steps_per_epoch: int, reestimated: bool,
             has_batchnorm: bool) -> str | None:
    """A run note when validation accuracy trails training accuracy the way lagging BatchNorm
    running averages make it, or None."""
    steps = epoch * steps_per_epoch
    if (not has_batchnorm or reestimated or train_acc < LAG_MIN_TRAIN_ACC or train_acc - val_acc < LAG_GAP
            or steps > LAG_MAX_STEPS):
        return None
    return (f"Epoch {epoch}: validation accuracy {val_acc:.1%} trails training accuracy {train_acc:.1%}. "
            f"After only {steps} steps ({steps_per_epoch} per epoch) BatchNorm's running statistics, which "
            "validation uses, still lag the fast-changing weights, so validation under-reads what the model "
            "has learnt. Re-estimate them before validation (bn_stats_images above 0, the default), or train "
            "more steps (more epochs, a smaller batch).")
