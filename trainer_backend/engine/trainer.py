"""One training process: setup -> build -> train -> teardown.

``train_process(rank, ...)`` is what the runner starts with ``torch.multiprocessing`` for each rank, and
what the runner calls directly (rank 0) for the single-process strategies. Only rank 0 touches
the database; every number it writes is already reduced across ranks.
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
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from db import lifecycle as state
from db import make_engine, profiles, store
from db.engine import LockBackoff, retry_when_locked
from db.folders import named_run_folder, read_regular_file, run_folder_name

from trainer_backend.engine import resume
from trainer_backend.engine.batchnorm import batchnorm_layers, lag_note, statistics_loader
from trainer_backend.contract.config import RunConfig
from trainer_backend.engine.confusion import confusion_record
from trainer_backend.datasets import ImageTensorDataset, PreparedData, collate_batch, prepare_data
from trainer_backend.datasets.streaming import place_decoding
from trainer_backend.contract.devices import cuda_indices
from trainer_backend.telemetry.energy import EnergyMeter
from trainer_backend.telemetry.flops import count_flops_per_image
from trainer_backend.engine.inputs import DeviceInputs
from trainer_backend.telemetry.job_energy import EnergyPart, JobEnergy
from trainer_backend.contract.logguard import LOG_INCOMPLETE_NOTE, describe, guard_output
from trainer_backend.engine.loop import PrecisionRecord, make_grad_scaler, resolve_amp, train_epoch, validate
from trainer_backend.telemetry.measures import RunMeasures
from trainer_backend.telemetry.memory_breakdown import (peak_memory_mb, peak_memory_reserved_mb, rank_device_label,
                                                     reset_peak_memory)
from trainer_backend.engine.forecast.memory_estimate import stored_estimate
from trainer_backend.engine.models import create_model
from trainer_backend.contract.plugins import load_plugins
from trainer_backend.telemetry.profiling import LARGE_TRACE_BYTES, StepProfiler, read_rank_outputs
from trainer_backend.engine.schedule import attach_schedule, build_optimizer
from trainer_backend.telemetry.steps import StepHooks, StepRecorder
from trainer_backend.engine.speed import compile_model, compile_note, compile_warmup, to_memory_format
from trainer_backend.engine.strategies.registry import make_strategy
from trainer_backend.contract.storage import write_problem, writing
from trainer_backend.contract.strategy_specs import spec
from trainer_backend.engine.strategies import Strategy, synchronize

EpochPrinter = Callable[[str], None]


def load_data(config: RunConfig, data_roots: list | None = None) -> PreparedData:
    """The run's data; with ``data_roots`` (a run launched from the dashboard) every class folder
    and file read must lie inside them."""
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
    )


# A training split whose stored pixels take at most this share of a GPU's memory is kept on it whole.
DEVICE_DATA_SHARE = 0.10


def keep_on_device(data: PreparedData, device: torch.device, device_bytes: int | None = None) -> PreparedData | None:
    """``data`` with both splits' rows copied onto ``device`` when the training split's stored
    pixels fit in DEVICE_DATA_SHARE of its memory (``device_bytes``, read from CUDA when not
    given), else None. Batches are then gathered on the device: no host-to-device copy per step."""
    if not isinstance(data.train, ImageTensorDataset):  # decoded in the workers: nothing to keep
        return None
    if device_bytes is None:
        if device.type != "cuda":
            return None
        device_bytes = torch.cuda.get_device_properties(device).total_memory
    if data.train.stored_bytes + data.val.stored_bytes > DEVICE_DATA_SHARE * device_bytes:
        return None
    return PreparedData(data.train.to_device(device), data.val.to_device(device), data.info)


def device_data_note(data: PreparedData, device: torch.device) -> str:
    stored_mb = (data.train.stored_bytes + data.val.stored_bytes) / 2**20
    return (f"the dataset's {stored_mb:.0f} MB of stored pixels are kept on {device} (under "
            f"{DEVICE_DATA_SHARE:.0%} of its memory): batches are gathered there, with no host-to-device copy per step")


def build_loaders(data: PreparedData, config: RunConfig, strategy: Strategy) -> tuple[DataLoader, DataLoader]:
    """The training and validation loaders; a dataset already on the device (``keep_on_device``)
    is read without workers or pinning, which apply to host memory only."""
    batch = config.process_batch
    sampler = strategy.train_sampler(len(data.train), config.seed)
    shard_len = len(sampler) if sampler is not None else len(data.train)
    on_device = data.train.on_device
    pin = strategy.input_device.type == "cuda" and not on_device
    workers = 0 if on_device else config.num_workers
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
        drop_last=strategy.drop_last_train or config.compile or 1 in strategy.replica_batches(shard_len % batch),
        **common,
    )
    val_indices = strategy.val_indices(len(data.val))
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


class ProgressWriter:
    """Writes (epoch, step of total) for the progress bars, at most about once a second, and less
    often while the database is locked (see LockBackoff)."""

    def __init__(self, engine, run_id: int, min_interval_s: float = 1.0):
        self.engine, self.run_id, self.min_interval_s = engine, run_id, min_interval_s
        self.epoch = 0
        self._last = 0.0
        self._backoff = LockBackoff()

    def __call__(self, step: int, total_steps: int) -> None:
        now = time.monotonic()
        if (step == total_steps or now - self._last >= self.min_interval_s) and self._backoff.due(now):
            self._last = now
            landed = state.set_progress(self.engine, self.run_id, epoch=self.epoch, step=step, total_steps=total_steps)
            self._backoff.tried(landed, time.monotonic())


def run_epoch(epoch: int, model: nn.Module, loaders, optimizer, strategy: Strategy, amp_dtype, scaler,
              on_step=None, profiler: StepProfiler | None = None, precision: PrecisionRecord | None = None,
              bn_loader: DataLoader | None = None, on_loss=None, measures: RunMeasures | None = None,
              on_start=None) -> EpochMetrics:
    train_loader, val_loader = loaders
    if isinstance(train_loader.sampler, DistributedSampler):
        train_loader.sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on all ranks
    reset_peak_memory(strategy.devices)
    epoch_start = time.perf_counter()
    train_totals, train_time_s = train_epoch(
        model, train_loader, optimizer, strategy, amp_dtype=amp_dtype, scaler=scaler, on_step=on_step, profiler=profiler,
        on_loss=on_loss, on_start=on_start,
    )
    if profiler is not None:
        profiler.finish()  # an epoch shorter than the window still keeps what it recorded
    if bn_loader is not None:  # counted in the epoch's time, not in its training time
        strategy.reestimate_batchnorm(model, bn_loader, amp_dtype=amp_dtype)
    strategy.sync_buffers(model)
    val_totals = validate(model, val_loader, strategy, amp_dtype=amp_dtype)
    if not strategy.sum_val_across_ranks and not strategy.is_main:
        # Every rank evaluated the whole set: rank 0's numbers are the answer, on every rank. A rank's
        # own may differ (cudnn.benchmark picks kernels per process), and the checkpoint verdict taken
        # from them could differ on a near-tie, leaving one rank alone in the state dict's gather.
        val_totals = torch.zeros_like(val_totals)
    totals = strategy.all_reduce(torch.cat([train_totals, val_totals]))
    # The epoch lasts as long as its slowest rank.
    train_time = strategy.all_reduce(torch.tensor([train_time_s], dtype=torch.float64, device=totals.device), "max")
    memory = _gather_memory(strategy, peak_memory_mb(strategy.devices))
    reserved = _gather_memory(strategy, peak_memory_reserved_mb(strategy.devices))
    measured = measures.epoch_extra(epoch, train_time_s, totals[2].item(), train_time.item()) if measures else {}
    synchronize(strategy.devices)
    epoch_time_s = time.perf_counter() - epoch_start
    t_loss, t_correct, t_count, v_loss, v_correct, v_count, *confusion = totals.tolist()
    return EpochMetrics(
        epoch=epoch,
        train_loss=t_loss / t_count,
        train_acc=t_correct / t_count,
        val_loss=v_loss / v_count,
        val_acc=v_correct / v_count,
        epoch_time_s=epoch_time_s,
        train_time_s=train_time.item(),
        # Images of the global batch, all ranks together, over the slowest rank's training time.
        images_per_s=t_count / train_time.item(),
        lr=optimizer.param_groups[0]["lr"],  # the lr of the epoch's last optimizer step (schedule.py)
        peak_memory_mb=memory,
        extra={**strategy.extra_metrics(), **({"peak_memory_reserved_mb": reserved} if reserved else {}),
               **(precision.extra() if precision is not None else {}), **measured,
               # Taken out by the trainer before the epoch is stored: only the best epoch's is kept.
               **({"confusion": confusion} if confusion else {})},
    )


def save_checkpoint(path, state: dict, config: RunConfig, data: PreparedData, metrics: EpochMetrics) -> None:
    # Through a part file: a crash or a full disk mid-save never leaves a truncated best.pt, and
    # a file object (not a path) keeps the errno that says the disk is full.
    with writing(path, "checkpoint") as handle:
        torch.save(
            {"model": state, "config": config.to_dict(), "class_names": list(data.info.class_names),
             "epoch": metrics.epoch, "val_acc": metrics.val_acc},
            handle,
        )


def train_process(rank: int, config_dict: dict, run_id: int, db_url: str, store_host: str = "", store_port: int = 0,
                  echo: bool = True, resumable: bool = False, folder_name: str | None = None,
                  data_roots: list | None = None, energy_part: EnergyPart | None = None) -> None:
    """Train one process's part of run ``run_id``. Raises on any failure; the runner records it.

    ``resumable`` (a torchrun job that may be restarted): start from the run's last resume point,
    if any, and write one after every epoch. ``folder_name`` names the run's folder
    (``db.folders.run_folder_name``; looked up in the database when not given); ``data_roots``
    confines the data read (``load_data``). ``energy_part`` (a torchrun job across machines):
    this process's part in metering the job's energy (``job_energy``)."""
    if folder_name is None:
        folder_name = run_folder_name(make_engine(db_url), run_id)
    try:
        folder = named_run_folder(folder_name, create=True)
    except OSError as exc:  # a read-only or full PARALLAX_HOME: one line, not a traceback
        raise write_problem(exc, "the run's folder", named_run_folder(folder_name)) from None
    try:
        _train_process(rank, config_dict, run_id, db_url, store_host, store_port, echo, resumable, folder, data_roots,
                       energy_part)
    except Exception as exc:
        # When one rank fails its peers fail too, mid-collective; the time tells the runner
        # which failure came first, i.e. which one to report.
        failure = {"rank": rank, "time": time.time(), "traceback": traceback.format_exc(),
                   "type": type(exc).__name__, "message": str(exc)}
        with contextlib.suppress(OSError):  # on a full disk this note cannot be written; the error itself must win
            with writing(folder / f"rank{rank}.failure.json", "failure note") as handle:
                handle.write(json.dumps(failure).encode())
        raise


def read_rank_failures(folder) -> list[dict]:
    """The failure notes the ranks of a run left in its folder."""
    failures = []
    for path in folder.glob("rank*.failure.json"):
        with contextlib.suppress(OSError, ValueError):  # a note cut short must not hide the failure itself
            failures.append(json.loads(read_regular_file(path)))  # a pipe there must not hold up the report
    return failures


def _train_process(rank: int, config_dict: dict, run_id: int, db_url: str, store_host: str, store_port: int, echo: bool,
                   resumable: bool, folder, data_roots: list | None, energy_part: EnergyPart | None = None) -> None:
    if store_port:
        _die_with_parent()
        # A spawned rank writes to the run's log too; only rank 0 may note in the run that it failed.
        guard_output(on_failure=(lambda exc: note_log_incomplete(make_engine(db_url), run_id, exc)) if rank == 0 else None)
    # Lets an operator (or a test) find and signal one rank of a run.
    try:
        with writing(folder / f"rank{rank}.pid", "the rank's pid file") as handle:
            handle.write(str(os.getpid()).encode())
    except OSError as exc:
        raise write_problem(exc, "the rank's pid file", folder / f"rank{rank}.pid") from None
    load_plugins()
    config = RunConfig.from_dict(config_dict)
    torch.manual_seed(config.seed)  # identical initial weights on every rank
    data = load_data(config, data_roots)
    strategy = make_strategy(config, rank, in_chans=data.info.in_chans, store_host=store_host, store_port=store_port)
    strategy.setup()
    hooks = None
    try:
        model = create_model(config.model, num_classes=data.info.num_classes,
                             in_chans=data.info.in_chans, pretrained=config.pretrained)
        flops = (count_flops_per_image(model, in_chans=data.info.in_chans, image_size=config.image_size)
                 if strategy.is_main else None)  # counted on the whole model, before it is split or sharded
        model = strategy.wrap(to_memory_format(model, config))
        # Decoded in the loader workers: where the uint8 -> float step (or, for JPEGs on a GPU, the decode) runs.
        data, decode_note = place_decoding(data, strategy.input_device, config.num_workers)
        strategy.inputs = DeviceInputs.for_run(config, data.train.normalise, strategy.input_device, rank)
        if config.compile:
            compile_model(model, strategy)
        optimizer = build_optimizer(config, model.parameters())
        amp_dtype = resolve_amp(config.amp, strategy.input_device)
        if spec(config.strategy).microbatched and amp_dtype == torch.float16:
            amp_dtype = None  # fp16 without a gradient scaler underflows; pipelines cannot scale
        scaler = make_grad_scaler(amp_dtype)
        precision = PrecisionRecord(model, scaler) if amp_dtype is not None else None
        measures = RunMeasures(strategy, model, optimizer, amp_dtype, flops)
        resident = keep_on_device(data, strategy.input_device)
        if resident is not None:
            data = resident
        loaders = build_loaders(data, config, strategy)
        schedule = attach_schedule(optimizer, config, batches_per_epoch=len(loaders[0]))
        bn_loader = statistics_loader(loaders[0], config.bn_stats_images, config.seed,
                                      full_batches=strategy.drop_last_train) if config.bn_stats_images else None
        has_batchnorm, lag_noted = bool(batchnorm_layers(strategy.unwrap(model))), False
        engine = make_engine(db_url) if strategy.is_main else None
        if config.compile:
            _record_compile_time(engine, run_id, strategy, compile_warmup(model, loaders, strategy, amp_dtype))
        progress = ProgressWriter(engine, run_id) if engine is not None else None
        hooks = step_hooks(config, strategy, engine, db_url, run_id, progress, energy_part)
        if engine is not None and resident is not None:
            retry_when_locked(lambda: store.add_notes(engine, run_id, [device_data_note(data, strategy.input_device)]),
                              what="record the run's notes")
        if engine is not None and decode_note is not None:
            retry_when_locked(lambda: store.add_notes(engine, run_id, [decode_note]), what="record the run's notes")
        if engine is not None:
            once = {**measures.once_per_run(), "effective_batch": config.effective_batch,
                    **stored_estimate(config, data.info.num_classes, data.info.in_chans)}
            retry_when_locked(lambda: store.set_measurements(engine, run_id, once), what="record the run's measurements")
        checkpoint = folder / "best.pt"
        start_epoch, best_acc = 1, -1.0
        if resumable:
            start_epoch, best_acc = resume.restore(folder, strategy, model, optimizer, loaders[0], schedule=schedule)
            if engine is not None and resume.restart_count() > 0:
                store.add_notes(engine, run_id, [resume.resume_note(start_epoch, resume.restart_count())])
        for epoch in range(start_epoch, config.epochs + 1):
            if progress is not None:
                progress.epoch = epoch
            profiler = _start_profiler(config, strategy, folder) if config.profile and epoch == 1 else None
            hooks.start_epoch(epoch, loaders[0], optimizer)
            metrics = run_epoch(epoch, model, loaders, optimizer, strategy, amp_dtype, scaler,
                                on_step=hooks, profiler=profiler, precision=precision, bn_loader=bn_loader,
                                on_loss=hooks.loss, measures=measures, on_start=hooks.begin_training)
            metrics.extra.update(hooks.end_epoch(images=round(metrics.images_per_s * metrics.train_time_s)))
            if profiler is not None:
                strategy.barrier()  # every rank has written its profile
                if engine is not None:
                    store_profiles(engine, run_id, profiler.out_dir, config)
            # Every rank reaches the same verdict (the metrics are reduced, or rank 0's: run_epoch), and
            # assembling a sharded or pipelined state dict needs every rank.
            improved = metrics.val_acc > best_acc
            best_acc = max(best_acc, metrics.val_acc)
            state = strategy.checkpoint_state(model) if improved else None
            confusion = metrics.extra.pop("confusion", None)
            if engine is not None:
                # The one write that must not be lost: wait out another process's lock (with backoff)
                # rather than fail the run, up to PARALLAX_DB_LOCK_WAIT_S.
                retry_when_locked(lambda metrics=metrics: store.log_epoch(engine, run_id, vars(metrics)),
                                  what=f"record epoch {epoch}")
                if improved and confusion:
                    record = {"confusion": confusion_record(epoch, data.info.class_names, confusion)}
                    retry_when_locked(lambda record=record: store.set_measurements(engine, run_id, record),
                                      what=f"record epoch {epoch}'s confusion matrix")
                if echo:
                    print(metrics.line(config.epochs), flush=True)
                if notes := measures.take_notes() + hooks.take_notes():
                    retry_when_locked(lambda: store.add_notes(engine, run_id, notes), what="record the run's notes")
                if peak := measures.take_remeasured():
                    retry_when_locked(lambda: store.set_measurements(engine, run_id, peak), what="record the CPU peak")
                note = None if lag_noted else lag_note(
                    train_acc=metrics.train_acc, val_acc=metrics.val_acc, epoch=epoch, steps_per_epoch=len(loaders[0]),
                    reestimated=bn_loader is not None, has_batchnorm=has_batchnorm)
                if note is not None:
                    retry_when_locked(lambda note=note: store.add_notes(engine, run_id, [note]),
                                      what="record the run's notes")
                    lag_noted = True
                if state is not None:
                    save_checkpoint(checkpoint, state, config, data, metrics)
            if resumable:  # after the epoch is recorded: a restart never skips an unrecorded epoch
                resume.save_resume_point(folder, strategy, model, optimizer, loaders[0], epoch=epoch, best_acc=best_acc,
                                         schedule=schedule)
    except BaseException:
        # Closing the hooks writes notes, and may fail for the reason the run failed (a database
        # locked for good): that must not take the place of the run's own error.
        if hooks is not None:
            try:
                hooks.close()
            except Exception as exc:
                print(f"parallax: the step notes of run {run_id} are incomplete: {type(exc).__name__}: {exc}",
                      file=sys.stderr, flush=True)
            hooks = None
        raise
    finally:
        if hooks is not None:
            hooks.close()
        strategy.teardown()


def step_hooks(config: RunConfig, strategy: Strategy, engine, db_url: str, run_id: int, progress,
               energy_part: EnergyPart | None = None) -> StepHooks:
    """This process's per-step hooks. Step points come from rank 0, except in a pipeline, where
    only the last stage computes the loss (of the whole batch: every stage sees it) and records
    them itself; rank 0 measures the energy of every epoch it writes, and in a torchrun job across
    machines (``energy_part``) each machine's local rank 0 meters its machine for rank 0 to sum."""
    records = strategy.rank == spec(config.strategy).recording_rank(strategy.world_size)
    recorder_engine = engine if engine is not None else (make_engine(db_url) if records else None)
    started_at_s = run_started_at_s(recorder_engine, run_id) if recorder_engine is not None else time.time()
    # ddp and fsdp ranks each train on their own part of the global batch.
    images_factor = strategy.world_size if spec(config.strategy).splits_batch else 1
    recorder = StepRecorder(recorder_engine, run_id, started_at_s, images_factor=images_factor,
                            device=strategy.output_device) if records else None
    energy, notes = None, [series_note(config, strategy.world_size)]
    if energy_part is not None:  # every process of the job, at this same point: a collective
        energy = JobEnergy.open(energy_part)
        notes += energy.take_notes()
    elif engine is not None:
        energy = EnergyMeter.open(cuda_indices(config.devices))
        notes.append(energy.note())
    if engine is not None:
        retry_when_locked(lambda: store.add_notes(engine, run_id, [n for n in notes if n]), what="record the series notes")
    return StepHooks(progress=progress, recorder=recorder, energy=energy, started_at_s=started_at_s,
                     devices=strategy.devices)


def run_started_at_s(engine, run_id: int) -> float:
    """The run's ``started_at`` as a Unix time: every series' ``t_s`` counts from it."""
    run = retry_when_locked(lambda: store.get_run(engine, run_id), what="read when the run started")
    return run.started_at.timestamp() if run is not None and run.started_at is not None else time.time()


def series_note(config: RunConfig, world_size: int) -> str | None:
    """Where the step losses come from, when that is not the global batch's loss."""
    if spec(config.strategy).splits_batch and world_size > 1:
        return ("Step points show rank 0's training loss (its part of the batch; reducing it across ranks every "
                "step would cost a collective), and images/s of the global batch; epoch losses are over all ranks.")
    if spec(config.strategy).records_on_last_rank:
        return "Step points are recorded by the last pipeline stage, which computes the loss of the whole batch."
    return None


def _record_compile_time(engine, run_id: int, strategy: Strategy, seconds: float) -> None:
    """The slowest process's compile warm-up, in runs.measurements and a run note (rank 0)."""
    slowest = strategy.all_reduce(torch.tensor([seconds], dtype=torch.float64, device=strategy.output_device), "max")
    if engine is not None:
        retry_when_locked(lambda: store.set_measurements(engine, run_id, {"compile_time_s": round(slowest.item(), 3)}),
                          what="record the compile time")
        retry_when_locked(lambda: store.add_notes(engine, run_id, [compile_note(slowest.item())]),
                          what="record the compile note")


def _start_profiler(config: RunConfig, strategy: Strategy, folder) -> StepProfiler:
    profiler = StepProfiler(
        wait=config.profile_wait, warmup=config.profile_warmup, active=config.profile_active,
        devices=strategy.devices, rank=strategy.rank, world_size=strategy.world_size,
        out_dir=folder / "profile", with_stack=config.profile_stack,
    )
    profiler.start()
    return profiler


def store_profiles(engine, run_id: int, out_dir, config: RunConfig) -> None:
    """Rank 0 moves every rank's profile files into the database."""
    notes = [f"Epoch 1 was profiled (steps {config.profile_wait + config.profile_warmup + 1}-"
             f"{config.profile_wait + config.profile_warmup + config.profile_active}); its timings include the profiler's cost."]
    for summary, trace_gz in read_rank_outputs(out_dir):
        profiles.save_profile(engine, run_id, summary["rank"], ops=summary["ops"], steps=summary["steps"],
                              trace_gz=trace_gz, trace_bytes=summary["trace_bytes"])
        if summary["trace_bytes"] > LARGE_TRACE_BYTES:
            notes.append(f"The profiler trace of rank {summary['rank']} is large "
                         f"({summary['trace_bytes'] / 2**20:.0f} MB): profile fewer active steps (--profile-active).")
        if not summary["steps"]:
            notes.append(f"Rank {summary['rank']} recorded no complete profiled step: the first epoch is "
                         "shorter than the profiling window (--profile-wait/--profile-warmup/--profile-active).")
    store.add_notes(engine, run_id, notes)


def note_log_incomplete(engine, run_id: int, exc: OSError) -> None:
    """Tell the run's reader that its log has gaps (the metrics are in the database)."""
    note = LOG_INCOMPLETE_NOTE.format(error=describe(exc))
    retry_when_locked(lambda: store.add_notes(engine, run_id, [note]), what="note that the log is incomplete")


def _die_with_parent() -> None:
    """A spawned rank asks the kernel for SIGKILL when its parent (the run's main process) dies,
    so a worker killed from outside never leaves ranks training or hung in a collective."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
