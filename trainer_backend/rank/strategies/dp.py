"""``dp``: DataParallel, one process driving every GPU (on CPU a pass-through)."""

from __future__ import annotations

import torch
from torch import nn

from contract.config import RunConfig
from trainer_backend.rank.strategies import placements
from trainer_backend.rank.strategies.base import Strategy
from trainer_backend.rank.strategies.data_shards import ScatteredBatches


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
    memory_placement = staticmethod(placements.data_parallel)

    def __init__(self, config: RunConfig, rank: int = 0, **given):
        # Over several GPUs the scatter, replication and gather happen inside the forward call.
        self.comm_measure = "unmeasured" if len(set(config.devices)) > 1 else "none"
        super().__init__(config, rank, **given)
        self.devices = [torch.device(d) for d in dict.fromkeys(config.devices)]
        if self.input_device.type == "cuda":
            self.shards = ScatteredBatches(len(config.devices))

    def wrap(self, model: nn.Module) -> nn.Module:
        model = model.to(self.input_device)
        if self.input_device.type != "cuda":
            # Without CUDA, DataParallel has no device_ids and simply calls the module: the
            # wrapper is kept so the run exercises the same code, and a run note says so.
            return AutocastDataParallel(model)
        ids = [torch.device(d).index for d in self.config.devices]
        return AutocastDataParallel(model, device_ids=ids, output_device=ids[0])
