"""Take a run from queued to its end, and record how it ended.

    run_id, status = execute_run(RunConfig(strategy="ddp", devices=("cpu", "cpu")))   # foreground
    status = work(run_id)                                                             # launched supervisor

Checks that need the data or the model (``preflight``) run before a foreground run's row
exists, so a typo never leaves a failed run behind; a launched run (created by the dashboard
or ``launch``) runs them in its supervisor and records a failure as the run's error. Once a run
exists, every way it can end — completed, an exception in any rank, a rank killed by a signal,
cancel, Ctrl-C — is written to it, and metrics already written stay.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gc
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import socket
import sys
import time
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp

from db import run_state as state
from db import make_engine, store
from db.connection import (DatabaseFullError, DatabaseLockedError, DatabaseReadOnlyError, dispose_engines, lock_wait_s,
                       retry_when_locked)
from db.folders import named_run_folder, run_folder_name
from db.reserve import SpaceReserve
from contract.environment import database_url

from contract.checkpoint_file import DamagedFileError
from contract.config import ConfigError, RunConfig
from contract.model_source import ModelError, with_model_source
from contract.python_process import leave_without_shutdown
from trainer_backend.datasets.roots import check_under_roots
from contract.devices import cuda_indices
from trainer_backend.supervisor.liveness import ClaimedElsewhere, Heartbeat, RunCancelled, install_cancel_handler, wait_for_turn
from trainer_backend.supervisor.model_roots import check_model_allowed, check_model_args_allowed
from trainer_backend.telemetry.logguard import guard_output, reattach_deleted_log
from trainer_backend.supervisor.preflight import USER_ERRORS, announce, preflight, run_notes, with_oom_hint
from trainer_backend.supervisor.rank_server import start_rank_server
from trainer_backend.supervisor.stall import StallWatch
from contract.printable import one_line, printable_lines
from trainer_backend.telemetry.sampler import SystemSampler
from trainer_backend.rank.strategies import COLLECTIVE_TIMEOUT_ENV, collective_timeout
from trainer_backend.rank.divergence import TrainingDiverged
from trainer_backend.rank.loop import with_resolved_amp
from trainer_backend.rank.trainer import RankSpec, read_rank_failures
from trainer_backend.rank.trainer import main as train_rank
from trainer_backend.telemetry.recorder import Recorder, run_started_at_s

# Messages that say all there is to say: shown without a traceback.
PLAIN_ERRORS = (*USER_ERRORS, DatabaseLockedError)
PLAIN_FAILURE_TYPES = {DatabaseLockedError.__name__, DatabaseFullError.__name__, DatabaseReadOnlyError.__name__,
                       "DiskFullError", "UnwritableError", DamagedFileError.__name__}
# How long the last write of a run (how it ended) waits out a locked database: it matters most,
# and the supervisor has nothing else left to do.
FINAL_WRITE_WAIT_S = 60.0
# How long the other ranks of a failed run get to end on SIGTERM before SIGKILL.
RANK_STOP_GRACE_S = 3.0


def execute_run(config: RunConfig, *, db_url: str | None = None, echo: bool = True) -> tuple[int, str]:
    """Foreground run: preflight, create the run row, wait for its turn, train; (run_id, status)."""
    url = database_url(db_url)
    config = with_model_source(config)
    _fork_rank_server(config)
    info = preflight(config)
    engine = make_engine(url)
    notes = run_notes(config, info)
    run_id = store.create_run(engine, config.to_dict(), status="queued", notes=notes, world_size=config.world_size)
    store.set_process(engine, run_id, pid=os.getpid(), host=socket.gethostname())
    if echo:
        announce(run_id, config, info, notes)
    return run_id, _run_to_end(engine, run_id, url, config, echo=echo, needs_preflight=False)


def work(run_id: int, *, db_url: str | None = None, data_roots: list | None = None) -> str:
    """The body of a launched supervisor process: the run row exists and is queued. ``data_roots``
    (a run launched from the dashboard) confines its dataset to folders inside them, and its model to a timm
    name or one inside the model folders (model_roots.py)."""
    url = database_url(db_url)
    engine = make_engine(url)
    run = store.get_run(engine, run_id)
    if run is None:
        raise LookupError(f"no run with id {run_id}")
    config = RunConfig.from_dict(run.config)
    _fork_rank_server(config)  # before stdout is guarded: each rank guards its own
    # stdout and stderr are the run's log: a full disk there must not end the run.
    guard_output(on_failure=Recorder(engine, run_id).log_incomplete)
    if data_roots is not None:  # launched from the dashboard: its data and its model as the dashboard allows
        try:
            check_under_roots(config.dataset, data_roots)
            check_model_allowed(config.model)
            check_model_args_allowed(config.model, config.model_kwargs)
        except (ConfigError, ModelError) as exc:
            state.finish(engine, run_id, "failed", error=str(exc))
            return store.get_run(engine, run_id).status
    return _run_to_end(engine, run_id, url, config, echo=True, needs_preflight=True, data_roots=data_roots,
                       log_why=True)


def resolve_stored_amp(engine, run_id: int, config: RunConfig) -> RunConfig:
    """``config`` with ``--amp auto`` resolved from the weakest GPU it lists, written back to the
    run's row, so that every rank trains in the one dtype the run shows."""
    resolved = with_resolved_amp(config)
    if resolved != config:
        retry_when_locked(lambda: store.set_config(engine, run_id, resolved.to_dict()), what="record the run's AMP dtype")
    return resolved


def _run_to_end(engine, run_id: int, url: str, config: RunConfig, *, echo: bool, needs_preflight: bool,
                data_roots: list | None = None, log_why: bool = False) -> str:
    """Train the queued run ``run_id`` and record how it ended. ``log_why``: a run that did not
    complete prints why to its log first (a launched run's log is the one place the reason is
    kept if the database stays locked past the last write)."""
    install_cancel_handler()
    status, error = "failed", "the run ended before recording why"
    reserve = SpaceReserve(url, run_id).keep()  # room for the last write if the disk fills
    watch = StallWatch(engine, run_id, named_run_folder(run_folder_name(engine, run_id)), on_stall=config.on_stall)
    try:
        with Heartbeat(engine, run_id), watch:
            config = resolve_stored_amp(engine, run_id, config)  # before any rank starts, for every rank alike
            if not wait_for_turn(engine, run_id, echo=echo):
                status, error = "cancelled", "cancelled while queued"
            else:
                if needs_preflight:
                    info = preflight(config, data_roots)
                    notes = run_notes(config, info)
                    retry_when_locked(lambda: store.add_notes(engine, run_id, notes), what="record the run's notes")
                    if echo:
                        announce(run_id, config, info, notes)
                status, error = train_to_end(config, run_id, url, echo=echo, data_roots=data_roots)
    except ClaimedElsewhere as exc:
        # The run is another process's: its status and its end are that one's to record.
        status, error = None, str(exc)
        print(f"run_id={run_id}: {error}", file=sys.stderr, flush=True)
    except (RunCancelled, KeyboardInterrupt):
        status, error = "cancelled", "cancelled by the user"
    except PLAIN_ERRORS as exc:
        status, error = "failed", one_line(exc)  # one line by contract: a forged newline is escaped
    except Exception as exc:
        status, error = "failed", printable_lines(f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}")
    finally:
        if status == "cancelled" and watch.cancel_reason:
            error = watch.cancel_reason
        if log_why:  # a launched supervisor's last lines go where its ranks' went, if the run's folder was made again
            with contextlib.suppress(Exception):
                reattach_deleted_log(named_run_folder(run_folder_name(engine, run_id)) / "run.log")
        if status is not None and log_why and status != "completed":
            print(f"run_id={run_id} {status}: {error}", file=sys.stderr, flush=True)
        # A cancel that already ended the run stands. If even this write finds the database
        # locked for good, the process ends and readers mark the run lost.
        reserve.release()
        if status is not None:
            try:
                retry_when_locked(lambda: state.finish(engine, run_id, status, error=error),
                                  what=f"record that the run {status}", window_s=max(FINAL_WRITE_WAIT_S, lock_wait_s()))
            except DatabaseLockedError as exc:
                # The run's own reason (e.g. the database became read-only at epoch 3) says more than
                # this last write's failure; the caller prints it, and readers mark the run lost.
                raise type(exc)(error if status == "failed" and error else str(exc)) from exc
    return store.get_run(engine, run_id).status


def train_to_end(config: RunConfig, run_id: int, url: str, *, echo: bool = True,
                 data_roots: list | None = None) -> tuple[str, str | None]:
    """Train and translate how it ended into (status, error)."""
    engine = make_engine(url)
    folder_name = run_folder_name(engine, run_id)
    try:
        with SystemSampler(engine, run_id, run_started_at_s(engine, run_id), cuda_indices(config.devices)) as sampler:
            # Resumable: a checkpoint after every epoch, and a resumed run starts from the last one.
            spec = RankSpec(config, 0, run_id, url, echo=echo, folder_name=folder_name, data_roots=data_roots,
                            resumable=True)
            if config.world_size > 1:
                _spawn_ranks(spec, watch=sampler.watch)
            else:
                sampler.watch({0: os.getpid()})
                train_rank(spec)
        return "completed", None
    except (RunCancelled, KeyboardInterrupt):
        _stop_children()
        return "cancelled", "cancelled by the user"
    except RankFailure as exc:
        return "failed", with_oom_hint(printable_lines(exc))
    except PLAIN_ERRORS as exc:
        return "failed", one_line(exc)
    except Exception as exc:
        return "failed", with_oom_hint(printable_lines(f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}"))


# What the forkserver of CPU ranks imports where it is started afresh, not forked from this process
# (rank_server; multiprocessing skips a name it cannot import, silently).
RANK_PRELOAD = "trainer_backend.supervisor.preload"


def engine_forkserver() -> multiprocessing.context.BaseContext:
    """multiprocessing's forkserver context, a server it starts afresh importing the training code first
    (RANK_PRELOAD): a process forked from it (a rank, a DataLoader worker) is pickled to it as a
    spawned one is, but does not import torch, timm and the training code again (about 5 s of CPU). The
    server is one per process, started on first use and shared by all that use the forkserver in
    it; what it started with (the environment, umask, affinity, limits) is its children's."""
    multiprocessing.set_forkserver_preload([RANK_PRELOAD])  # read when the server starts
    return multiprocessing.get_context("forkserver")


def _rank_start_method(config: RunConfig) -> str | None:
    """How the ranks of ``config`` start: None for one process; CUDA ranks are spawned afresh, so
    that none can inherit a process whose imports touched the driver; CPU ranks are forked from a
    server that holds the imported engine (torch, timm), instead of each importing it again (about
    3 s of CPU per rank): this process's fork where it could be taken (_fork_rank_server), else a
    new server that imports the training code (RANK_PRELOAD)."""
    if config.world_size == 1:
        return None
    return "spawn" if cuda_indices(config.devices) else "forkserver"


def _fork_rank_server(config: RunConfig) -> int | None:
    """For a run of CPU ranks, fork the server of its ranks now, while this process has imported the
    engine and has neither started a thread nor run an operator (rank_server); the server's pid, or
    None. The database connections are closed just before: the server and its ranks must not
    inherit an open database."""
    if _rank_start_method(config) != "forkserver":
        return None
    return start_rank_server(before_fork=lambda: dispose_engines(forget=False))


class RankFailure(Exception):
    """A rank of a multi-process run failed; the message names the rank that failed first."""


def _spawn_ranks(spec: RankSpec, watch=None) -> None:
    """Start one process per rank of ``spec.config`` (each with ``spec``, its own rank in it) and
    wait for them; a rank that fails stops the others and raises RankFailure."""
    config = spec.config
    collective_timeout()  # a bad PARALLAX_COLLECTIVE_TIMEOUT_S is refused here, in one line
    # The run's own rendezvous store on an OS-chosen port, held by this process for the whole
    # run, so two runs started at the same moment can never pick the same port.
    store_server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(minutes=10), wait_for_workers=False)
    start_method = _rank_start_method(config)
    if start_method == "forkserver":  # used where this process has forked no server of its own
        engine_forkserver()
    spec = dataclasses.replace(spec, store_host="127.0.0.1", store_port=store_server.port)
    context = mp.start_processes(
        _rank_main,
        args=(dict(os.environ), spec),
        nprocs=config.world_size,
        join=False,
        start_method=start_method,
    )
    if watch is not None:  # the system sampler follows each rank (and its DataLoader workers)
        watch({rank: process.pid for rank, process in enumerate(context.processes)})
    try:
        first = _first_failed_rank(context.processes)
        if first is not None:
            # Stopped here rather than by torch's join(), which waits 30 s for a rank that does
            # not act on SIGTERM (one stopped by SIGSTOP) and then SIGKILLs it: the run would end
            # late, and that SIGKILL would read as the cause. What this process ends is known.
            stopped = _stop_ranks(context.processes)
            raise RankFailure(_root_cause(context, named_run_folder(spec.folder_name), first, stopped))
    finally:
        del store_server


def _rank_main(rank: int, environ: dict, spec: RankSpec) -> None:
    """One rank: train, then leave without interpreter shutdown; the runner waits for every rank
    to exit. ``environ`` is the runner's environment when it started the ranks: a forked CPU rank
    would otherwise see the environment its server started with (the first run of the process).

    A rank that trained to the end has recorded all it has to, and leaves without interpreter
    shutdown (python_process.leave_without_shutdown says why). A rank that failed raises as before,
    so spawn reports its traceback."""
    if environ != os.environ:
        os.environ.clear()
        os.environ.update(environ)
    try:
        train_rank(dataclasses.replace(spec, rank=rank))
    except BaseException:
        gc.freeze()
        raise
    leave_without_shutdown(0)


def _first_failed_rank(processes) -> int | None:
    """Wait for the ranks to end; the first one seen ending badly, or None if every rank exits 0."""
    waiting = {process.sentinel: rank for rank, process in enumerate(processes)}
    while waiting:
        for sentinel in multiprocessing.connection.wait(list(waiting)):
            rank = waiting.pop(sentinel)
            processes[rank].join()
            if processes[rank].exitcode != 0:
                return rank
    return None


def _stop_ranks(processes, grace_s: float = RANK_STOP_GRACE_S) -> set[int]:
    """End the ranks still alive (SIGTERM, then SIGKILL after ``grace_s``); returns their ranks.
    SIGCONT goes with SIGTERM: a stopped process acts on no signal but SIGKILL until continued."""
    alive = {rank for rank, process in enumerate(processes) if process.is_alive()}
    for rank in alive:
        for signum in (signal.SIGTERM, signal.SIGCONT):
            try:
                os.kill(processes[rank].pid, signum)
            except ProcessLookupError:
                break
    deadline = time.monotonic() + grace_s
    for rank in alive:
        processes[rank].join(max(0.0, deadline - time.monotonic()))
    for rank in alive:
        if processes[rank].is_alive():
            processes[rank].kill()
        processes[rank].join()
    return alive


def _killed_by(rank: int, signum: int) -> str:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    message = f"rank {rank} was killed by signal {name}; the other ranks were stopped"
    if signum == signal.SIGABRT:
        # NCCL's watchdog tears down a rank whose collective outlived the timeout
        # (TORCH_NCCL_ASYNC_ERROR_HANDLING); its log line names the collective.
        message += (f" (on GPUs this is how NCCL ends a rank whose collective waited longer than "
                    f"{COLLECTIVE_TIMEOUT_ENV}; see the log)")
    return message


def _root_cause(context, folder, first: int, stopped: set[int]) -> str:
    """Why the run failed. ``first`` is the first rank seen ending badly, often one that failed only
    because its peer vanished mid-collective; ``stopped``: the ranks this process ended after it,
    whose signals say nothing about the cause."""
    first_code = context.processes[first].exitcode
    if first_code < 0:
        return _killed_by(first, -first_code)
    failures = read_rank_failures(folder)
    failed = {f["rank"] for f in failures}
    # A rank killed from outside (SIGKILL from the OOM killer, a crash) leaves no traceback;
    # its peers then raise mid-collective.
    for rank, process in enumerate(context.processes):
        code = process.exitcode
        if code is not None and code < 0 and rank not in stopped and rank not in failed:
            return _killed_by(rank, -code)
    if failures:
        first_failure = min(failures, key=lambda f: f["time"])
        if _is_collective_timeout(first_failure):
            return _collective_timeout_message(first_failure, failed, len(context.processes))
        if first_failure.get("type") == TrainingDiverged.__name__:  # one verdict every rank reached together
            return one_line(first_failure["message"])
        if first_failure.get("type") in PLAIN_FAILURE_TYPES:  # its message says all: no traceback
            return f"rank {first_failure['rank']}: {one_line(first_failure['message'])}"
        return (f"rank {first_failure['rank']} raised an exception: {_last_line(first_failure['traceback'])}\n"
                f"{first_failure['traceback']}")
    error_file = context.error_files[first]  # torch's note of the exception that ended the rank
    if not os.access(error_file, os.R_OK):
        return f"rank {first} exited with code {first_code}; the other ranks were stopped"
    with open(error_file, "rb") as handle:
        details = _strip_spawn_banner(pickle.load(handle))
    return f"rank {first} raised an exception: {_last_line(details)}\n{details}"


def _last_line(traceback_text: str) -> str:
    """The exception line of a traceback: the headline a user reads first (e.g. the disk is full)."""
    lines = [line for line in traceback_text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _is_collective_timeout(failure: dict) -> bool:
    # gloo: "Timed out waiting 5000ms for recv operation to complete", or, towards a peer that is
    # stopped (SIGSTOP) rather than gone, "Application timeout caused pair closure"; NCCL with
    # blocking wait: "... Watchdog caught collective operation timeout".
    text = (failure.get("message") or failure["traceback"]).lower()
    return any(words in text for words in ("timed out waiting", "application timeout caused pair closure",
                                           "collective operation timeout"))


def _collective_timeout_message(first: dict, failed: set[int], world_size: int) -> str:
    """Name the ranks that never reached the collective: those that did not time out themselves
    (with two ranks, exactly the other one)."""
    missing = [rank for rank in range(world_size) if rank not in failed]
    who = (f"rank {missing[0]}" if len(missing) == 1 else f"ranks {', '.join(map(str, missing))}") if missing else "a rank"
    timeout_s = collective_timeout().total_seconds()
    return (f"collective timeout: {who} did not arrive at a collective within {timeout_s:g} s "
            f"({COLLECTIVE_TIMEOUT_ENV}); rank {first['rank']} stopped waiting and every rank was stopped. "
            f"A rank that hangs (a deadlock, a stuck data loader, a stalled device) causes this.\n\n"
            f"rank {first['rank']}: {first['traceback']}")


def _stop_children(grace_s: float = 3.0) -> None:
    """End the ranks this process spawned (a cancel must leave no process behind)."""
    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(grace_s)
        if child.is_alive():
            child.kill()


def _strip_spawn_banner(text: str) -> str:
    marker = "terminated with the following error:\n"
    return text.split(marker, 1)[1] if marker in text else text
