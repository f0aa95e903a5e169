"""Every database write of a rank, and how each one waits out a locked database.

    recorder = Recorder(make_engine(url), run_id, echo=True)   # the rank that records the run
    recorder = NoRecorder()                                     # every other rank: same methods, no writes
    recorder.progress(epoch, step, total_steps)                 # skippable: a locked database skips it
    recorder.epoch(epoch, row, line)                            # must land: waits out the lock
    recorder.notes(["..."])

A write that must land (an epoch, a note, a measurement) waits out another process's lock with
growing pauses (``retry_when_locked``) for up to PARALLAX_DB_LOCK_WAIT_S, then fails the run
saying what it could not write. A skippable one (progress, step points: a newer one follows) waits
about a second; after one found the database locked, the next comes 2, 4, 8 ... s later
(``LockBackoff``), so that a lock held for minutes costs training seconds, not a second per step.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import torch

from db.notify import notify
from db import run_state as state
from db import profiles, series, store
from db.connection import DatabaseLockedError, LockBackoff, retry_when_locked

from contract.config import RunConfig
from trainer_backend.telemetry.logguard import LOG_INCOMPLETE_NOTE, describe
from contract.storage import write_remaking_folder
from trainer_backend.telemetry.profiling import LARGE_TRACE_BYTES, read_rank_outputs

PROGRESS_INTERVAL_S = 1.0


def run_started_at_s(engine, run_id: int) -> float:
    """The run's ``started_at`` as a Unix time: every series' ``t_s`` counts from it."""
    run = retry_when_locked(lambda: store.get_run(engine, run_id), what="read when the run started")
    return run.started_at.timestamp() if run is not None and run.started_at is not None else time.time()


class Recorder:
    """What one process writes of run ``run_id``; ``echo`` prints each epoch's line to the log too."""

    writes = True

    def __init__(self, engine, run_id: int, *, echo: bool = False, progress_interval_s: float = PROGRESS_INTERVAL_S):
        self.engine, self.run_id, self.echo = engine, run_id, echo
        self.progress_interval_s = progress_interval_s
        self._progress_at = 0.0
        self._progress_backoff = LockBackoff()
        self._steps_backoff = LockBackoff()

    def started_at_s(self) -> float:
        return run_started_at_s(self.engine, self.run_id)

    def notes(self, notes: list[str | None], *, what: str = "record the run's notes") -> None:
        """Append the notes that are not None or empty (the run keeps each note once)."""
        notes = [note for note in notes if note]
        if notes:
            retry_when_locked(lambda: store.add_notes(self.engine, self.run_id, notes), what=what)

    def measurements(self, values: dict, *, what: str = "record the run's measurements") -> None:
        if values:
            retry_when_locked(lambda: store.set_measurements(self.engine, self.run_id, values), what=what)

    def once_per_run(self, figures: Callable[[], dict]) -> None:
        """The run's once-per-run measurements; ``figures`` is called here only, since some take
        time to work out (the memory estimate traces the model) that other ranks need not spend."""
        self.measurements(figures())

    def compile_time(self, seconds: float, note: str) -> None:
        """The slowest process's compile warm-up, in the measurements and a note saying what it was."""
        self.measurements({"compile_time_s": round(seconds, 3)}, what="record the compile time")
        self.notes([note], what="record the compile note")

    def epoch(self, epoch: int, row: dict, line: str | None = None) -> None:
        """The epoch's summary row: the one write that must not be lost, so it waits out another
        process's lock rather than fail the run, up to PARALLAX_DB_LOCK_WAIT_S."""
        retry_when_locked(lambda: store.log_epoch(self.engine, self.run_id, row), what=f"record epoch {epoch}")
        if self.echo and line is not None:
            print(line, flush=True)

    def confusion(self, epoch: int, record: dict) -> None:
        """The best epoch's confusion matrix, kept once per run."""
        self.measurements({"confusion": record}, what=f"record epoch {epoch}'s confusion matrix")

    def progress(self, epoch: int, step: int, total_steps: int, *, now: bool = False) -> None:
        """(epoch, step of total) for the progress bars, at most about once a ``progress_interval_s``
        and at an epoch's last step (or ``now``: where the run stops); skipped while the database is locked,
        then tried less often."""
        at = time.monotonic()
        # An epoch's start and end always land: the stall watch judges only between them (supervisor/stall.py).
        if ((now or step in (0, total_steps) or at - self._progress_at >= self.progress_interval_s)
                and self._progress_backoff.due(at)):
            self._progress_at = at
            landed = state.set_progress(self.engine, self.run_id, epoch=epoch, step=step, total_steps=total_steps)
            self._progress_backoff.tried(landed, time.monotonic())

    def step_points(self, rows: list[dict], *, window_s: float | None) -> bool:
        """Write step points: True once written, False when not tried (the caller keeps the rows
        for the next write). While training (``window_s`` given) a locked database is waited out
        for ``window_s`` only, and after a try that found it locked the next waits its turn: the
        epoch's own record, which must not be lost, gets the whole PARALLAX_DB_LOCK_WAIT_S, and
        step points must not spend it first. The last write (``window_s`` None) waits as long as
        any must-keep write. A lock that outlasts the wait raises DatabaseLockedError."""
        if window_s is not None and not self._steps_backoff.due(time.monotonic()):
            return False
        try:
            retry_when_locked(lambda: series.add_steps(self.engine, self.run_id, rows, lock_wait_s=window_s),
                              what="record step points", window_s=window_s)
        except DatabaseLockedError:
            self._steps_backoff.tried(False, time.monotonic())
            raise
        self._steps_backoff.tried(True, time.monotonic())
        return True

    def profiles(self, out_dir, config: RunConfig) -> None:
        """Move every rank's profile files into the database, with notes on what they hold. A rank that
        kept no profiled step (its summary says why) stores nothing and leaves a note."""
        first = config.profile_wait + config.profile_warmup + 1
        outputs = read_rank_outputs(out_dir)
        kept = max((summary.get("kept_steps", config.profile_active) for summary, _ in outputs), default=0)
        notes = []
        if kept:
            notes.append(f"Epoch 1 was profiled (steps {first}-{first + kept - 1}); its timings include the "
                         "profiler's cost.")
        if 0 < kept < config.profile_active:
            notes.append(f"The profiled window ended with the first epoch, after {kept} of the "
                         f"{config.profile_active} steps asked (--profile-active).")
        for summary, trace_gz in outputs:
            if trace_gz is None:
                notes.append(f"Rank {summary['rank']} kept no profile: {summary['skipped']}; training went on "
                             "unprofiled.")
                continue
            # One transaction per rank that replaces what it stored: waited out and tried again whole.
            save = functools.partial(profiles.save_profile, self.engine, self.run_id, summary["rank"], ops=summary["ops"],
                                     steps=summary["steps"], trace_gz=trace_gz, trace_bytes=summary["trace_bytes"])
            retry_when_locked(save, what=f"record rank {summary['rank']}'s profile")
            if summary["trace_bytes"] > LARGE_TRACE_BYTES:
                notes.append(f"The profiler trace of rank {summary['rank']} is large "
                             f"({summary['trace_bytes'] / 2**20:.0f} MB): profile fewer active steps (--profile-active).")
            if not summary["steps"]:
                notes.append(f"Rank {summary['rank']} recorded no complete profiled step: the first epoch is "
                             "shorter than the profiling window (--profile-wait/--profile-warmup/--profile-active).")
        self.notes(notes, what="record the profiler's notes")

    def checkpoint(self, path, payload: dict) -> None:
        """Save the best model so far. Through a part file: a crash or a full disk mid-save never
        leaves a truncated best.pt, and a file object (not a path) keeps the errno that says the
        disk is full."""
        write_remaking_folder(path, "checkpoint", lambda handle: torch.save(payload, handle))

    def forget_steps_from(self, epoch: int, after_step: int = 0) -> None:
        """A resumed run trains ``epoch`` and later again (after global step ``after_step``, when an epoch
        continues where it stopped): their step points from before go first."""
        retry_when_locked(lambda: series.forget_steps_from(self.engine, self.run_id, epoch, after_step),
                          what=f"clear the step points from epoch {epoch}")

    def notify(self, event: str, reason: str) -> None:
        """Post ``event`` of the run to the home's webhooks, in the background (db/notify.py)."""
        notify(self.engine, self.run_id, event, reason)

    def log_incomplete(self, exc: OSError) -> None:
        """Tell the run's reader that its log has gaps (the metrics are in the database)."""
        self.notes([LOG_INCOMPLETE_NOTE.format(error=describe(exc))], what="note that the log is incomplete")


class NoRecorder:
    """The recorder of a rank that does not write the run: every method of ``Recorder``, doing nothing."""

    writes = False

    def started_at_s(self) -> float:
        return time.time()

    def notes(self, notes: list[str | None], *, what: str = "") -> None:
        pass

    def measurements(self, values: dict, *, what: str = "") -> None:
        pass

    def once_per_run(self, figures: Callable[[], dict]) -> None:
        pass

    def compile_time(self, seconds: float, note: str) -> None:
        pass

    def notify(self, event: str, reason: str) -> None:
        pass

    def forget_steps_from(self, epoch: int, after_step: int = 0) -> None:
        pass

    def epoch(self, epoch: int, row: dict, line: str | None = None) -> None:
        pass

    def confusion(self, epoch: int, record: dict) -> None:
        pass

    def progress(self, epoch: int, step: int, total_steps: int, *, now: bool = False) -> None:
        pass

    def step_points(self, rows: list[dict], *, window_s: float | None) -> bool:
        return True

    def profiles(self, out_dir, config: RunConfig) -> None:
        pass

    def checkpoint(self, path, payload: dict) -> None:
        pass

    def log_incomplete(self, exc: OSError) -> None:
        pass
