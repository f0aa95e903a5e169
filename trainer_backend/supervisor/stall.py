"""Catching a run that hangs: no step for too long while its processes live (a rank stuck in a
collective, a deadlocked data loader, a stalled device).

    with StallWatch(engine, run_id, folder, on_stall=config.on_stall) as watch:
        train ...
    watch.cancel_reason   # set when --on-stall cancel ended the run

The run's main process reads the run's progress (epoch, step of total; the recording rank writes it
about once a second and at each epoch's start) every few seconds. While an epoch's training is under
way (from its start to its last step), a run is stalled when its step has not moved for
``max(PARALLAX_STALL_AFTER_S, STALL_STEPS x the median step time seen)``, 5 minutes by default, well
inside the collectives' 10-minute timeout. Validation and checkpointing, between an epoch's last step and
the next one's start, are not judged. A stalled run:

- has every rank's Python stack written into its log: each rank registered ``faulthandler`` on
  ``STACK_SIGNAL`` (``telemetry.stacks.register_stack_dump``), writing to ``rank<N>.stacks`` in the run's folder, so a
  rank whose main thread waits inside C++ (gloo, NCCL) still answers; the log gets each rank's stacks
  and one line saying where each rank is (its innermost frame, and the innermost of Parallax's own);
- is marked on its page (``measurements["stalled"]``, a note) and told to the webhooks (``run.stalled``);
- then waits (``--on-stall wait``: if its steps move again the mark is cleared) or is cancelled
  (``--on-stall cancel``: it ends ``cancelled``, the reason saying it stalled).
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

from db import notify, store
from contract.environment import seconds_from_env

from trainer_backend.telemetry.stacks import STACK_SIGNAL, STACKS_FILE

STALL_AFTER_ENV = "PARALLAX_STALL_AFTER_S"
DEFAULT_STALL_AFTER_S = 300.0
STALL_STEPS = 20  # a step this many times slower than the median is no slow step
MEASUREMENT = "stalled"


def stall_after_s() -> float:
    return seconds_from_env(STALL_AFTER_ENV, DEFAULT_STALL_AFTER_S)


FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')


def where(stacks: str) -> str:
    """Where a rank is, from its faulthandler dump: the innermost frame of the thread that runs Parallax's
    training (else the first thread), and the innermost frame of Parallax's own code in it."""
    threads = [block for block in re.split(r"\n(?=(?:Current thread|Thread) 0x)", stacks.strip()) if block.strip()]
    if not threads:
        return "no stack was written"
    ours = [t for t in threads if "trainer_backend" in t] or threads
    frames = [m.groupdict() for m in map(FRAME.match, ours[0].splitlines()) if m]
    if not frames:
        return "no Python frame"
    top = frames[0]
    text = f"in {top['function']} ({Path(top['path']).name}:{top['line']})"
    own = next((f for f in frames if "trainer_backend" in f["path"] or "/tests/plugins/" in f["path"]), None)
    if own is not None and own is not top:
        text += f", from {own['function']} ({Path(own['path']).name}:{own['line']})"
    return text


class StallWatch:
    """See the module's docstring. ``check_s``: how often progress is read (a fraction of the bound)."""

    def __init__(self, engine, run_id: int, folder: Path, *, on_stall: str = "wait", after_s: float | None = None):
        self.engine, self.run_id, self.folder, self.on_stall = engine, run_id, folder, on_stall
        self.after_s = stall_after_s() if after_s is None else after_s
        self.check_s = min(5.0, max(0.2, self.after_s / 5))
        self.cancel_reason: str | None = None
        self.stalled = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"stall-watch-run-{run_id}", daemon=True)
        self._last: tuple | None = None
        self._moved_at = time.monotonic()
        self._step_s: list[float] = []

    def __enter__(self) -> StallWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=self.check_s + 1)

    def bound_s(self) -> float:
        median = statistics.median(self._step_s) if self._step_s else 0.0
        return max(self.after_s, STALL_STEPS * median)

    def _watch(self) -> None:
        while not self._stop.wait(self.check_s):
            try:
                self._look()
            except Exception as exc:  # a locked or unreachable database must not end the run
                print(f"parallax: the stall watch of run {self.run_id} skipped a look: {type(exc).__name__}: {exc}",
                      file=sys.stderr, flush=True)

    def _look(self) -> None:
        run = store.get_run(self.engine, self.run_id)
        if run is None or run.status != "running":
            return
        now = time.monotonic()
        progress = (run.progress_epoch, run.progress_step, run.progress_total_steps)
        if progress != self._last:
            if self._last is not None and self._last[0] == progress[0] and progress[1] and self._last[1] is not None:
                moved = progress[1] - self._last[1]
                if moved > 0:
                    self._step_s.append((now - self._moved_at) / moved)
                    del self._step_s[:-200]
            self._last, self._moved_at = progress, now
            if self.stalled:
                self._resumed()
            return
        epoch, step, total = progress
        training = epoch is not None and step is not None and total and step < total
        if training and not self.stalled and now - self._moved_at > self.bound_s():
            self._stalled(epoch, step, total, now - self._moved_at)

    def _stalled(self, epoch: int, step: int, total: int, quiet_s: float) -> None:
        self.stalled = True
        places = self.dump_stacks()
        summary = "; ".join(f"rank {rank} {place}" for rank, place in places.items()) or "no rank's stack could be read"
        reason = (f"stalled: no step for {quiet_s:.0f} s at epoch {epoch} step {step} of {total} while its processes "
                  f"live (bound {self.bound_s():.0f} s); {summary}")
        store.set_measurements(self.engine, self.run_id, {MEASUREMENT: {"epoch": epoch, "step": step,
                                                                         "quiet_s": round(quiet_s), "where": places}})
        store.add_notes(self.engine, self.run_id, [f"The run {reason}. Every rank's stack is in its log."])
        notify.notify(self.engine, self.run_id, "run.stalled", reason)
        if self.on_stall == "cancel":
            self.cancel_reason = f"{reason}; cancelled (--on-stall cancel)"
            os.kill(os.getpid(), signal.SIGTERM)  # the run's cancel handler stops every rank

    def _resumed(self) -> None:
        self.stalled = False
        store.set_measurements(self.engine, self.run_id, {MEASUREMENT: None})
        store.add_notes(self.engine, self.run_id, ["The run's steps moved again after it stalled."])

    def dump_stacks(self, wait_s: float = 3.0) -> dict[int, str]:
        """Signal each rank to write its stacks, copy them into the log (this process's stderr), and say where
        each rank is."""
        places = {}
        for pid_file in sorted(self.folder.glob("rank*.pid"), key=lambda p: int(p.stem.removeprefix("rank"))):
            rank = int(pid_file.stem.removeprefix("rank"))
            stacks_path = self.folder / STACKS_FILE.format(rank=rank)
            try:
                pid = int(pid_file.read_text())
                before = stacks_path.stat().st_size if stacks_path.exists() else 0
                os.kill(pid, STACK_SIGNAL)
            except (OSError, ValueError) as exc:
                places[rank] = f"could not be asked for its stack ({exc})"
                continue
            deadline = time.monotonic() + wait_s
            text = ""
            while time.monotonic() < deadline:
                time.sleep(0.1)
                if stacks_path.exists() and stacks_path.stat().st_size > before:
                    time.sleep(0.2)  # let faulthandler finish the dump
                    with open(stacks_path, encoding="utf-8", errors="replace") as handle:
                        handle.seek(before)
                        text = handle.read()
                    break
            places[rank] = where(text) if text else "did not write its stack"
            print(f"parallax: run {self.run_id} stalled: the stack of rank {rank} (pid {pid}), {places[rank]}:\n"
                  f"{text.rstrip()}\n", file=sys.stderr, flush=True)
        return places
