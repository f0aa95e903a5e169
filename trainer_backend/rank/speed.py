"""The speed switches applied to a built model: channels_last memory format and torch.compile.

    model = to_memory_format(create_model(...), config)     # before the strategy wraps it
    model = strategy.wrap(model)
    compile_model(model, strategy)                          # in place: state_dict names unchanged
    compile_s = compile_warmup(model, loaders, strategy, amp_dtype)

``torch.compile`` compiles on the first call of each input shape and mode, taking seconds to
minutes. ``compile_warmup`` makes the training call before the first epoch (a forward and
backward of one batch without an optimizer step) and restores the BatchNorm buffers it moved, so
epoch 1 starts from the weights and statistics of an eager run and no epoch's training time or
images/s includes compilation. With compile on, training batches all have the full size (the
short last batch is dropped): a second shape would compile a second, dynamic-shape graph.
Validation and BatchNorm re-estimation compile on their first use, inside epoch 1's time but
outside its training time.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from contract.config import RunConfig
from trainer_backend.rank.strategies import Strategy, autocast, synchronize, unwrap


def to_memory_format(model: nn.Module, config: RunConfig) -> nn.Module:
    # Convolution weights in NHWC match NHWC inputs: cuDNN's tensor-core kernels need both.
    return model.to(memory_format=torch.channels_last) if config.channels_last else model


def compile_model(model: nn.Module, strategy: Strategy) -> None:
    """Compile the module evaluation runs (inside DDP's wrapper, so training uses it too), in
    place: checkpoints and resume points keep timm's parameter names."""
    unwrap(model).compile()


def first_images(loader: DataLoader, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of ``size`` straight from the dataset: iterating the loader would move its seeded
    shuffle and make epoch 1 differ from an eager run's."""
    return loader.collate_fn(loader.dataset.__getitems__(list(range(size))))


def compile_warmup(model: nn.Module, loaders: tuple[DataLoader, DataLoader], strategy: Strategy,
                   amp_dtype: torch.dtype | None) -> float:
    """Seconds this process spent compiling the training step (and running it once), synchronised."""
    train_loader = loaders[0]
    module = unwrap(model)
    saved = [buffer.detach().clone() for buffer in module.buffers()]
    synchronize(strategy.devices)
    start = time.perf_counter()
    module.train()
    # One shape: a compiled run's training loader drops its short last batch (trainer.build_loaders).
    size = min(train_loader.batch_size, len(train_loader.sampler))
    images, labels = strategy.to_device(*first_images(train_loader, size))
    with autocast(strategy.input_device, amp_dtype):
        loss = F.cross_entropy(model(images), labels)
    loss.backward()
    module.zero_grad(set_to_none=True)
    with torch.no_grad():
        for buffer, value in zip(module.buffers(), saved):
            buffer.copy_(value)
    synchronize(strategy.devices)
    return time.perf_counter() - start


def compile_note(compile_time_s: float) -> str:
    return (f"torch.compile: compiling the training step took {compile_time_s:.1f} s before epoch 1 (the slowest "
            "process), left out of every epoch's training time and images/s. Training drops the short last batch "
            "of each epoch (one batch shape, one compiled graph); validation compiles on first use, inside "
            "epoch 1's time.")
