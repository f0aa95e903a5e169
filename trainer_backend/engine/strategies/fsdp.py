"""``fsdp``: FSDP2, parameters, gradients and optimizer state sharded over the processes."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from trainer_backend.engine.models import flatten_sequential
from trainer_backend.engine.strategies.ddp import DistributedStrategy


class FullyShardedStrategy(DistributedStrategy):
    """FSDP2: ``fully_shard`` on every block and on the root, over a 1-D device mesh."""

    name = "fsdp"
    sum_val_across_ranks = False  # a sharded forward is a collective: every rank runs the same batches

    @staticmethod
    def memory_placement(plan) -> list:
        """Each process holds 1/N of every parameter, gradient and optimizer state (padded shards),
        the activations of its share of the batch, and gathered units: in backward the unit being
        computed, the next one prefetched and the first's unsharded gradients (three times the
        largest unit), plus the root's own parameters, which stay gathered."""
        world, batch = plan.config.world_size, plan.config.per_device_batch
        trace = plan.trace(batch)
        units = plan.fsdp_units()
        devices = []
        for rank, label in enumerate(plan.labels()):
            device = plan.shard(label, rank, world)
            device.activations += trace.backward_peak - trace.grads_at_peak
            device.add_workspace(plan.blas_workspace(label, trace))
            device.comm = 3 * max(units[:-1], default=0) + units[-1]
            devices.append(device)
        return devices

    def wrap(self, model: nn.Module) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        model = model.to(self.input_device)
        mesh = init_device_mesh(self.input_device.type, (self.world_size,))
        blocks = sharded_blocks(model)
        for block in blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        self.rank_clock.watch_fsdp(model, blocks)  # the gathers and reduce-scatters happen in FSDP's hooks
        return model

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model  # fully_shard changes the module in place

    def val_indices(self, dataset_len: int) -> None:
        return None

    @contextlib.contextmanager
    def no_grad_sync(self, model: nn.Module):
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

    def checkpoint_state(self, model: nn.Module) -> dict[str, torch.Tensor] | None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state if self.is_main else None

    def resume_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        # Gathered whole (the shards of every rank), so a restart may shard it over a new world.
        model_state, optimizer_state = get_state_dict(
            model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {"model": model_state, "optimizer": optimizer_state} if self.is_main else None

    def load_resume_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                       options=StateDictOptions(full_state_dict=True))


def sharded_blocks(model: nn.Module) -> list[nn.Module]:
    """The units FSDP shards one by one: the model's sequential layers that hold parameters."""
    return [layer for layer in flatten_sequential(model) if any(True for _ in layer.parameters())]
