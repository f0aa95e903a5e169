"""How the model's copies keep in step: whether a backward pass reduces its gradients across processes
(``no_sync`` defers it over an accumulation group), the norm gradients are clipped by (over every
process's share), and whose BatchNorm statistics every process evaluates. A strategy owns one
(``strategy.sync``):

    OneReplica        single, dp, mp: one copy; nothing to reduce or share
    Replicas          ddp: DistributedDataParallel's copies; rank 0's buffers broadcast before evaluation
    ShardedReplicas   fsdp: FSDP2's shards; the norm of sharded gradients made whole
    Stages            pp: each stage holds some of the gradients; the norm adds every stage's

    with strategy.sync.no_sync(model): loss.backward()
    strategy.sync.clip_grad_norm(model, max_norm)
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn


def unwrap(model: nn.Module) -> nn.Module:
    """The model without its data-parallel wrapper (DistributedDataParallel's, DataParallel's): what evaluation
    runs; the model itself for the strategies that change or cut it in place (fsdp, mp, pp) or keep it whole."""
    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        return model.module
    return model


class OneReplica:
    """One copy of the model: backward adds up locally, and the norm is its own gradients'."""

    def no_sync(self, model: nn.Module):
        """A context in which backward passes add gradients up locally, without reducing them
        across processes (the accumulation batches before an optimizer step)."""
        return contextlib.nullcontext()

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        """Scale the gradients so that their global norm is at most ``max_norm``; returns the norm before."""
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)

    def sync_buffers(self, model: nn.Module) -> None:
        """Make every process evaluate the same weights (BatchNorm statistics included)."""


class Replicas(OneReplica):
    """DistributedDataParallel: a full copy per process, gradients all-reduced on the group's last backward."""

    def no_sync(self, model: nn.Module):
        return model.no_sync()

    def sync_buffers(self, model: nn.Module) -> None:
        # Each rank updated BatchNorm statistics with its own last batch; take rank 0's, which is
        # what the checkpoint saves, so the validation numbers describe the saved model.
        for buffer in unwrap(model).buffers():
            dist.broadcast(buffer, src=0)


class ShardedReplicas(Replicas):
    """FSDP2: each process holds a shard of every parameter and gradient."""

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module):
        model.set_requires_gradient_sync(False)  # FSDP2's no_sync: no reduce-scatter on these backwards
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        # Sharded gradients are DTensors: their norm is a DTensor too, made whole (a collective)
        # before the scale is applied to every shard.
        from torch.distributed.tensor import DTensor

        params = [p for p in model.parameters() if p.grad is not None]
        total = torch.nn.utils.get_total_norm([p.grad for p in params])
        if isinstance(total, DTensor):
            total = total.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total


class Stages(OneReplica):
    """A pipeline: each stage owns its layers (and their buffers) outright, and some of the gradients."""

    def __init__(self, group, device: torch.device):
        self.group, self.device = group, device

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        """Each stage holds some of the gradients: the global norm adds every stage's squares."""
        params = [p for p in model.parameters() if p.grad is not None]
        local = torch.nn.utils.get_total_norm([p.grad for p in params]) if params else torch.zeros(())
        squares = (local.double() ** 2).reshape(1).to(self.device)
        total = self.group.all_reduce(squares).sqrt()[0].float()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total
