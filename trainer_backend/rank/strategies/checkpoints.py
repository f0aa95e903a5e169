"""What a strategy's processes save and load: the best checkpoint's state dict under timm's names, and a resume
point's model and optimizer state. Assembling either is a collective for sharded and pipelined models, so every
rank calls them; rank 0 gets the whole, the others None. A strategy owns one (``strategy.checkpoints``):

    WholeModel    single, dp, ddp, mp: rank 0's copy is the whole
    Sharded       fsdp: every rank's shards gathered whole
    StageStates   pp: every stage's tensors gathered on rank 0

    state = strategy.checkpoints.checkpoint_state(model)     # best.pt
    point = strategy.checkpoints.resume_state(model, optimizer)
    strategy.checkpoints.load_resume_state(model, optimizer, point)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from trainer_backend.rank.strategies.replica_sync import unwrap


def on_cpu(state):
    """A (nested) state dict with every tensor on the CPU: what a resume file holds, so
    that loading it puts nothing on the GPU the saving rank happened to use."""
    if isinstance(state, torch.Tensor):
        return state.detach().cpu()
    if isinstance(state, dict):
        return {key: on_cpu(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(on_cpu(value) for value in state)
    return state


class WholeModel:
    """A whole model on rank 0 (replicated, or one process): its copy is saved. ``named`` gives the module whose
    state_dict has timm's parameter names (the model without its wrapper; mp's staged model's source)."""

    def __init__(self, is_main: bool, named: Callable[[nn.Module], nn.Module] = unwrap):
        self.is_main, self.named = is_main, named

    def checkpoint_state(self, model: nn.Module) -> dict[str, torch.Tensor] | None:
        """The full state dict on rank 0 (None elsewhere). Called on every rank, since for
        sharded and pipelined models assembling it is a collective."""
        if not self.is_main:
            return None
        return {k: v.detach().cpu() for k, v in self.named(model).state_dict().items()}

    def resume_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
        """Model and optimizer state to carry on training from, on rank 0 (None elsewhere);
        collective, like ``checkpoint_state``. Replicated strategies need rank 0's copy only."""
        if not self.is_main:
            return None
        return on_cpu({"model": unwrap(model).state_dict(), "optimizer": optimizer.state_dict()})

    def load_resume_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Load what ``resume_state`` returned; every rank is given the whole of it."""
        unwrap(model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])


class Sharded(WholeModel):
    """FSDP2: every rank's shards, gathered whole (so a restart may shard them over a new world)."""

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


class StageStates(WholeModel):
    """A pipeline: each stage holds its own layers; ``state_names`` (set when the model is cut) are this stage's
    tensors under timm's names."""

    def __init__(self, rank: int, world_size: int):
        super().__init__(rank == 0)
        self.rank, self.world_size = rank, world_size
        self.state_names: list[tuple[str, torch.Tensor]] = []

    def resume_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
        """Every stage's module and optimizer state, gathered on rank 0 as a list by stage."""
        local = on_cpu({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
        gathered: list[dict] | None = [None] * self.world_size if self.is_main else None
        dist.gather_object(local, gathered, dst=0)
        return {"stages": gathered} if self.is_main else None

    def load_resume_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        if len(state["stages"]) != self.world_size:
            raise ValueError(f"the checkpoint holds {len(state['stages'])} pipeline stages and this world has "
                             f"{self.world_size} processes: a pipeline resumes only on as many processes as it had")
        own = state["stages"][self.rank]
        model.load_state_dict(own["model"])
        optimizer.load_state_dict(own["optimizer"])

    def checkpoint_state(self, model: nn.Module) -> dict[str, torch.Tensor] | None:
        """Gather every stage's tensors, under timm's names, on rank 0."""
        local = {name: tensor.detach().cpu() for name, tensor in self.state_names}
        gathered: list[dict] | None = [None] * self.world_size if self.is_main else None
        dist.gather_object(local, gathered, dst=0)
        if not self.is_main:
            return None
        state: dict[str, torch.Tensor] = {}
        for part in gathered:
            state.update(part)
        return state
