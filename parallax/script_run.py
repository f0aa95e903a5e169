"""A script's run: ``parallax.init`` makes one, ``log`` feeds it, ``finish`` (or the script's end) ends it.

Rank 0 owns the run's row: it creates it (or resumes it), beats its heartbeat, writes what ``log`` was given
and records how the run ended. Every rank samples its own process (and, local rank 0, its machine) into the
run. The other ranks' ``log`` calls are not recorded: rank 0's are the run's metrics.

How a run ends: ``finish()`` or leaving ``with parallax.init(...)``: completed; an uncaught exception
(any rank): failed, with the exception's last line; SIGINT or SIGTERM: cancelled; the script exiting without
``finish``: completed; the process killed outright: lost, once the dashboard or ``parallax list`` sees its
pid gone (a run on another machine: its heartbeat older than 30 s).
"""

from __future__ import annotations

import math
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from parallax import endings
from parallax.endings import failure_text
from parallax.ranks import RankInfo, group_key
from parallax.values import MAX_STEP, as_config, as_step, as_values, storable_text
from parallax.writer import BackgroundWriter

RESUME_CHOICES = ("never", "allow", "must")
MODES = ("online", "offline", "disabled")
MODE_ENV = "PARALLAX_MODE"
JOIN_TIMEOUT_ENV = "PARALLAX_JOIN_TIMEOUT_S"
DEFAULT_JOIN_TIMEOUT_S = 120.0


class Config(dict):
    """``run.config``: a dict of what ``init`` was given, also readable and settable as attributes
    (``run.config.lr``); a change is written to the run within a second or two."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.__dict__["changed"] = False

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.__dict__["changed"] = True

    def update(self, *args, **kwargs):
        super().update(*args, **kwargs)
        self.__dict__["changed"] = True

    def __delitem__(self, key):
        super().__delitem__(key)
        self.__dict__["changed"] = True

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"run.config has no {name!r}; it has {', '.join(map(repr, self)) or 'nothing'}") from None

    def __setattr__(self, name, value):
        self[name] = value

    def take_change(self) -> dict | None:
        """The whole config as JSON holds it (values.as_config) where it changed since the last take, else None."""
        if not self.__dict__["changed"]:
            return None
        self.__dict__["changed"] = False
        return as_config(self)


class Run:
    """One run of a script; see ``parallax.init``."""

    def __init__(self, *, project: str, name: str, config: Mapping[str, Any], tags: list[str], run_key: str | None,
                 resume: str, mode: str, info: RankInfo):
        self.project, self.name, self.tags, self.mode, self.info = project, name, tags, mode, info
        self.config = Config(config)
        self.summary: dict[str, Any] = {}
        self.run_id: int | None = None  # the run's row in the database (online)
        self.offline_file: str | None = None
        self._key = run_key
        self._next_step = 0
        self._writer: BackgroundWriter | None = None
        self._sampler = None
        self._engine = None
        self._ended = False
        self._end_lock = threading.RLock()  # a signal handler may run end() while end() is entered
        if mode == "online":
            self._start_online(resume)
        elif mode == "offline" and info.is_main:
            self._start_offline()

    # --- what the script calls -------------------------------------------------------------

    @property
    def id(self) -> str:
        """The id to pass to ``init(id=..., resume="allow")`` to log on into this run."""
        if self._key is not None:
            return self._key
        return str(self.run_id) if self.run_id is not None else ""

    def log(self, data: Mapping[str, Any], step: int | None = None, commit: bool | None = None) -> None:
        """Record ``data`` ({name: number}) at ``step`` (the last step + 1 when left out). Costs the training
        thread microseconds: the values are written by a background thread."""
        if self._ended:
            raise RuntimeError("parallax.log after the run ended (finish was called); start another with parallax.init")
        if step is None:
            step = self._next_step
        if type(step) is not int or not 0 <= step <= MAX_STEP:  # refused here: a queued step must be one the database holds
            step = as_step(step)
        values = as_values(data)  # a refused value leaves the step count as it was
        if step >= self._next_step:
            self._next_step = step + 1
        self.summary.update(values)
        if self._writer is not None:
            self._writer.put((step, time.time(), values))

    def finish(self, exit_code: int = 0) -> None:
        """End the run: completed, or failed where ``exit_code`` is not 0. Waits for what was logged to be
        written (see ``PARALLAX_DB_LOCK_WAIT_S``); says in one line on stderr what could not be."""
        if exit_code:
            self.end("failed", f"the script finished with exit code {exit_code}")
        else:
            self.end("completed")

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.finish()
        elif issubclass(exc_type, SystemExit):  # sys.exit(0) inside the block is a success, as for the process
            reason = endings.exit_reason(exc.code if exc is not None else None)
            if reason is None:
                self.finish()
            else:
                self.end("failed", reason)
        elif issubclass(exc_type, KeyboardInterrupt):
            self.end("cancelled", "cancelled by KeyboardInterrupt (Ctrl-C)")
        else:
            self.end("failed", failure_text(exc_type, exc, tb))
        return False

    def __repr__(self) -> str:
        return f"parallax.Run(id={self.id!r}, name={self.name!r}, mode={self.mode!r})"

    # --- start -----------------------------------------------------------------------------

    def _start_online(self, resume: str) -> None:
        from db import make_engine, store
        from db import script_metrics as metrics

        self._engine = engine = make_engine()
        group = group_key(self.info)
        if self.info.is_main:
            started_at = self._create_or_resume(engine, resume, group)
            store.set_process(engine, self.run_id, pid=os.getpid(), host=socket.gethostname())
            from db.connection import lock_wait_s
            from parallax.sinks import DatabaseSink

            self._writer = BackgroundWriter(DatabaseSink(self, started_at), describe_error=describe_database_error,
                                            give_up_s=lock_wait_s())
            self._writer.start()
            last = metrics.last_logged_step(engine, self.run_id)
            self._next_step = 0 if last is None else last + 1
        else:
            started_at = self._join(engine, group)
        self._start_sampler(engine, started_at)

    def _create_or_resume(self, engine, resume: str, group: str) -> float:
        from db import script_metrics as metrics
        from db import store

        key = f"script:id:{self._key}" if self._key is not None else f"script:group:{group or os.urandom(8).hex()}"
        found = metrics.find_script_run(engine, key) if self._key is not None else None
        if found is None and self._key is not None and self._key.isdecimal():
            run = store.get_run(engine, int(self._key))
            found = {"id": run.id} if run is not None and run.kind == metrics.SCRIPT_KIND else None
        if found is not None and resume == "never":
            raise ValueError(f"parallax.init: a run with id {self._key!r} exists (run {found['id']}); pass "
                             "resume='allow' to log on into it, or give another id")
        if found is None and resume == "must":
            raise ValueError(f"parallax.init: no run with id {self._key!r} to resume (resume='must'); "
                             "resume='allow' starts it when it does not exist")
        script = {"file": storable_text(os.path.abspath(sys.argv[0])) if sys.argv and sys.argv[0] else "", "group": group}
        if found is None:
            self.run_id = metrics.create_script_run(engine, name=self.name, project=self.project, config=as_config(self.config),
                                                    key=key, tags=self.tags, world_size=self.info.world_size,
                                                    script=script)
            self.config.take_change()
        else:
            self.run_id = found["id"]
            if not metrics.reopen_script_run(engine, self.run_id):
                raise ValueError(f"parallax.init: run {self.run_id} (id {self._key!r}) is running now; a run is "
                                 "resumed once it has ended")
            metrics.set_script_key(engine, self.run_id, key=key, group=group, world_size=self.info.world_size)
            if self.config:  # what the script gives now joins what the run had
                stored = store.get_run(engine, self.run_id).config
                metrics.update_script_config(engine, self.run_id, {**stored, **as_config(self.config)})
            self.config.take_change()
        return store.get_run(engine, self.run_id).started_at.timestamp()

    def _join(self, engine, group: str) -> float:
        """Wait for rank 0's run of this job (``ranks``): running, beating since before this process began."""
        import psutil

        from db import script_metrics as metrics
        from contract.environment import seconds_from_env

        key = f"script:id:{self._key}" if self._key is not None else f"script:group:{group}"
        since = psutil.Process().create_time() - 60.0
        timeout_s = seconds_from_env(JOIN_TIMEOUT_ENV, DEFAULT_JOIN_TIMEOUT_S)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = metrics.find_script_run(engine, key)
            if (found is not None and found["status"] == "running" and found["heartbeat_at"] is not None
                    and found["heartbeat_at"].timestamp() >= since
                    and (found["measurements"].get("script") or {}).get("group") == group):
                self.run_id = found["id"]
                return found["started_at"].timestamp()
            time.sleep(0.2)
        raise TimeoutError(f"parallax.init on rank {self.info.rank}: rank 0's run did not appear within {timeout_s:g} s "
                           f"({JOIN_TIMEOUT_ENV}); every rank calls parallax.init, rank 0 too, with the same id")

    def _start_sampler(self, engine, started_at: float) -> None:
        from parallax.sinks import RankSampler

        self._sampler = RankSampler(engine, self.run_id, started_at, self.info)
        self._sampler.watch({self.info.rank: os.getpid()})
        self._sampler.start()

    def _start_offline(self) -> None:
        from parallax.offline import FileSink

        sink = FileSink.beside_script(self)
        self.offline_file = str(sink.path)
        self._writer = BackgroundWriter(sink)
        self._writer.start()
        print(f"parallax: offline run {self.name!r} is written to {sink.path}; `parallax sync {sink.path}` puts it "
              "in the database", file=sys.stderr, flush=True)

    # --- end -------------------------------------------------------------------------------

    def end(self, status: str, error: str | None = None, *, wait_s: float | None = None) -> None:
        """Write what is left and record how the run ended (rank 0; any rank records a failure). Once."""
        with self._end_lock:
            if self._ended:
                return
            self._ended = True
        endings.forget(self)
        from db.connection import lock_wait_s

        wait_s = lock_wait_s() if wait_s is None else wait_s
        unwritten, why = (0, None)
        if self._writer is not None:
            unwritten, why = self._writer.close(wait_s)
            if self.mode == "offline":
                self._writer.sink.finish(status, error)
        if self._sampler is not None:
            self._sampler.stop()
        if self.mode == "online" and self.run_id is not None:
            self._record_end(status, error, wait_s)
        if unwritten:
            where = f"run {self.run_id}" if self.run_id is not None else str(self.offline_file)
            print(f"parallax: {unwritten} logged values of {where} were not written: {why}", file=sys.stderr, flush=True)

    def _record_end(self, status: str, error: str | None, wait_s: float) -> None:
        from db import run_state, store
        from db import script_metrics as metrics
        from db.connection import retry_when_locked

        engine, run_id = self._engine, self.run_id
        try:
            if self.info.is_main:
                if (config := self.config.take_change()) is not None:  # changed since the writer's last turn
                    from db import script_metrics

                    retry_when_locked(lambda: script_metrics.update_script_config(engine, run_id, config),
                                      what="record the run's config", window_s=wait_s)
                summary = as_config({name: value for name, value in self.summary.items() if _is_json(value)})
                recorded = {"summary": summary}
                if self._writer is not None and self._writer.waits:
                    recorded[metrics.LOG_WAIT_KEY] = self._writer.wait_record()
                retry_when_locked(lambda: store.set_measurements(engine, run_id, recorded),
                                  what="record the run's summary", window_s=wait_s)
                retry_when_locked(lambda: run_state.finish(engine, run_id, status, error), what="record how the run ended",
                                  window_s=wait_s)
            elif status == "failed":
                retry_when_locked(lambda: run_state.finish(engine, run_id, status, f"rank {self.info.rank}: {error}"),
                                  what="record how the run ended", window_s=wait_s)
        except Exception as exc:
            print(f"parallax: could not record that run {run_id} ended {status}: {describe_database_error(exc)}",
                  file=sys.stderr, flush=True)


def describe_database_error(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    return f"{type(orig).__name__}: {str(orig).splitlines()[0] if str(orig) else ''}".strip()


def _is_json(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, (str, int, bool)) or value is None
