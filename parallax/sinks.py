"""Where an online run's values go: the run's database, and each rank's system samples beside them."""

from __future__ import annotations

import os
import signal
import time

from db import run_state, script_metrics
from trainer_backend.telemetry.sampler import SystemSampler


class DatabaseSink:
    """Rank 0's writes: the logged values in one statement per turn, a heartbeat every
    ``run_state.HEARTBEAT_INTERVAL_S``, and a config the script changed."""

    def __init__(self, run, started_at_s: float):
        self.run, self.started_at_s = run, started_at_s
        self._beat_at = time.monotonic()
        self._waits_recorded = 0
        self._series_ids: dict[str, int] = {}  # the run's logged names' rows, found once

    def write(self, entries: list[tuple]) -> None:
        started = self.started_at_s
        columns: dict[str, tuple[list, list, list]] = {}  # each name's steps, times and values
        for step, at, values in entries:
            t_s = at - started
            for name, value in values.items():
                column = columns.get(name)
                if column is None:
                    column = columns[name] = ([], [], [])
                column[0].append(step)
                column[1].append(t_s)
                column[2].append(value)
        script_metrics.add_columns(self.run._engine, self.run.run_id, columns, series_ids=self._series_ids)

    def tick(self) -> None:
        engine, run_id = self.run._engine, self.run.run_id
        if (config := self.run.config.take_change()) is not None:
            script_metrics.update_script_config(engine, run_id, config)
        now = time.monotonic()
        if now - self._beat_at < run_state.HEARTBEAT_INTERVAL_S:
            return
        self._beat_at = now
        self._record_log_wait()
        if not run_state.heartbeat(engine, run_id) and _ended_as(engine, run_id) == "cancelled":
            # Cancelled where SIGTERM could not reach (another machine, another user): stop as if it had.
            os.kill(os.getpid(), signal.SIGTERM)


    def _record_log_wait(self) -> None:
        """How long ``log`` has waited so far, on the run while it runs (the Run page says it)."""
        from db import store

        writer = self.run._writer
        if writer is not None and writer.waits != self._waits_recorded:
            store.set_measurements(self.run._engine, self.run.run_id, {script_metrics.LOG_WAIT_KEY: writer.wait_record()})
            self._waits_recorded = writer.waits


def _ended_as(engine, run_id: int) -> str | None:
    from db import store

    run = store.get_run(engine, run_id)
    return None if run is None else run.status


class RankSampler(SystemSampler):
    """One rank's samples: its own process always; the machine's CPU and memory from local rank 0 only, so
    that a machine of eight ranks is not counted eight times; the GPU of its local rank where there is one."""

    def __init__(self, engine, run_id: int, started_at_s: float, info):
        super().__init__(engine, run_id, started_at_s, _visible_gpu(info.local_rank), node=info.node)
        self.local_rank = info.local_rank

    def sample(self) -> dict:
        row = super().sample()
        if self.local_rank != 0:
            row["host_cpu_pct"] = row["host_memory_mb"] = None
        return row


def _visible_gpu(local_rank: int) -> list[int]:
    # A script that hides every GPU (CUDA_VISIBLE_DEVICES="") uses none; otherwise its local rank's, as
    # torchrun scripts pick (cuda:LOCAL_RANK). NVML absent (no driver): no GPU figures, as for launched runs.
    return [] if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "" else [local_rank]
