"""``dp``: DataParallel, one process driving every GPU (on CPU a pass-through)."""

from __future__ import annotations

import torch
from torch import nn

from trainer_backend.engine.strategies.base import Strategy


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
        # Over several GPUs each replica's forward runs in a thread of its own, apart from the thread that crops.
        first = plan.whole(config.devices[0], share, forward_elsewhere=len(config.devices) > 1)
        rest_of_batch = config.batch_size - share
        first.activations += (rest_of_batch * plan.input_bytes_per_image()
                              + config.batch_size * plan.num_classes * 4)
        trace = plan.trace(share)
        replicas = []
        for label in config.devices[1:]:
            replica = plan.held(label, plan.model)
            parameters = replica.parameters + replica.activations  # broadcast weights and buffers
            replica = type(replica)(label, activations=parameters + trace.backward_peak)
            replica.add_workspace(plan.blas_workspace(label, trace, takes_input=False))
            replicas.append(replica)
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
