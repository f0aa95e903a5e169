"""Parallel strategies: one small class each, behind one protocol.

A strategy owns what differs between single-device, DataParallel, DistributedDataParallel and
model-parallel training: where inputs and labels go, how the model is wrapped, how the data
is sharded, and how numbers are summed across processes. Where a collective does not apply
(one process), it is a no-op, so the training loop has no strategy branches. This module knows
devices and collectives only: the loops (``loop``) run steps over a strategy, never the reverse.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DistributedSampler, Sampler

from db.settings import seconds_from_env

from .batchnorm import reestimate
from .config import RunConfig, threads_per_process
from .models import StagedModel, flatten_sequential, split_into_stages
from .rank_times import RankClock

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


def synchronize(devices: list[torch.device]) -> None:
    """Wait for queued GPU work so that wall-clock timings measure the work, not its launch."""
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)


class Strategy:
    """Single device, and the defaults every other strategy starts from."""

    name = "single"
    # True where the strategy steps through an epoch itself (its own ``train_epoch`` and
    # ``evaluate``): a pipeline's schedule interleaves the microbatches' forward and backward.
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


class _AutocastReplica(nn.Module):
    """Runs a DataParallel replica under the caller's autocast dtype. DataParallel's worker threads
    re-enter autocast with only ``enabled`` and autocast state is per thread, so without this
    each replica would run in the thread's default dtype (fp16 on CUDA), whatever the run chose."""

    def __init__(self, module: nn.Module, device_type: str, dtype: torch.dtype):
        super().__init__()
        self.module, self.device_type, self.dtype = module, device_type, dtype

    def forward(self, *args, **kwargs):
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.module(*args, **kwargs)


class AutocastDataParallel(nn.DataParallel):
    """``nn.DataParallel`` whose replicas run in the autocast dtype active where it is called."""

    def __init__(self, module: nn.Module, *args, **kwargs):
        super().__init__(module, *args, **kwargs)
        self.autocast_device_type = self.src_device_obj.type if self.device_ids else "cpu"

    def parallel_apply(self, replicas, inputs, kwargs):
        device_type = self.autocast_device_type
        if torch.is_autocast_enabled(device_type):
            dtype = torch.get_autocast_dtype(device_type)
            replicas = [_AutocastReplica(replica, device_type, dtype) for replica in replicas]
        return super().parallel_apply(replicas, inputs, kwargs)


class DataParallelStrategy(Strategy):
    name = "dp"

    @staticmethod
    def memory_placement(plan) -> list:
        """On GPUs, the first holds the model, its gradients and optimizer state, the whole input
        batch and the gathered outputs; every other GPU a replica of the parameters (made anew each
        step) with their gradients, for its share of the batch. On CPU a pass-through: single's."""
        config = plan.config
        if not config.uses_cuda:
            return [plan.whole("cpu", config.batch_size)]
        share = config.per_device_batch
        first = plan.whole(config.devices[0], share)
        rest_of_batch = config.batch_size - share
        first.activations += (rest_of_batch * plan.input_bytes_per_image()
                              + config.batch_size * plan.num_classes * 4)
        trace = plan.trace(share)
        replicas = []
        for label in config.devices[1:]:
            replica = plan.held(label, plan.model)
            parameters = replica.parameters + replica.activations  # broadcast weights and buffers
            replicas.append(type(replica)(label, activations=parameters + trace.backward_peak))
        return [first, *replicas]

    def wrap(self, model: nn.Module) -> nn.Module:
        model = model.to(self.input_device)
        if self.input_device.type != "cuda":
            # Without CUDA, DataParallel has no device_ids and simply calls the module: the
            # wrapper is kept so the run exercises the same code, and a run note says so.
            return AutocastDataParallel(model)
        ids = [torch.device(d).index for d in self.config.devices]
        return AutocastDataParallel(model, device_ids=ids, output_device=ids[0])

    @property
    def devices(self) -> list[torch.device]:
        return [torch.device(d) for d in dict.fromkeys(self.config.devices)]

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module

    def replica_batches(self, images: int) -> list[int]:
        # DataParallel scatters with Tensor.chunk: 3 images over 2 GPUs are 2 and 1, 5 over 4 are 2, 2 and 1.
        if self.input_device.type != "cuda" or not images:
            return super().replica_batches(images)
        return [len(part) for part in torch.arange(images).chunk(len(self.config.devices))]

    @property
    def comm_measure(self) -> str:
        # Over several GPUs the scatter, replication and gather happen inside the forward call.
        return "unmeasured" if len(self.devices) > 1 else "none"


class DistributedStrategy(Strategy):
    """One process per device; the store is the run's own TCPStore, so two runs never share a port."""

    name = "ddp"
    comm_measure = "hook"

    @classmethod
    def create(cls, config: RunConfig, rank: int = 0, *, in_chans: int = 3, store_host: str = "",
               store_port: int = 0) -> Strategy:
        return cls(config, rank, store_host, store_port)

    def __init__(self, config: RunConfig, rank: int, store_host: str = "", store_port: int = 0):
        super().__init__(config, rank)
        self.world_size = len(config.devices)
        self.input_device = self.output_device = torch.device(config.devices[rank])
        self.store_host, self.store_port = store_host, store_port

    def setup(self) -> None:
        super().setup()
        # Spawned workers inherit every core's worth of threads; N of them oversubscribe the CPU,
        # and on GPUs that CPU is what launches kernels and feeds the loaders.
        torch.set_num_threads(threads_per_process(self.config))
        if dist.is_initialized():
            return  # torchrun started this process and it has joined torchrun's world already
        backend = "nccl" if self.input_device.type == "cuda" else "gloo"
        timeout = collective_timeout()
        if self.world_size == 1 and not self.store_port:
            # A world of one is not spawned: the process serves its own store and forms a process
            # group of one, so DDP and FSDP wrap and reduce exactly as they do over several ranks.
            self._store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timeout, wait_for_workers=False)
        elif not self.store_port:
            # Connecting to port 0 would wait in C++ for a store nobody serves, deaf to signals.
            raise RuntimeError(f"rank {self.rank} of {self.world_size} was started without the run's rendezvous store")
        else:
            self._store = dist.TCPStore(self.store_host, self.store_port, None, False,
                                        timeout=max(timeout, RENDEZVOUS_TIMEOUT))
        # Bound to the rank's GPU: NCCL then makes its context and communicator there, and a collective
        # that names no device (a barrier, FSDP's and the pipeline's first) runs there too, not on
        # GPU rank % count, which under --devices 1,0 or 2,3 belongs to another rank or another user.
        dist.init_process_group(backend, store=self._store, rank=self.rank, world_size=self.world_size, timeout=timeout,
                                device_id=self.input_device if self.input_device.type == "cuda" else None)

    @staticmethod
    def memory_placement(plan) -> list:
        """A full replica per process on its share of the batch, and DDP's gradient buckets
        (bucket_cap_mb 25, together as large as the gradients) for the all-reduce."""
        devices = []
        for label in plan.labels():
            device = plan.whole(label, plan.config.per_device_batch)
            device.comm = device.gradients
            devices.append(device)
        return devices

    def wrap(self, model: nn.Module) -> nn.Module:
        model = model.to(self.input_device)
        ids = [self.input_device.index] if self.input_device.type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids)
        ddp.register_comm_hook(None, self.rank_clock.allreduce_hook)  # the same all-reduce, timed
        self.rank_clock.watch_forward_sync(ddp)
        return ddp

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module

    def no_grad_sync(self, model: nn.Module):
        return model.no_sync()

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

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
        dist.all_reduce(tensor, op=reduce_op)
        return tensor

    def barrier(self) -> None:
        if self.input_device.type == "cuda":
            dist.barrier(device_ids=[self.input_device.index])  # NCCL's barrier is an all-reduce on a device
        else:
            dist.barrier()

    def sync_buffers(self, model: nn.Module) -> None:
        # Each rank updated BatchNorm statistics with its own last batch; take rank 0's, which is
        # what the checkpoint saves, so the validation numbers describe the saved model.
        for buffer in self.unwrap(model).buffers():
            dist.broadcast(buffer, src=0)

    def teardown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        self._store = None  # a world of one stops serving its store here


class ModelParallelStrategy(Strategy):
    name = "mp"

    @classmethod
    def create(cls, config: RunConfig, rank: int = 0, *, in_chans: int = 3, store_host: str = "",
               store_port: int = 0) -> Strategy:
        return cls(config, rank, in_chans=in_chans)

    def __init__(self, config: RunConfig, rank: int = 0, *, in_chans: int = 3):
        super().__init__(config, rank)
        self.stage_devices = [torch.device(d) for d in config.devices]
        self.input_device, self.output_device = self.stage_devices[0], self.stage_devices[-1]
        self.in_chans = in_chans

    @property
    def devices(self) -> list[torch.device]:
        return list(dict.fromkeys(self.stage_devices))

    @staticmethod
    def memory_placement(plan) -> list:
        """Stage i (its layers' parameters, gradients, optimizer state) on device i, each training
        on the whole batch; stages sharing one device (CPU) are one step of the whole model."""
        config = plan.config
        if len(set(config.devices)) == 1:
            return [plan.whole(config.devices[0], config.batch_size)]
        return [plan.stage_memory(label, i, config.batch_size)[0] for i, label in enumerate(config.devices)]

    def wrap(self, model: nn.Module) -> nn.Module:
        stages = split_into_stages(
            model, len(self.stage_devices), in_chans=self.in_chans,
            image_size=self.config.image_size, name=self.config.model,
        )
        return StagedModel(stages, self.stage_devices, source=model)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model  # StagedModel runs the stages in order; its source holds timm's names

    def checkpoint_module(self, model: nn.Module) -> nn.Module:
        return model.source


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
