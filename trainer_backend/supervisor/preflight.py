"""What every launcher (the runner, torchrun) does around training: check the data and the model
before anything trains (``preflight``), say what is starting (``announce``), and say what to
change when a run fails for want of GPU memory (``with_oom_hint``).

    info = preflight(config)                           # ConfigError, DatasetError, ModelError
    announce(run_id, config, info, run_notes(config, info))
"""

from __future__ import annotations

import re

import torch

from contract.config import ConfigError, RunConfig, data_on_device_problem, strategy_notes
from contract.strategy_specs import spec
from trainer_backend.datasets import DatasetInfo
from contract.model_source import is_custom_model, model_source
from trainer_backend.rank.custom_model import build_custom_model, check_output, input_channels
from trainer_backend.rank.models import ModelError, create_model, split_into_stages
from contract.printable import one_line, shown_name
from contract.storage import DiskFullError
from trainer_backend.rank.trainer import load_data, make_strategy

OOM_HINT = ("out of memory: try a smaller --batch-size (or a smaller --image-size or model, or --data-on-device off "
            "to keep the dataset in host memory)")
# How running out of GPU memory reads in each library's own words.
OUT_OF_MEMORY = re.compile(
    r"OutOfMemoryError|CUDA out of memory"  # PyTorch's caching allocator
    r"|CUBLAS_STATUS_ALLOC_FAILED"  # cuBLAS: a handle or workspace
    r"|CUDNN_STATUS_ALLOC_FAILED|CUDNN_STATUS_INTERNAL_ERROR_(?:HOST|DEVICE)_ALLOCATION_FAILED"  # cuDNN 8, cuDNN 9
    r"|Cuda failure (?:\d+ )?'out of memory'|Failed to CUDA (?:calloc|malloc)"  # NCCL's last error
)
USER_ERRORS = (ValueError, LookupError, FileNotFoundError, DiskFullError)  # ConfigError, DatasetError, ModelError


def preflight(config: RunConfig, data_roots: list | None = None) -> DatasetInfo:
    """Decode (or load the cached) dataset and build the model once on CPU, so that bad data,
    an unknown model, missing pretrained weights, an image size the model cannot take, or a
    model that cannot be cut for mp all fail here, with a message, before training starts."""
    data = load_data(config, data_roots)
    info = data.info
    check_every_rank_trains(config, info.num_train, info.in_chans)
    check_data_fits(config, data.train.stored_bytes + data.val.stored_bytes)
    check_profile_window(config, train_steps(config, info.num_train, info.in_chans)[1])
    model = create_model(config.model, num_classes=info.num_classes, in_chans=info.in_chans,
                         pretrained=config.pretrained, model_args=config.model_kwargs)
    if is_custom_model(config.model):
        check_custom_before_training(config, model, info)
    elif spec(config.strategy).staged and not spec(config.strategy).distributed:  # mp: every stage in this process
        split_into_stages(model, len(config.devices), in_chans=info.in_chans,
                          image_size=config.image_size, name=config.model)
    else:
        _probe_forward(model, config, info)
    return info


def check_data_fits(config: RunConfig, stored_bytes: int) -> None:
    """Refuse ``--data-on-device on`` where the dataset's stored pixels exceed a listed GPU's free
    memory as NVML reads it now (no CUDA context is made here). Each rank checks again, exactly,
    after its model is placed (``trainer.keep_on_device``)."""
    if config.data_on_device != "on" or not config.uses_cuda:
        return
    from contract.devices import gpu_free_bytes

    problem = data_on_device_problem(config, stored_bytes, gpu_free_bytes())
    if problem is not None:
        raise ConfigError("data_on_device", problem)


def train_steps(config: RunConfig, num_train: int, in_chans: int = 3) -> tuple[int, int]:
    """(images each process's training loader holds, batches it yields per epoch), by the rules
    ``trainer.build_loaders`` follows: DDP and FSDP shard the split (DistributedSampler pads every
    shard to the same length), a pipeline drops every short batch, and any loader drops a last
    batch of one image, which BatchNorm cannot train on."""
    strategy = make_strategy(config, 0, in_chans=in_chans)
    sampler = strategy.shards.train_sampler(num_train, config.seed)
    share = len(sampler) if sampler is not None else num_train
    batch = config.process_batch
    drops_short = strategy.shards.drop_last_train or config.compile or share % batch == 1
    return share, share // batch if drops_short else -(-share // batch)


def check_every_rank_trains(config: RunConfig, num_train: int, in_chans: int = 3) -> None:
    """Refuse, naming the numbers, a run in which a process would have no batch to train on (its
    epoch would divide by zero images after its only, short batch is dropped)."""
    share, steps = train_steps(config, num_train, in_chans)
    if steps > 0:
        return
    batch = config.process_batch
    strategy = spec(config.strategy)
    if strategy.splits_batch and config.world_size > 1:
        who = (f"over {config.world_size} {config.strategy.upper()} processes each takes {share}, fewer than its "
               f"batch of {batch} (batch_size {config.batch_size} / {config.world_size})")
    else:
        who = f"fewer than the batch of {batch}"
    if strategy.microbatched:
        why = "a pipeline drops every short batch (its microbatch shapes are fixed)"
    elif config.compile:
        why = "a compiled model drops every short batch (another shape would compile another graph)"
    else:
        why = "a last batch of one image is dropped (BatchNorm cannot train on one)"
    largest = share * (config.world_size if strategy.splits_batch else 1)
    fix = (f"use a batch_size of at most {largest}, more training images or fewer processes"
           if share > 1 else "use more training images or fewer processes")
    raise ConfigError("batch_size", f"the training split has {num_train} images; {who}, and {why}, so no step "
                      f"would train: {fix}")


def check_profile_window(config: RunConfig, steps: int) -> None:
    """Refuse, naming the numbers, a profiled run whose first epoch of ``steps`` steps (per process)
    would end before the profiler keeps a step. A window that starts in the epoch and runs past its
    end is allowed: it ends with the epoch, and the run's notes say how many steps it kept."""
    if not config.profile:
        return
    first = config.profile_wait + config.profile_warmup + 1
    if first <= steps:
        return
    most = steps - 1
    fix = (f"give --profile-wait and --profile-warmup that add up to at most {most}" if most > 0
           else "an epoch of one step cannot skip steps: give --profile-wait 0 and --profile-warmup 0")
    raise ConfigError("profile_wait", f"--profile-wait {config.profile_wait} and --profile-warmup "
                      f"{config.profile_warmup} start the profiled window at step {first}, but an epoch has {steps} "
                      f"steps (per process), so no step would be profiled: {fix}")


def check_custom_before_training(config: RunConfig, model, info: DatasetInfo) -> None:
    """Your own model: the file is the one recorded at launch, its output has a logit per class, and
    mp or pp can cut it into stages (this process cuts pp's too, so that a refusal comes before any rank)."""
    if config.model_source and model_source(config.model) != config.model_source:
        raise ModelError(f"model {config.model!r}: its file changed after the run was launched (recorded "
                         f"{config.model_source.rsplit(' ', 1)[-1]}, now {model_source(config.model).rsplit(' ', 1)[-1]}): "
                         "launch it again to train the new code")
    check_output(config.model, model, num_classes=info.num_classes, in_chans=info.in_chans,
                 image_size=config.image_size)
    if spec(config.strategy).staged:
        stages = config.world_size if spec(config.strategy).distributed else len(config.devices)
        split_into_stages(model, stages, in_chans=info.in_chans, image_size=config.image_size, name=config.model)


@torch.no_grad()
def _probe_forward(model, config: RunConfig, info: DatasetInfo) -> None:
    model.eval()
    try:
        model(torch.zeros(2, info.in_chans, config.image_size, config.image_size))
    except Exception as exc:  # timm raises assorted errors for inputs it cannot take
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelError(
            f"model {config.model!r} cannot take {config.image_size}x{config.image_size} images "
            f"({first_line}): try a larger --image-size"
        ) from None


def run_notes(config: RunConfig, info: DatasetInfo) -> list[str]:
    return (strategy_notes(config) + ([info.val_split] if info.val_split else []) + crop_notes(config)
            + custom_model_notes(config, info) + list(info.warnings))


def custom_model_notes(config: RunConfig, info: DatasetInfo) -> list[str]:
    if not is_custom_model(config.model):
        return []
    with torch.device("meta"):  # what it was given, as the ranks will build it, for no memory
        model, given = build_custom_model(config.model, config.model_kwargs, num_classes=info.num_classes,
                                          in_chans=info.in_chans)
    sizes = {"num_classes": f"num_classes={info.num_classes}", "in_chans": f"in_chans={info.in_chans}"}
    if given:
        how = f"takes {' and '.join(sizes[n] for n in given)} from the dataset"
    else:
        how = f"takes neither num_classes nor in_chans: its output was checked to be {info.num_classes} wide"
    channels = input_channels(model, info.in_chans)
    if channels != info.in_chans:
        how += f"; its first convolution takes {channels} channels: each grey image is given as {channels} equal ones"
    args = f" with {config.model_args}" if config.model_kwargs else ""
    return [f"model {config.model}{args} {how}; source {config.model_source or model_source(config.model)}"]


def crop_notes(config: RunConfig) -> list[str]:
    if config.stored_size <= config.image_size:
        return []
    return [f"images are stored at {config.stored_size} px and trained at {config.image_size} px: training batches "
            "take random-resized crops (8-100 % of the area, aspect 3/4-4/3) on the device, validation the "
            "centre 87.5 %"]


def announce(run_id: int, config: RunConfig, info: DatasetInfo, notes: list[str]) -> None:
    """The lines a run starts with in its log and on the terminal."""
    print(f"run_id={run_id} {config.strategy} on {','.join(config.devices)}: {config.model} on "
          f"{shown_name(config.dataset)} ({info.num_train} train / {info.num_val} val images)", flush=True)
    for note in notes:
        print(f"note: {one_line(note)}", flush=True)


def with_oom_hint(error: str) -> str:
    """A failure's message, led by what to change where it reads as running out of GPU memory."""
    if OUT_OF_MEMORY.search(error):
        return f"{OOM_HINT}\n\n{error}"
    return error
