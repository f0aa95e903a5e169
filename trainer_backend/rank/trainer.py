"""One training process: setup -> build -> train -> teardown.

    main(RankSpec(config, rank, run_id, db_url, folder_name=folder_name))

``main`` is what the runner starts with ``torch.multiprocessing`` for each rank (the spec's rank
replaced), what it calls directly (rank 0) for the single-process strategies, and what every
process of a torchrun job calls. Only rank 0 touches the database, through its ``Recorder``
(telemetry/recorder.py); every number it writes is already reduced across ranks, and every other
rank gets a recorder that writes nothing, so the loop is the same on every rank.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from db import make_engine
from db.folders import named_run_folder, read_regular_file, run_folder_name

from trainer_backend.rank import resume
from trainer_backend.rank.batchnorm import batchnorm_layers, lag_note, statistics_loader
from contract.config import ConfigError, RunConfig, data_refusal
from trainer_backend.rank.confusion import confusion_record
from trainer_backend.rank.divergence import NonfiniteGuard, TrainingDiverged
from trainer_backend.rank.stopping import StopAtStep, StoppedAtStep, StopRequest, stop_request
from trainer_backend.datasets import (DEVICE_DATA_SHARE, ImageTensorDataset, LabelsOnly, PreparedData, collate_batch,
                                     kept_on_device, prepare_data)
from trainer_backend.datasets.streaming import place_decoding
from contract.devices import cuda_indices
from trainer_backend.telemetry.energy import EnergyMeter
from trainer_backend.telemetry.flops import count_flops_per_image
from trainer_backend.rank.inputs import DeviceInputs
from trainer_backend.telemetry.job_energy import EnergyPart, JobEnergy
from trainer_backend.telemetry.logguard import guard_output, reattach_deleted_log
from trainer_backend.rank.loop import PrecisionRecord, make_grad_scaler, rank_amp_dtype, train_one_epoch, validate
from trainer_backend.telemetry.measures import RunMeasures
from trainer_backend.telemetry.memory_breakdown import (peak_memory_mb, peak_memory_reserved_mb, rank_device_label,
                                                     reset_peak_memory)
from trainer_backend.rank.forecast.memory_estimate import run_stored_data, stored_estimate
from trainer_backend.rank.custom_model import input_channels
from trainer_backend.rank.models import build_model
from trainer_backend.rank.plugins import load_plugins
from trainer_backend.telemetry.profiling import StepProfiler
from trainer_backend.telemetry.recorder import NoRecorder, Recorder
from trainer_backend.telemetry.stacks import register_stack_dump
from trainer_backend.rank.schedule import attach_schedule, build_optimizer
from trainer_backend.telemetry.steps import StepHooks, StepRecorder
from trainer_backend.rank.speed import compile_model, compile_note, compile_warmup, to_memory_format
from trainer_backend.rank.strategies.registry import make_strategy
from contract.storage import UnwritableError, write_problem, writing
from contract.strategy_specs import spec as strategy_spec
from trainer_backend.rank.strategies import Strategy, synchronize, unwrap


def load_data(config: RunConfig, data_roots: list | None = None, rank: int = 0) -> PreparedData:
    """The run's data; with ``data_roots`` (a run launched from the dashboard) every class folder
    and file read must lie inside them. ``rank``: the process it is for, which may read no images
    (``reads_images``)."""
    return prepare_data(
        config.dataset,
        image_size=config.stored_size or config.image_size,
        bands=config.bands,
        band_scale=config.band_scale,
        val_fraction=config.val_fraction,
        seed=config.seed,
        data_roots=data_roots,
        val_from=config.val_from,
        decode=config.decode,
        reads_images=reads_images(config, rank),
    )


def reads_images(config: RunConfig, rank: int) -> bool:
    """Whether process ``rank`` reads the images: all do but a pipeline's later stages (pp.py's ``feed``)."""
    return not (strategy_spec(config.strategy).microbatched and rank > 0)


def keep_on_device(data: PreparedData, device: torch.device, mode: str = "auto",
                   free_bytes: int | None = None) -> PreparedData | None:
    """``data`` with both splits' rows copied onto ``device`` when ``mode`` (--data-on-device) says
    to keep them there given the device's free memory (``free_bytes``, read from CUDA when not
    given: after the model is placed, and less whatever other processes hold), else None. Batches
    are then gathered on the device: no host-to-device copy per step. ``on`` where the pixels do not
    fit raises a ConfigError naming the sizes."""
    if mode == "off" or not isinstance(data.train, ImageTensorDataset):  # decoded in the workers: nothing to keep
        return None
    if free_bytes is None:
        if device.type != "cuda":
            return None
        free_bytes, _ = torch.cuda.mem_get_info(device)
    stored = data.train.stored_bytes + data.val.stored_bytes
    if not kept_on_device(stored, free_bytes, mode):
        if mode == "on":
            raise ConfigError("data_on_device", data_refusal(stored, free_bytes, str(device)))
        return None
    return PreparedData(data.train.to_device(device), data.val.to_device(device), data.info)


def device_data_note(data: PreparedData, device: torch.device, mode: str = "auto") -> str:
    stored_mb = (data.train.stored_bytes + data.val.stored_bytes) / 2**20
    why = "as --data-on-device on asks" if mode == "on" else f"under {DEVICE_DATA_SHARE:.0%} of its free memory"
    return (f"the dataset's {stored_mb:.0f} MB of stored pixels are kept on {device} ({why}): batches are "
            "gathered there, with no host-to-device copy per step")


def build_loaders(data: PreparedData, config: RunConfig, strategy: Strategy) -> tuple[DataLoader, DataLoader]:
    """The training and validation loaders; a dataset already on the device (``keep_on_device``)
    is read without workers or pinning, which apply to host memory only."""
    batch = config.process_batch
    sampler = strategy.shards.train_sampler(len(data.train), config.seed)
    shard_len = len(sampler) if sampler is not None else len(data.train)
    on_device = data.train.on_device
    pin = strategy.input_device.type == "cuda" and not on_device
    # Labels alone (a pipeline stage's, LabelsOnly) are an index_select: no loader worker is worth its start.
    workers = 0 if on_device or isinstance(data.train, LabelsOnly) else config.num_workers
    common = dict(collate_fn=collate_batch, num_workers=workers, pin_memory=pin, persistent_workers=workers > 0)
    train = DataLoader(
        data.train,
        batch_size=batch,
        sampler=sampler,
        shuffle=sampler is None,
        generator=torch.Generator().manual_seed(config.seed) if sampler is None else None,
        # A last batch that gives a replica one image breaks BatchNorm in train mode; drop it only in
        # that case (pipelines drop every short batch: their microbatch shapes are fixed at the first
        # step). A compiled model drops them all: another shape would compile another graph (speed.py).
        drop_last=strategy.shards.drop_last_train or config.compile or 1 in strategy.shards.replica_batches(shard_len % batch),
        **common,
    )
    val_indices = strategy.shards.val_indices(len(data.val))
    val = DataLoader(data.val, batch_size=batch, sampler=val_indices, shuffle=False, **common)
    return train, val


@dataclass
class EpochMetrics:
    epoch: int
    train_loss: float
    train_acc: float
    val_loss: float
    val_acc: float
    epoch_time_s: float
    train_time_s: float
    images_per_s: float
    lr: float
    peak_memory_mb: dict[str, float]
    extra: dict

    def line(self, epochs: int) -> str:
        return (
            f"epoch {self.epoch}/{epochs}  train_loss {self.train_loss:.4f}  train_acc {self.train_acc:.4f}  "
            f"val_loss {self.val_loss:.4f}  val_acc {self.val_acc:.4f}  "
            f"{self.images_per_s:.0f} img/s  {self.epoch_time_s:.1f} s"
        )


def _gather_memory(strategy: Strategy, local: dict[str, float]) -> dict[str, float]:
    """Peak memory of every rank, keyed by rank when there are several processes."""
    if strategy.world_size == 1 or not local:  # every rank has the same kind of device: all skip or none
        return local
    (label, value), = local.items()  # DDP: one device per rank
    slots = torch.zeros(strategy.world_size, dtype=torch.float64, device=strategy.output_device)
    slots[strategy.rank] = value
    strategy.all_reduce(slots)
    kind = label.split(":")[0]
    return {rank_device_label(strategy, r, kind): float(v) for r, v in enumerate(slots.tolist())}


def run_epoch(epoch: int, model: nn.Module, loaders, optimizer, strategy: Strategy, amp_dtype, scaler,
              on_step=None, profiler: StepProfiler | None = None, precision: PrecisionRecord | None = None,
              bn_loader: DataLoader | None = None, on_loss=None, measures: RunMeasures | None = None,
              on_start=None, guard: NonfiniteGuard | None = None, first_step: int = 1, stop=None,
              partial: dict | None = None) -> EpochMetrics:
    """``first_step``, ``partial``: an epoch stopped before (resume.Resumed) continues there, its totals and
    training time carried in; ``stop``: rank/stopping.py (raises StopAtStep out of the epoch)."""
    train_loader, val_loader = loaders
    if isinstance(train_loader.sampler, DistributedSampler):
        train_loader.sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on all ranks
    reset_peak_memory(strategy.devices)
    if guard is not None:
        guard.start_epoch(epoch, len(train_loader), optimizer)
    epoch_start = time.perf_counter()
    train_totals, train_time_s = train_one_epoch(
        model, train_loader, optimizer, strategy, amp_dtype=amp_dtype, scaler=scaler, on_step=on_step, profiler=profiler,
        on_loss=on_loss, on_start=on_start, guard=guard, first_step=first_step, stop=stop,
    )
    if partial is not None and strategy.is_main:  # summed across ranks below: carried in once
        train_totals = train_totals + torch.tensor(partial["totals"], dtype=train_totals.dtype,
                                                   device=train_totals.device)
    nonfinite = guard.end_epoch() if guard is not None else {}
    if profiler is not None:
        profiler.finish()  # an epoch shorter than the window still keeps what it recorded
    # BatchNorm's re-estimation (over bn_loader) comes first: counted in the epoch's time, not in its training time.
    val_totals = validate(model, val_loader, strategy, amp_dtype=amp_dtype, bn_loader=bn_loader)
    if not strategy.shards.sum_val_across_ranks and not strategy.is_main:
        # Every rank evaluated the whole set: rank 0's numbers are the answer, on every rank. A rank's
        # own may differ (cudnn.benchmark picks kernels per process), and the checkpoint verdict taken
        # from them could differ on a near-tie, leaving one rank alone in the state dict's gather.
        val_totals = torch.zeros_like(val_totals)
    totals = strategy.all_reduce(torch.cat([train_totals, val_totals]))
    # The epoch lasts as long as its slowest rank.
    train_time = strategy.all_reduce(torch.tensor([train_time_s], dtype=torch.float64, device=totals.device), "max")
    if partial is not None:
        train_time += partial["train_time_s"]
    memory = _gather_memory(strategy, peak_memory_mb(strategy.devices))
    reserved = _gather_memory(strategy, peak_memory_reserved_mb(strategy.devices))
    measured = measures.epoch_extra(epoch, train_time_s, totals[2].item(), train_time.item()) if measures else {}
    synchronize(strategy.devices)
    epoch_time_s = time.perf_counter() - epoch_start
    t_loss, t_correct, t_count, v_loss, v_correct, v_count, *confusion = totals.tolist()
    return EpochMetrics(
        epoch=epoch,
        # Under --on-nonfinite skip, over the images of the finite losses (divergence.py).
        train_loss=t_loss / max(1, t_count - (guard.left_out_images if guard is not None else 0)),
        train_acc=t_correct / t_count,
        val_loss=v_loss / v_count,
        val_acc=v_correct / v_count,
        epoch_time_s=epoch_time_s,
        train_time_s=train_time.item(),
        # Images of the global batch, all ranks together, over the slowest rank's training time.
        images_per_s=t_count / train_time.item(),
        lr=optimizer.param_groups[0]["lr"],  # the lr of the epoch's last optimizer step (schedule.py)
        peak_memory_mb=memory,
        extra={**strategy.extra_metrics(train_time_s), **({"peak_memory_reserved_mb": reserved} if reserved else {}),
               **(precision.extra() if precision is not None else {}), **measured, **nonfinite,
               # Taken out by the trainer before the epoch is stored: only the best epoch's is kept.
               **({"confusion": confusion} if confusion else {})},
    )


def checkpoint_payload(state: dict, config: RunConfig, built: Built, metrics: EpochMetrics) -> dict:
    """What best.pt holds: the weights and what is needed to use them without Parallax's database: the
    model's name and every keyword argument it was built with, the class names in label order, and the
    preprocessing (``predict`` and docs/USING_A_RUN.md). Plain types only, so that
    ``torch.load(weights_only=True)`` reads it."""
    return {"model": state, "config": config.to_dict(), "class_names": list(built.data.info.class_names),
            "epoch": metrics.epoch, "val_acc": metrics.val_acc,
            "model_name": config.model,
            "model_kwargs": dict(built.model_kwargs),
            "preprocessing": {**preprocessing(config, built.data), "model_channels": built.model_channels}}


def preprocessing(config: RunConfig, data: PreparedData) -> dict:
    """How an image file becomes the model's input, as validation did it: decoded (``bands``, divided
    by ``band_scale``, clipped to [0, 1]), resized to ``stored_size``, normalised per channel
    ((x - mean) / std, in [0, 1] units, the training images' own), then centre-cropped to
    ``image_size`` where ``stored_size`` is larger."""
    return {"image_size": config.image_size, "stored_size": config.stored_size or config.image_size,
            "bands": list(config.bands) if config.bands is not None else None, "band_scale": config.band_scale,
            "mean": [float(v) for v in data.train.mean.float().cpu()],
            "std": [float(v) for v in data.train.std.float().cpu()]}


@dataclass(frozen=True)
class RankSpec:
    """What one rank is told: the run's config, validated once by whoever launched the run (a rank
    does not validate it again), and this rank's place in the run.

    ``resumable`` (every run the supervisor trains, and a torchrun job that may be restarted): start from the
    run's last resume point, if any, and write one after every epoch. ``folder_name`` names the run's folder
    (``db.folders.run_folder_name``; looked up in the database when not given); ``data_roots``
    confines the data read (``load_data``). ``store_port``: the spawned world's rendezvous store
    (0 under torchrun or in one process). ``energy_part`` (a torchrun job across machines): this
    process's part in metering the job's energy (``job_energy``)."""

    config: RunConfig
    rank: int
    run_id: int
    db_url: str
    store_host: str = ""
    store_port: int = 0
    echo: bool = True
    resumable: bool = False
    folder_name: str | None = None
    data_roots: list | None = None
    energy_part: EnergyPart | None = None

    @property
    def records(self) -> bool:
        """Whether this rank writes the run: rank 0, whose numbers are already reduced across ranks."""
        return self.rank == 0


@dataclass(frozen=True)
class Built:
    """What a rank trains with, built once (``build``)."""

    spec: RankSpec
    folder: Path
    strategy: Strategy
    data: PreparedData
    on_device: bool  # the splits were copied onto the device (keep_on_device)
    decode_note: str | None  # where decoding runs, when the run should be told (place_decoding)
    model: nn.Module
    model_kwargs: dict  # what the model's factory was called with (models.build_model), for the checkpoint
    model_channels: int  # the channels its first layer takes: the dataset's, or more where grey images are repeated
    optimizer: torch.optim.Optimizer
    schedule: object
    loaders: tuple[DataLoader, DataLoader]
    bn_loader: DataLoader | None
    amp_dtype: torch.dtype | None
    scaler: torch.amp.GradScaler | None
    precision: PrecisionRecord | None
    measures: RunMeasures
    has_batchnorm: bool
    guard: NonfiniteGuard


def main(spec: RankSpec) -> None:
    """Train one rank's part of run ``spec.run_id``: setup -> build -> train -> teardown. Raises on
    any failure; the runner records it."""
    folder = open_run_folder(spec)
    try:
        setup(spec, folder)
        built = build(spec, folder)
        try:
            train(built, open_recorder(spec))
        finally:
            built.strategy.teardown()
    except Exception as exc:
        leave_failure_note(folder, spec.rank, exc)
        raise


def open_run_folder(spec: RankSpec) -> Path:
    folder_name = spec.folder_name or run_folder_name(make_engine(spec.db_url), spec.run_id)
    try:
        return named_run_folder(folder_name, create=True)
    except OSError as exc:  # a read-only or full PARALLAX_HOME: one line, not a traceback
        raise write_problem(exc, "the run's folder", named_run_folder(folder_name)) from None


def open_recorder(spec: RankSpec) -> Recorder | NoRecorder:
    """The recording rank's recorder, or one that writes nothing for every other rank."""
    return Recorder(make_engine(spec.db_url), spec.run_id, echo=spec.echo) if spec.records else NoRecorder()


def leave_failure_note(folder: Path, rank: int, exc: Exception) -> None:
    """When one rank fails its peers fail too, mid-collective; the time tells the runner which
    failure came first, i.e. which one to report."""
    failure = {"rank": rank, "time": time.time(), "traceback": traceback.format_exc(),
               "type": type(exc).__name__, "message": str(exc)}
    # On a full disk, or with the run's folder deleted, this note cannot be written; the error itself must win.
    with contextlib.suppress(OSError, UnwritableError):
        with writing(folder / f"rank{rank}.failure.json", "failure note") as handle:
            handle.write(json.dumps(failure).encode())


def read_rank_failures(folder) -> list[dict]:
    """The failure notes the ranks of a run left in its folder."""
    failures = []
    for path in folder.glob("rank*.failure.json"):
        with contextlib.suppress(OSError, ValueError):  # a note cut short must not hide the failure itself
            failures.append(json.loads(read_regular_file(path)))  # a pipe there must not hold up the report
    return failures


def setup(spec: RankSpec, folder: Path) -> None:
    """What a rank does before it builds: die with its parent, guard its log, leave its pid, load plugins."""
    if spec.store_port:
        _die_with_parent()
        # A spawned rank writes to the run's log too; only the recording rank notes in the run that it failed.
        guard_output(on_failure=lambda exc: open_recorder(spec).log_incomplete(exc))
    leave_pid(folder, spec.rank)
    load_plugins()
    torch.manual_seed(spec.config.seed)  # identical initial weights on every rank


def leave_pid(folder: Path, rank: int) -> None:
    """The rank's pid file, which lets an operator (or a test) find and signal one rank of a run, and its
    stacks file, for a run that stalls (supervisor/stall.py)."""
    try:
        with writing(folder / f"rank{rank}.pid", "the rank's pid file") as handle:
            handle.write(str(os.getpid()).encode())
    except OSError as exc:
        raise write_problem(exc, "the rank's pid file", folder / f"rank{rank}.pid") from None
    register_stack_dump(folder, rank)


def build(spec: RankSpec, folder: Path) -> Built:
    """The data, the strategy (set up: its process group joined) and what trains on it. A failure
    after the strategy is set up tears it down before it is raised."""
    config = spec.config
    data = load_data(config, spec.data_roots, spec.rank)
    strategy = make_strategy(config, spec.rank, in_chans=data.info.in_chans, store_host=spec.store_host,
                             store_port=spec.store_port)
    strategy.setup()
    try:
        return build_on(strategy, spec, data, folder)
    except BaseException:
        strategy.teardown()
        raise


def build_on(strategy: Strategy, spec: RankSpec, data: PreparedData, folder: Path) -> Built:
    config = spec.config
    data = strategy.shards.feed(data)  # a pipeline stage that takes no images reads none
    model, model_kwargs = build_model(config.model, num_classes=data.info.num_classes, in_chans=data.info.in_chans,
                                      pretrained=config.pretrained, model_args=config.model_kwargs)
    model_channels = input_channels(model, data.info.in_chans)
    flops = (count_flops_per_image(model, in_chans=data.info.in_chans, image_size=config.image_size)
             if strategy.is_main else None)  # counted on the whole model, before it is split or sharded
    model = strategy.wrap(to_memory_format(model, config))
    # Decoded in the loader workers: where the uint8 -> float step (or, for JPEGs on a GPU, the decode) runs.
    data, decode_note = place_decoding(data, strategy.input_device, config.num_workers)
    strategy.inputs = DeviceInputs.for_run(config, data.train.normalise, strategy.input_device, spec.rank)
    if config.compile:
        compile_model(model, strategy)
    optimizer = build_optimizer(config, model.parameters())
    amp_dtype = rank_amp_dtype(config, strategy.input_device)
    scaler = make_grad_scaler(amp_dtype)
    precision = PrecisionRecord(model, scaler) if amp_dtype is not None else None
    measures = RunMeasures(strategy, model, optimizer, amp_dtype, flops)
    resident = keep_on_device(data, strategy.input_device, config.data_on_device)
    if resident is not None:
        data = resident
        measures.held.hold_data([data.train.pool_images, data.train.labels, data.val.pool_images, data.val.labels])
    loaders = build_loaders(data, config, strategy)
    schedule = attach_schedule(optimizer, config, batches_per_epoch=len(loaders[0]))
    bn_loader = statistics_loader(loaders[0], config.bn_stats_images, config.seed,
                                  full_batches=strategy.shards.drop_last_train) if config.bn_stats_images else None
    return Built(spec=spec, folder=folder, strategy=strategy, data=data, on_device=resident is not None,
                 decode_note=decode_note, model=model, model_kwargs=model_kwargs,
                 model_channels=model_channels,
                 optimizer=optimizer, schedule=schedule, loaders=loaders, bn_loader=bn_loader, amp_dtype=amp_dtype,
                 scaler=scaler, precision=precision, measures=measures,
                 has_batchnorm=bool(batchnorm_layers(unwrap(model))),
                 guard=NonfiniteGuard(config.on_nonfinite, strategy, scaler))


def train(built: Built, recorder: Recorder | NoRecorder) -> None:
    """Train every epoch left and record each through ``recorder``; the step hooks are closed
    however it ends."""
    if built.spec.config.compile:
        _record_compile_time(recorder, built.strategy,
                             compile_warmup(built.model, built.loaders, built.strategy, built.amp_dtype))
    hooks = step_hooks(built, recorder)
    try:
        record_run_start(built, recorder)
        train_epochs(built, recorder, hooks)
    except BaseException:
        # Closing the hooks writes notes, and may fail for the reason the run failed (a database
        # locked for good): that must not take the place of the run's own error.
        try:
            hooks.close()
        except Exception as exc:
            print(f"parallax: the step notes of run {built.spec.run_id} are incomplete: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
        raise
    hooks.close()


def record_run_start(built: Built, recorder: Recorder | NoRecorder) -> None:
    """The notes and measurements known before the first epoch."""
    config, data = built.spec.config, built.data
    if built.on_device:
        recorder.notes([device_data_note(data, built.strategy.input_device, config.data_on_device)])
    recorder.notes([built.decode_note])
    stored = run_stored_data(data, built.strategy.devices, kept=built.on_device)
    recorder.once_per_run(lambda: {**built.measures.once_per_run(), "effective_batch": config.effective_batch,
                                   **stored_estimate(config, data.info.num_classes, data.info.in_chans, stored)})


def train_epochs(built: Built, recorder: Recorder | NoRecorder, hooks: StepHooks) -> None:
    spec, strategy = built.spec, built.strategy
    resumed = restore_resume_point(built, recorder)
    best_acc = resumed.best_acc
    stop = stop_request(built.folder, strategy) if spec.resumable else None
    lag_noted = False
    for epoch in range(resumed.start_epoch, spec.config.epochs + 1):
        metrics = train_and_validate(built, recorder, hooks, epoch, stop=stop,
                                     resumed=resumed if epoch == resumed.start_epoch else None, best_acc=best_acc)
        keep_run_folder(built, recorder, epoch)
        # Every rank reaches the same verdict (the metrics are reduced, or rank 0's: run_epoch), and
        # assembling a sharded or pipelined state dict needs every rank.
        improved = metrics.val_acc > best_acc
        best_acc = max(best_acc, metrics.val_acc)
        state = strategy.checkpoints.checkpoint_state(built.model) if improved else None
        lag_noted = record_epoch(built, recorder, hooks, metrics, improved, state, lag_noted)
        if spec.resumable:  # after the epoch is recorded: a restart never skips an unrecorded epoch
            resume.save_resume_point(built.folder, strategy, built.model, built.optimizer, built.loaders[0],
                                     epoch=epoch, best_acc=best_acc, schedule=built.schedule, scaler=built.scaler,
                                     keep=spec.config.keep_checkpoints)
    # Deleted as the last epoch's files were written, the folder was made again by those writes: said here.
    keep_run_folder(built, recorder, spec.config.epochs)


def save_step_point(built: Built, epoch: int, stopped: StopAtStep, partial: dict | None, loader_rng,
                    best_acc: float) -> None:
    """Every rank: the point after step ``stopped.step`` of ``epoch``, with the epoch's totals so far over all
    ranks (and attempts) and its slowest rank's training time."""
    strategy = built.strategy
    totals = strategy.all_reduce(stopped.totals.to(torch.float64))
    train_time = strategy.all_reduce(torch.tensor([stopped.train_time_s], dtype=torch.float64,
                                                  device=totals.device), "max").item()
    carried = {"totals": [float(v) for v in totals.tolist()], "train_time_s": train_time}
    if partial is not None:
        carried = {"totals": [a + b for a, b in zip(carried["totals"], partial["totals"])],
                   "train_time_s": train_time + partial["train_time_s"]}
    resume.save_resume_point(built.folder, strategy, built.model, built.optimizer, built.loaders[0],
                             epoch=epoch - 1, best_acc=best_acc, schedule=built.schedule, scaler=built.scaler,
                             step=stopped.step, partial=carried, loader_rng=loader_rng)


def keep_run_folder(built: Built, recorder: Recorder | NoRecorder, epoch: int) -> None:
    """Make the run's folder again if it was deleted while the epoch trained, and say what went with it.

    The run goes on: what it records that matters (every epoch's metrics, step points, notes) is in the
    database, and ending it would lose the epochs still to come. Every process looks (a collective, once
    an epoch) before any makes it again, so that the run notes it whichever process saw it go. It looks
    for its pid file, not the folder alone: a checkpoint or resume point written as the folder went
    makes the folder again (storage.write_remaking_folder), and the pid files went all the same."""
    strategy, rank = built.strategy, built.spec.rank
    gone = torch.tensor([0.0 if (built.folder / f"rank{rank}.pid").is_file() else 1.0], dtype=torch.float64,
                        device=strategy.output_device)
    if strategy.all_reduce(gone, "max").item() == 0:
        return
    try:
        built.folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_problem(exc, "the run's folder", built.folder) from None
    leave_pid(built.folder, rank)
    reattach_deleted_log(built.folder / "run.log")
    recorder.notes([folder_gone_note(built.folder, epoch)])


def folder_gone_note(folder: Path, epoch: int) -> str:
    return (f"The run's folder {folder} was deleted while epoch {epoch} trained; the run made it again and went "
            "on. Gone with it: the log so far (run.log starts again from here), the best checkpoint of the earlier epochs (best.pt is written again when an epoch improves on them) and "
            "any resume point or profile files. Kept, in the database: every epoch's metrics, the step points, the "
            "system samples and the notes.")


def restore_resume_point(built: Built, recorder: Recorder | NoRecorder) -> resume.Resumed:
    """Where training starts: from the run's last resume point when the run is resumable, else epoch 1."""
    if not built.spec.resumable:
        return resume.Resumed()
    resumed = resume.restore(built.folder, built.strategy, built.model, built.optimizer, built.loaders[0],
                             schedule=built.schedule, scaler=built.scaler)
    start_epoch = resumed.start_epoch
    if resumed.first_step > 1:
        # The steps trained before the stop keep their points; those recorded after it are trained again.
        recorder.forget_steps_from(start_epoch, after_step=(start_epoch - 1) * len(built.loaders[0])
                                   + resumed.first_step - 1)
        recorder.notes([resume.step_note(resumed)])
        return resumed
    if resume.restart_count() > 0 or start_epoch > 1:
        recorder.forget_steps_from(start_epoch)  # what the stopped attempt recorded of the epochs trained again
    if resume.restart_count() > 0:
        recorder.notes([resume.resume_note(start_epoch, resume.restart_count())])
    elif start_epoch > 1:
        recorder.notes([resume.resumed_note(start_epoch)])
    return resumed


def train_and_validate(built: Built, recorder: Recorder | NoRecorder, hooks: StepHooks, epoch: int, *,
                       stop: StopRequest | None = None, resumed: resume.Resumed | None = None,
                       best_acc: float = -1.0) -> EpochMetrics:
    """One epoch of training and validation (profiled when the run asks, in epoch 1); ``resumed``: the epoch
    continues where a stopped attempt left it. Told to stop (``stop``), every rank saves a point at the step
    and raises StoppedAtStep."""
    config, strategy = built.spec.config, built.strategy
    first_step = resumed.first_step if resumed is not None else 1
    partial = resumed.partial if resumed is not None else None
    profiler = (_start_profiler(config, strategy, built.folder)
                if config.profile and epoch == 1 and first_step == 1 else None)
    generator = getattr(built.loaders[0], "generator", None)
    loader_rng = generator.get_state() if generator is not None else None  # the epoch's shuffle, before it is drawn
    hooks.start_epoch(epoch, built.loaders[0], built.optimizer, first_step=first_step)
    try:
        metrics = run_epoch(epoch, built.model, built.loaders, built.optimizer, strategy, built.amp_dtype, built.scaler,
                            on_step=hooks, profiler=profiler, precision=built.precision, bn_loader=built.bn_loader,
                            on_loss=hooks.loss, measures=built.measures, on_start=hooks.begin_training,
                            guard=built.guard, first_step=first_step, stop=stop, partial=partial)
    except StopAtStep as stopped:
        hooks.cut()
        save_step_point(built, epoch, stopped, partial, loader_rng, best_acc)
        raise StoppedAtStep(epoch, stopped.step) from None
    except TrainingDiverged as diverged:
        # The progress bar stops where the reason says, not at the step last recorded a few seconds before.
        recorder.progress(diverged.epoch, diverged.step, diverged.total_steps, now=True)
        raise
    images = round(metrics.images_per_s * metrics.train_time_s)
    if partial is not None:  # the energy is metered from the resume: per image of the images trained since
        images -= round(partial["totals"][2])
    metrics.extra.update(hooks.end_epoch(images=images))
    if profiler is not None:
        strategy.barrier()  # every rank has written its profile
        recorder.profiles(profiler.out_dir, config)
    return metrics


def record_epoch(built: Built, recorder: Recorder | NoRecorder, hooks: StepHooks, metrics: EpochMetrics,
                 improved: bool, state: dict | None, lag_noted: bool) -> bool:
    """The epoch's row, what it adds to the run's notes and measurements, and the checkpoint when
    it improved; whether the BatchNorm lag has been noted (once per run)."""
    config, epoch = built.spec.config, metrics.epoch
    confusion = metrics.extra.pop("confusion", None)  # only the best epoch's is kept, in the measurements
    if metrics.extra.get("nonfinite_steps") and not built.guard.told:  # trained on through it: warn or skip
        built.guard.told = True
        recorder.notify("run.diverged", f"the training loss was NaN or infinite in {metrics.extra['nonfinite_steps']} "
                        f"step(s) of epoch {epoch}; the run trains on (--on-nonfinite {config.on_nonfinite})")
    recorder.epoch(epoch, vars(metrics), metrics.line(config.epochs))
    if improved and confusion:
        recorder.confusion(epoch, confusion_record(epoch, built.data.info.class_names, confusion))
    recorder.notes(built.measures.take_notes() + hooks.take_notes())
    recorder.measurements(built.measures.take_remeasured(), what="record the CPU peak")
    note = None if lag_noted else lag_note(
        train_acc=metrics.train_acc, val_acc=metrics.val_acc, epoch=epoch, steps_per_epoch=len(built.loaders[0]),
        reestimated=built.bn_loader is not None, has_batchnorm=built.has_batchnorm)
    recorder.notes([note])
    if state is not None:
        recorder.checkpoint(built.folder / "best.pt", checkpoint_payload(state, config, built, metrics))
    return lag_noted or note is not None


def step_hooks(built: Built, recorder: Recorder | NoRecorder) -> StepHooks:
    """This process's per-step hooks. Step points come from rank 0, except in a pipeline, where
    only the last stage computes the loss (of the whole batch: every stage sees it) and records
    them itself; rank 0 measures the energy of every epoch it writes, and in a torchrun job across
    machines (``energy_part``) each machine's local rank 0 meters its machine for rank 0 to sum."""
    spec, config, strategy = built.spec, built.spec.config, built.strategy
    records = strategy.rank == strategy_spec(config.strategy).recording_rank(strategy.world_size)
    writer = Recorder(make_engine(spec.db_url), spec.run_id) if records and not recorder.writes else recorder
    started_at_s = writer.started_at_s()
    # ddp and fsdp ranks each train on their own part of the global batch.
    images_factor = strategy.world_size if strategy_spec(config.strategy).splits_batch else 1
    points = StepRecorder(writer, started_at_s, images_factor=images_factor,
                          device=strategy.output_device) if records else None
    energy, notes = None, [series_note(config, strategy.world_size)]
    if spec.energy_part is not None:  # every process of the job, at this same point: a collective
        energy = JobEnergy.open(spec.energy_part)
        notes += energy.take_notes()
    elif strategy.is_main:
        energy = EnergyMeter.open(cuda_indices(config.devices))
        notes.append(energy.note())
    recorder.notes(notes, what="record the series notes")
    return StepHooks(progress=recorder.progress, recorder=points, energy=energy, started_at_s=started_at_s,
                     devices=strategy.devices)


def series_note(config: RunConfig, world_size: int) -> str | None:
    """Where the step losses come from, when that is not the global batch's loss."""
    if strategy_spec(config.strategy).splits_batch and world_size > 1:
        return ("Step points show rank 0's training loss (its part of the batch; reducing it across ranks every "
                "step would cost a collective), and images/s of the global batch; epoch losses are over all ranks.")
    if strategy_spec(config.strategy).records_on_last_rank:
        return "Step points are recorded by the last pipeline stage, which computes the loss of the whole batch."
    return None


def _record_compile_time(recorder: Recorder | NoRecorder, strategy: Strategy, seconds: float) -> None:
    """The slowest process's compile warm-up, in runs.measurements and a run note."""
    slowest = strategy.all_reduce(torch.tensor([seconds], dtype=torch.float64, device=strategy.output_device), "max")
    recorder.compile_time(slowest.item(), compile_note(slowest.item()))


def _start_profiler(config: RunConfig, strategy: Strategy, folder) -> StepProfiler:
    profiler = StepProfiler(
        wait=config.profile_wait, warmup=config.profile_warmup, active=config.profile_active,
        devices=strategy.devices, rank=strategy.rank, world_size=strategy.world_size,
        out_dir=folder / "profile", with_stack=config.profile_stack,
    )
    profiler.start()
    return profiler


def _die_with_parent() -> None:
    """A spawned rank asks the kernel for SIGKILL when its parent (the run's main process) dies,
    so a supervisor killed from outside never leaves ranks training or hung in a collective."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
