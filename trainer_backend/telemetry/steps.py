"""The per-step series of a run (loss, images/s of the global batch, learning rate) and the
end-of-training marks of each epoch (``t_end_s``, energy), recorded by the process that writes
the run.

    hooks = StepHooks(progress=recorder.progress, recorder=StepRecorder(recorder, started_at_s, images_factor=2),
                      energy=EnergyMeter.open([]), started_at_s=started_at_s)
    hooks.start_epoch(epoch, train_loader, optimizer)
    train_one_epoch(..., on_start=hooks.begin_training, on_step=hooks, on_loss=hooks.loss)
    metrics.extra.update(hooks.end_epoch(images))

A point is recorded every step, or, when steps are faster than ``PARALLAX_STEP_POINT_S`` (0.5 s),
one per that much time, holding the mean loss of the steps since the previous point. Losses stay
on the device: each step's loss is copied into a device buffer, and the buffer is read every few
seconds (a non-blocking copy, read once it has landed) and at the epoch's end, so training never
waits for the host to see a loss. On CUDA the points' images/s come from CUDA events on the
stream of the losses' device, so they time the device's work, not the host running ahead of it;
the first window begins when the loop starts training (``begin_training``), before step 1 is queued.
Rows are written a few seconds' worth at a time; the run's first point at once.
"""

from __future__ import annotations

import time

import torch

from db.connection import SKIPPABLE_WRITE_WAIT_S, DatabaseLockedError

from trainer_backend.telemetry.energy import EnergyMeter
from trainer_backend.telemetry.job_energy import JobEnergy
from trainer_backend.telemetry.recorder import Recorder
from trainer_backend.telemetry.sampler import step_point_s
from trainer_backend.telemetry.rank_times import synchronize

FLUSH_S = 5.0
MAX_UNWRITTEN_ROWS = 20_000  # step points kept while the database is locked (hours of points)
ENERGY_TICK_S = 1.0


def step_images(loader) -> list[int]:
    """Images in each of this process's batches of ``loader``, in order (the last may be short)."""
    steps, batch = len(loader), loader.batch_size
    if steps == 0:
        return []
    last = batch if loader.drop_last else len(loader.sampler) - (steps - 1) * batch
    return [batch] * (steps - 1) + [last]


class StepRecorder:
    """Step points of one run, written through ``writer`` (the recorder of the process that
    records them, see recorder.py). ``images_factor`` turns this process's
    batch into the global one (the data-parallel ranks, each with its own batch). ``device``: where
    the step losses live (the strategy's output device; taken from the first loss when not given);
    on CUDA every event is recorded on its stream, the one the losses and their host copy are on."""

    def __init__(self, writer: Recorder, started_at_s: float, *, images_factor: int = 1,
                 min_interval_s: float | None = None, flush_s: float = FLUSH_S, device: torch.device | None = None):
        self.writer, self.started_at_s = writer, started_at_s
        self.images_factor = images_factor
        self.device = device
        self.min_interval_s = step_point_s() if min_interval_s is None else min_interval_s
        self.flush_s = flush_s
        self.cost_s = 0.0  # seconds the training thread spent in the recorder
        self.written = self.dropped = 0
        self._unwritten: list[dict] = []  # rows a locked database refused, written with the next ones
        self._pending = None  # (host copy of losses, its CUDA event, the points it resolves)

    def start_epoch(self, epoch: int, loader, optimizer: torch.optim.Optimizer, first_step: int = 1) -> None:
        """``first_step``: an epoch continued after a stop; its earlier steps' points are recorded already."""
        self.epoch, self.optimizer = epoch, optimizer
        self.images = step_images(loader)
        self.step_offset = (epoch - 1) * len(self.images)  # steps count across epochs, also after a resume
        self._losses: torch.Tensor | None = None
        self._points: list[dict] = []
        self._read_upto = first_step - 1  # steps whose losses have been copied to the host
        self._window_images = 0
        self._window_start = self._last_flush = time.perf_counter()
        self._window_event = None
        self._cuda = self.device is not None and self.device.type == "cuda"

    def begin_training(self) -> None:
        """The epoch's training starts now: the first point's window begins here. On CUDA a begin
        event recorded later (with the first loss) would come after step 1's queued work, whose
        images the window still counts: the first point's images/s would be far too high."""
        started = time.perf_counter()
        self._window_start = started
        if self._cuda:
            self._window_event = _event(self.device)
        self.cost_s += time.perf_counter() - started

    def loss(self, loss: torch.Tensor) -> None:
        """This step's loss (a device tensor); kept on the device."""
        started = time.perf_counter()
        if self._losses is None:
            self._losses = torch.zeros(len(self.images), dtype=torch.float32, device=loss.device)
            if self.device is None:
                self.device = loss.device
                self._cuda = loss.device.type == "cuda"
            if self._cuda and self._window_event is None:  # the loop did not say when training began
                self._window_event = _event(self.device)
        self._step_loss = loss
        self.cost_s += time.perf_counter() - started

    def step(self, step: int, total_steps: int) -> None:
        started = time.perf_counter()
        loss = getattr(self, "_step_loss", None)
        if loss is not None and self._losses is not None and step <= len(self._losses):
            self._losses[step - 1].copy_(loss.detach(), non_blocking=True)  # a device-side copy: no sync
        self._step_loss = None
        self._window_images += self.images[step - 1] * self.images_factor if step <= len(self.images) else 0
        now = time.perf_counter()
        last = step == total_steps
        if last or now - self._window_start >= self.min_interval_s:
            self._point(step, now)
        self._collect(wait=False)
        # The run's first point is written at once, so that a watching page charts it from the first step.
        first = not self.written and self._pending is None and not self._unwritten
        if self._points and (last or first or now - self._last_flush >= self.flush_s):
            self._stage()
            self._last_flush = now
        if last:
            self._collect(wait=True)
        self.cost_s += time.perf_counter() - started

    def end_epoch(self) -> None:
        """Write what is left of the epoch (an epoch cut short has points its last step did not write)."""
        started = time.perf_counter()
        if getattr(self, "_points", None):
            self._stage()
        self._collect(wait=True)
        self.cost_s += time.perf_counter() - started

    def note_dropped(self) -> None:
        self.finish()
        if self.dropped:
            self.writer.notes([f"{self.dropped} step points were not recorded: the database stayed locked."],
                              what="note missing steps")

    def _point(self, step: int, now: float) -> None:
        lr = self.optimizer.param_groups[0]["lr"]
        point = {"epoch": self.epoch, "step": self.step_offset + step, "local_step": step,
                 "t_s": round(time.time() - self.started_at_s, 3), "images": self._window_images,
                 "lr": lr.detach().clone() if isinstance(lr, torch.Tensor) else float(lr),
                 "first": self._points[-1]["local_step"] if self._points else self._read_upto,
                 "host_s": now - self._window_start}
        if self._cuda:
            point["begin"], point["end"] = self._window_event, _event(self.device)
            self._window_event = point["end"]
        self._points.append(point)
        self._window_images, self._window_start = 0, now

    def _stage(self) -> None:
        """Start copying the losses the points need to the host; read them once they have landed."""
        if self._pending is not None:
            self._collect(wait=True)
        points, self._points = self._points, []
        upto = points[-1]["local_step"]
        if self._losses is None:
            host, event = None, None
        elif self._cuda:
            host = self._losses[self._read_upto:upto].to("cpu", non_blocking=True)
            event = _event(self.device)  # after the copy, on the stream of the losses' device: it guards the copy
        else:
            host, event = self._losses[self._read_upto:upto].clone(), None
        self._pending = (host, event, points, self._read_upto)
        self._read_upto = upto

    def _collect(self, *, wait: bool) -> None:
        if self._pending is None:
            return
        host, event, points, base = self._pending
        if event is not None:
            if not wait and not event.query():
                return
            event.synchronize()
        self._pending = None
        losses = host.tolist() if host is not None else []
        rows = []
        for point in points:
            window = losses[point["first"] - base:point["local_step"] - base]
            seconds = point["begin"].elapsed_time(point["end"]) / 1000 if "end" in point else point["host_s"]
            lr = point["lr"]
            rows.append({"epoch": point["epoch"], "step": point["step"], "t_s": point["t_s"],
                         "train_loss": sum(window) / len(window) if window else None,
                         "images_per_s": point["images"] / seconds if seconds > 0 else None,
                         "lr": float(lr) if not isinstance(lr, float) else lr})
        self._unwritten += rows
        self._write(window_s=SKIPPABLE_WRITE_WAIT_S)

    def _write(self, *, window_s: float | None) -> None:
        """Write the rows not yet written. While training, a locked database is waited out for about
        a second only, and tried again after a growing pause (``Recorder.step_points``); the rows
        stay for the next write."""
        rows = self._unwritten
        if not rows:
            return
        try:
            if self.writer.step_points(rows, window_s=window_s):
                self.written += len(rows)
                self._unwritten = []
        except DatabaseLockedError:
            if len(rows) > MAX_UNWRITTEN_ROWS:  # a chart loses its oldest points; the notes say so
                self.dropped += len(rows) - MAX_UNWRITTEN_ROWS
                self._unwritten = rows[-MAX_UNWRITTEN_ROWS:]

    def finish(self) -> None:
        """The last write, at the end of the run: it waits as long as any must-keep write."""
        try:
            self._write(window_s=None)
        except DatabaseLockedError:
            pass
        if self._unwritten:
            self.dropped += len(self._unwritten)
            self._unwritten = []


def _event(device: torch.device) -> torch.cuda.Event:
    """An event on ``device``'s current stream. Not the current device's: under mp that is the first
    stage's GPU, while the losses, their host copy and the end of each step are on the last stage's."""
    event = torch.cuda.Event(enable_timing=True)
    event.record(torch.cuda.current_stream(device))
    return event


class StepHooks:
    """What runs after each training step on this process: the progress bar (``progress(epoch,
    step, total_steps)``, ``Recorder.progress``), the step recorder
    (where this process records steps) and the energy meter (on the process that writes epochs; in a
    torchrun job across machines, on every process, metering where it is its machine's local rank 0).
    ``devices``: this process's devices, synchronised before the energy meter stops, so that the
    epoch's energy covers its queued GPU work."""

    def __init__(self, *, progress=None, recorder: StepRecorder | None = None,
                 energy: EnergyMeter | JobEnergy | None = None,
                 started_at_s: float = 0.0, devices: list[torch.device] = ()):
        self.progress, self.recorder, self.energy = progress, recorder, energy
        self.epoch = 0
        self.devices = list(devices)
        self.started_at_s = started_at_s
        self.loss = recorder.loss if recorder is not None else None
        self._energy_tick = 0.0
        self._t_end_s: float | None = None
        self._joules: dict[str, float] | None = None

    def start_epoch(self, epoch: int, loader, optimizer, first_step: int = 1) -> None:
        self.epoch = epoch
        if self.progress is not None:
            self.progress(epoch, first_step - 1, len(loader))  # the epoch is under way: its steps are watched from here
        if self.recorder is not None:
            self.recorder.start_epoch(epoch, loader, optimizer, first_step)
        self._t_end_s, self._joules = None, None
        if self.energy is not None:
            self.energy.start()
            self._energy_tick = time.monotonic()

    def cut(self) -> None:
        """The epoch stops here (rank/stopping.py): write the step points it has."""
        if self.recorder is not None:
            self.recorder.end_epoch()

    def begin_training(self) -> None:
        """Called by the training loop when the epoch's first step is about to run."""
        if self.recorder is not None:
            self.recorder.begin_training()

    def __call__(self, step: int, total_steps: int) -> None:
        # The step point first: its window ends (its CUDA event, its host clock) before the progress write.
        if self.recorder is not None:
            self.recorder.step(step, total_steps)
        if self.progress is not None:
            self.progress(self.epoch, step, total_steps)
        if self.energy is not None and time.monotonic() - self._energy_tick >= ENERGY_TICK_S:
            self.energy.tick()
            self._energy_tick = time.monotonic()
        if step == total_steps:
            self._end_training()

    def _end_training(self) -> None:
        self._t_end_s = round(time.time() - self.started_at_s, 3)
        if self.energy is not None:
            # The step recorder's last read waits for the losses' stream; a process without one
            # (a pipeline's first stage meters, its last records) would stop with work still queued.
            synchronize(self.devices)
            self._joules = self.energy.stop()

    def end_epoch(self, images: int) -> dict:
        """The epoch's ``extra`` fields: when its training ended and the energy it took."""
        if self.recorder is not None:
            self.recorder.end_epoch()
        if self._t_end_s is None:  # an epoch without steps
            self._end_training()
        extra = {"t_end_s": self._t_end_s}
        if self.energy is not None:  # across machines, a collective every process of the job calls here
            extra.update(self.energy.epoch_fields(self._joules, images))
        return extra

    def take_notes(self) -> list[str]:
        """What the run's notes should gain about energy since they were last taken (a reading that
        failed during the run; across machines, named by machine)."""
        return self.energy.take_notes() if self.energy is not None else []

    def close(self) -> None:
        """Release NVML and say in the run's notes if step points could not be written."""
        if self.energy is not None:
            self.energy.close()
        if self.recorder is not None:
            self.recorder.note_dropped()
