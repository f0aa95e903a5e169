"""The protocol every strategy keeps, and ``single``: one device, where every collective is a no-op.

Also what all strategies share: mixed precision (``autocast``), the sync before a wall-clock reading
(``synchronize``), and how long a rank waits in a collective (``collective_timeout``).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
from collections.abc import Iterable

import torch
from torch import nn
from torch.utils.data import Sampler

from contract.environment import seconds_from_env
from contract.config import RunConfig
from trainer_backend.engine.batchnorm import reestimate
from trainer_backend.telemetry.rank_times import RankClock, synchronize  # noqa: F401 (every strategy syncs before a clock)

COLLECTIVE_TIMEOUT_ENV = "PARALLAX_COLLECTIVE_TIMEOUT_S"
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0
# Rendezvous waits for every rank to start (imports, data loading): never shorter than this.
RENDEZVOUS_TIMEOUT = datetime.timedelta(minutes=10)


def collective_timeout() -> datetime.timedelta:
    """How long a rank waits in a collective for the others before the run fails:
    ``PARALLAX_COLLECTIVE_TIMEOUT_S`` seconds, default 600. gloo raises in the waiting rank
    when it passes; NCCL's watchdog tears the waiting process down."""
    return datetime.timedelta(seconds=seconds_from_env(COLLECTIVE_TIMEOUT_ENV, DEFAULT_COLLECTIVE_TIMEOUT_S))


def autocast(device: torch.device, amp_dtype: torch.dtype | None):
    """Mixed precision on ``device`` in ``amp_dtype``; nothing for plain fp32."""
    if amp_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=amp_dtype)


class Strategy:
    """Single device, and the defaults every other strategy starts from."""

    name = "single"
    # True where the strategy runs each training step itself (``train_step``, inside the shared epoch
    # loop, which its ``train_epoch`` wraps) and its own ``evaluate``: a pipeline's schedule interleaves
    # the microbatches' forward and backward.
    runs_own_loop = False
    # Validation totals are summed across processes (each holds a shard, or zeros); False where
    # every process evaluates the whole set (FSDP) and one copy of the numbers is the answer.
    sum_val_across_ranks = True
    drop_last_train = False
    # How this strategy's time in collectives is measured (see rank_times.RankClock): "none" has none.
    comm_measure = "none"

    @classmethod
    def create(cls, config: RunConfig, rank: int = 0, *, in_chans: int = 3, store_host: str = "",
               store_port: int = 0) -> Strategy:
        """The strategy for ``rank``, given everything any strategy needs; each takes what it uses."""
        return cls(config, rank)

    def __init__(self, config: RunConfig, rank: int = 0):
        self.config = config
        self.rank = rank
        self.world_size = 1
        self.input_device = torch.device(config.devices[0])
        self.output_device = self.input_device
        # The device-side batch preparation (inputs.DeviceInputs), set by the trainer once the
        # data is known; without it a batch's tensors go to the devices as they are.
        self.inputs = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @functools.cached_property
    def rank_clock(self) -> RankClock:
        """This process's split of each epoch's training time (data, compute, waiting in collectives)."""
        return RankClock(self.input_device, self.comm_measure)

    @property
    def devices(self) -> list[torch.device]:
        """Every device this process computes on (for synchronised timing and memory)."""
        return [self.input_device]

    def setup(self) -> None:
        if self.input_device.type == "cuda":
            torch.cuda.set_device(self.input_device)
            # Every batch has the same shape, so cuDNN's one-off search for the fastest
            # convolution algorithms pays for itself within the first epoch.
            torch.backends.cudnn.benchmark = True

    @staticmethod
    def memory_placement(plan) -> list:
        """The model whole on its device, training on the whole batch (see memory_estimate.py)."""
        (label,) = plan.labels()
        return [plan.whole(label, plan.config.batch_size)]

    def wrap(self, model: nn.Module) -> nn.Module:
        return model.to(self.input_device)

    def feed(self, data):
        """The data this process reads its batches from (a PreparedData): all of it, unless the
        process computes on only part of each batch (a pipeline's stages)."""
        return data

    def to_device(self, images: torch.Tensor, labels: torch.Tensor, *, train: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """A loader's batch as the model takes it: images on the input device (normalised and,
        for training batches, augmented there), labels on the output device."""
        labels = labels.to(self.output_device, non_blocking=True)
        if self.inputs is None:
            return images.to(self.input_device, non_blocking=True), labels
        return self.inputs(images, train=train), labels

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The model without its data-parallel wrapper: what evaluation runs."""
        return model

    def checkpoint_module(self, model: nn.Module) -> nn.Module:
        """The module whose state_dict has timm's parameter names: what a checkpoint saves."""
        return self.unwrap(model)

    def checkpoint_state(self, model: nn.Module) -> dict[str, torch.Tensor] | None:
        """The full state dict on rank 0 (None elsewhere). Called on every rank, since for
        sharded and pipelined models assembling it is a collective."""
        if not self.is_main:
            return None
        return {k: v.detach().cpu() for k, v in self.checkpoint_module(model).state_dict().items()}

    def resume_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
        """Model and optimizer state to carry on training from, on rank 0 (None elsewhere);
        collective, like ``checkpoint_state``. Replicated strategies need rank 0's copy only."""
        if not self.is_main:
            return None
        return on_cpu({"model": self.unwrap(model).state_dict(), "optimizer": optimizer.state_dict()})

    def load_resume_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Load what ``resume_state`` returned; every rank is given the whole of it."""
        self.unwrap(model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    def reestimate_batchnorm(self, model: nn.Module, loader, *, amp_dtype=None) -> bool:
        """Recompute the evaluated module's BatchNorm statistics over ``loader`` (every rank the
        same batches); False when it has none. See batchnorm.py."""
        module = self.unwrap(model)

        def forward(images: torch.Tensor, labels: torch.Tensor) -> None:
            with autocast(self.input_device, amp_dtype):
                module(self.to_device(images, labels)[0])

        return reestimate(module, loader, forward)

    def extra_metrics(self) -> dict:
        """Strategy-specific numbers for the epoch (e.g. pipeline stage busy time); collective."""
        return {}

    def no_grad_sync(self, model: nn.Module):
        """A context in which backward passes add gradients up locally, without reducing them
        across processes (the accumulation batches before an optimizer step)."""
        return contextlib.nullcontext()

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        """Scale the gradients so that their global norm is at most ``max_norm``; returns the norm before."""
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)

    def replica_batches(self, images: int) -> list[int]:
        """The batches a batch of ``images`` becomes on the model's replicas (one here)."""
        return [images] if images else []

    def train_sampler(self, dataset_len: int, seed: int) -> Sampler | None:
        return None  # the loader shuffles with a seeded generator

    def val_indices(self, dataset_len: int) -> Iterable[int] | None:
        return None

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        return tensor

    def sync_buffers(self, model: nn.Module) -> None:
        """Make every process evaluate the same weights (BatchNorm statistics included)."""

    def barrier(self) -> None:
        """Wait for every process of the run."""

    def teardown(self) -> None:
        pass


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
