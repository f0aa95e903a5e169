"""Background runs: launch, queue and cancel them (the supervisor's side, its turn and heartbeat: supervisor.liveness).

    run_id = launch(RunConfig(strategy="ddp", devices=("cpu", "cpu")))   # returns at once
    cancel(run_id)                                                      # ends every process of it

A launched run is a detached supervisor (``python -m trainer_backend supervisor N``) in its own session
and process group, so it outlives the browser tab, a Streamlit rerun and the dashboard itself,
and one signal to the group reaches every DDP rank and data-loader worker. Its output goes to
``run.log`` in the run's folder (``db.folders.run_folder``). This module imports neither torch nor streamlit: the
dashboard calls it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from db import run_state as state
from db import make_engine, store
from db.connection import absolute_database_url, lock_wait_s
from db.folders import run_folder
from contract.environment import database_url, parallax_home

from contract.config import STRATEGIES, ConfigError, RunConfig, max_cpu_processes
from contract.model_source import with_model_source
from contract.strategy_specs import find
from contract.user_paths import with_absolute_paths
from trainer_backend.datasets.roots import check_under_roots
from contract.python_process import python_command
from contract.checkpoint_file import DAMAGED_POINT_ADVICE, DamagedFileError, checkpoint_problem
from contract.storage import RESUME_FILE, write_problem
from trainer_backend.supervisor.liveness import cpu_run_slots
from trainer_backend.supervisor.model_roots import check_model_allowed, check_model_args_allowed

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the folder holding trainer_backend
CANCEL_GRACE_S = 6.0


class CancelNotDelivered(ValueError):
    """The run is marked cancelled, but its process could not be signalled from here (another
    user's process): the message says what happens next."""


def check_environment() -> None:
    """Read every PARALLAX_* number a run will read, so that a bad one is refused in one line
    before a run is recorded, not in the supervisor after."""
    from trainer_backend.datasets.limits import max_decoded_bytes, max_images
    from trainer_backend.telemetry.sampler import sample_interval_s, step_point_s

    cpu_run_slots()
    sample_interval_s()
    step_point_s()
    lock_wait_s()
    max_images()
    max_decoded_bytes()
    max_cpu_processes()


def log_path(engine, run_id: int) -> Path:
    return run_folder(engine, run_id, create=True) / "run.log"


def launch(config: RunConfig, *, db_url: str | None = None, sweep_id: int | None = None,
           data_roots: list[Path] | None = None, search_trial: tuple[int, int] | None = None) -> int:
    """Record the run as queued and start its detached supervisor; returns the run id at once.

    With ``data_roots`` (the dashboard passes them) a dataset folder outside them, or a model of your own
    outside the model folders (supervisor/model_roots.py), is refused here, and the supervisor checks again before
    it reads any data or imports any model. The supervisor's command line is
    an argv list holding only the run id and these paths: no config value ever reaches a shell.

    The supervisor runs in the project's folder: a relative SQLite file, data root, dataset folder or model
    file is made absolute here, where the caller meant it, before anything checks it. ``search_trial``: (search
    id, trial number) of a search's trial, recorded with the run."""
    check_environment()
    config = with_absolute_paths(config)
    if data_roots is not None:
        data_roots = [Path(os.path.abspath(os.path.expanduser(root))) for root in data_roots]
        check_dashboard_bounds(config.dataset, config.model, config.model_args, data_roots)
    if config.where == "slurm":
        from trainer_backend.control.slurm_job import submit

        return submit(config, db_url=db_url, sweep_id=sweep_id, search_trial=search_trial)
    config = with_model_source(config)
    url = absolute_database_url(database_url(db_url))
    engine = make_engine(url)
    run_id = store.create_run(engine, config.to_dict(), status="queued", world_size=config.world_size,
                              sweep_id=sweep_id, search_trial=search_trial)
    start_supervisor(engine, url, run_id, data_roots)
    return run_id


def check_dashboard_bounds(dataset: str, model: str, model_args: str, data_roots: list[Path]) -> None:
    """What the dashboard may train: a dataset inside the data roots, and a timm model (with no argument that
    loads or downloads files) or one of your own inside the model folders; ConfigError or ModelError in one
    line saying how to allow it otherwise."""
    check_under_roots(dataset, data_roots)
    check_model_allowed(model)
    check_model_args_allowed(model, model_args)


def start_supervisor(engine, url: str, run_id: int, data_roots: list[Path] | None = None) -> None:
    """Start the detached supervisor of the queued run ``run_id``, its output appended to the run's log."""
    # The database URL travels in the environment, not in argv, where ps would show its password.
    env = {**os.environ, "PARALLAX_HOME": str(parallax_home()), "PYTHONUNBUFFERED": "1", "PARALLAX_DB_URL": url,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
    # A launched run shares the machine with the dashboard, the browser and other runs. Idle
    # OpenMP threads that spin then starve the threads doing work (resnet18 on 2 cores with
    # another process busy: 32-34 images/s spinning, 232-251 sleeping); on an idle machine
    # spinning is 10-15 % faster. So launched runs sleep and foreground `run` keeps PyTorch's
    # default, like a hand-written script. A value the user set wins; ranks inherit it.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        log = open(log_path(engine, run_id), "ab")
    except OSError as exc:  # a read-only or full PARALLAX_HOME: the run ends with the reason, in one line
        problem = write_problem(exc, "the run's log", run_folder(engine, run_id) / "run.log")
        state.finish(engine, run_id, "failed", error=str(problem))
        raise problem from None
    with log:
        process = subprocess.Popen(
            python_command("-m", "trainer_backend", "supervisor", str(run_id),
                           *(["--data-roots", os.pathsep.join(str(r) for r in data_roots)] if data_roots is not None else [])),
            cwd=PROJECT_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: survives us, and cancel reaches all of it
        )
    store.set_process(engine, run_id, pid=process.pid, host=socket.gethostname())
    # Reap the supervisor when it ends, so a long-lived launcher (the dashboard) holds no zombies.
    threading.Thread(target=process.wait, name=f"reap-run-{run_id}", daemon=True).start()


def resume(run_id: int, *, db_url: str | None = None, data_roots: list[Path] | None = None,
           devices: str | None = None) -> int:
    """Continue the failed, cancelled or lost run ``run_id`` from its last finished epoch, as the same run:
    queued again, then trained by a new detached supervisor from its resume point (rank/resume.py). Refuses in
    one line a run that is not one of those, or that has no resume point (it ended before its first epoch).

    ``devices`` moves it to other devices where its strategy allows: the point holds the whole model and
    optimizer state (FSDP's gathered), so a data-parallel run takes any number; a staged one (mp, pp) keeps
    its count, since its point holds one part per stage."""
    check_environment()
    url = absolute_database_url(database_url(db_url))
    engine = make_engine(url)
    run = store.get_run(engine, run_id)
    if run is None:
        raise LookupError(f"no run with id {run_id}")
    if run.status not in state.RESUMABLE_ENDS:
        raise ValueError(f"run {run_id} is {run.status}: only a {', '.join(state.RESUMABLE_ENDS)} run can be resumed")
    if data_roots is not None:  # from the dashboard: the run may have been launched on the command line
        stored = run.config or {}
        check_dashboard_bounds(str(stored.get("dataset", "")), str(stored.get("model", "")),
                               str(stored.get("model_args") or "{}"), data_roots)
    point = run_folder(engine, run_id) / RESUME_FILE
    if not point.is_file():
        raise ValueError(f"run {run_id} has no resume point ({point} is missing): it ended before its first epoch "
                         "finished; launch it again instead")
    moved = _moved(run_id, run.config, devices) if devices is not None else None
    damage = checkpoint_problem(point)  # refused here, before the run is queued again, not by its ranks
    if damage is not None:
        raise DamagedFileError(f"run {run_id}'s resume point {point} {damage}: {DAMAGED_POINT_ADVICE}")
    if not state.reopen(engine, run_id):
        raise ValueError(f"run {run_id} changed while it was being resumed (now {store.get_run(engine, run_id).status})")
    if moved is not None:
        store.set_config(engine, run_id, moved.to_dict(), world_size=moved.world_size)
        store.add_notes(engine, run_id, [f"Resumed on {','.join(moved.devices)} (trained on "
                                         f"{','.join(run.config.get('devices', []))} before)."])
    if (run.config or {}).get("where") == "slurm":
        from trainer_backend.control.slurm_job import resubmit

        resubmit(engine, url, run_id)  # the same script, a new job; it resumes from the resume point
        return run_id
    start_supervisor(engine, url, run_id, data_roots)
    return run_id


def _moved(run_id: int, config: dict, devices: str) -> RunConfig:
    """The run's config on ``devices``, refused in one line where its strategy cannot carry its state there."""
    before = RunConfig.from_dict(config)
    after = before.replace(devices=devices)  # the strategy's own rules for its devices apply
    if find(after.strategy).staged and len(after.devices) != len(before.devices):
        raise ConfigError("devices", f"devices {','.join(after.devices)} are not allowed for resuming run {run_id}: "
                          f"a {after.strategy} run resumes on as many devices as it has stages "
                          f"({len(before.devices)})")
    return after


def parse_device_counts(text: str | None) -> tuple[int, ...] | None:
    """'1,2,4' -> (1, 2, 4), refusing in one line anything but whole numbers from 1 up."""
    if text is None:
        return None
    counts = []
    for item in (part.strip() for part in str(text).split(",")):
        if not item.isdigit() or int(item) < 1:
            raise ConfigError("device_counts", f"--device-counts {text!r} is not allowed: give whole numbers of "
                              "devices from 1 up, comma-separated, e.g. 1,2,4")
        counts.append(int(item))
    return tuple(sorted(set(counts)))


def _devices_for(config: RunConfig, strategy: str, n: int) -> tuple[str, ...]:
    if not config.uses_cuda:
        limit = max_cpu_processes()
        if n > limit:
            raise ConfigError("device_counts", f"--device-counts {n} is not allowed: this machine runs at most "
                              f"{limit} CPU processes per run (max_cpu_processes; PARALLAX_MAX_CPU_PROCESSES "
                              f"sets another limit): use counts up to {limit}")
        return ("cpu",) * n
    if n > len(config.devices):
        raise ConfigError("device_counts", f"--device-counts {n} is not allowed for {strategy}: --devices lists "
                          f"{len(config.devices)} GPU(s) ({','.join(config.devices)}); list at least {n}")
    return config.devices[:n]


def sweep_configs(config: RunConfig, strategies: list[str],
                  device_counts: tuple[int, ...] | None = None) -> list[RunConfig]:
    """One config per strategy, on the devices that strategy uses: ``single`` takes the first,
    DataParallel on CPU one CPU, the others all. With ``device_counts`` each multi-device strategy
    runs once per count (on CPU the device list repeats ``cpu``; on GPUs the first N of ``devices``):
    single (and DataParallel on CPU) once on one device, MP and PP only at 2 or more. Every one is
    validated before any is launched."""
    if not strategies:
        raise ConfigError("strategy", "a sweep needs at least one strategy, e.g. single,ddp,mp,pp")
    if device_counts is not None and not device_counts:
        raise ConfigError("device_counts", "--device-counts lists no count: give e.g. 1,2,4")
    configs = []
    for strategy in dict.fromkeys(strategies):
        known = find(strategy)
        if known is None:
            raise ConfigError("strategy", f"strategy {strategy!r} is not allowed: choose from {', '.join(STRATEGIES)}")
        # DataParallel on CPU is a pass-through: one process on one CPU, as single.
        one_device = known.one_device or (known.scatters_batch and not config.uses_cuda)
        if device_counts is None:
            configs.append(config.replace(strategy=strategy, devices=config.devices[:1] if one_device else config.devices))
            continue
        counts = [1] if one_device else [n for n in device_counts if n >= 2 or not known.staged]
        if not counts:
            raise ConfigError("device_counts", f"--device-counts {','.join(map(str, device_counts))} gives "
                              f"{strategy} no count it can run: it needs 2 or more devices")
        configs += [config.replace(strategy=strategy, devices=_devices_for(config, strategy, n)) for n in counts]
    return configs


def launch_sweep(config: RunConfig, strategies: list[str], *, db_url: str | None = None,
                 data_roots: list[Path] | None = None,
                 device_counts: tuple[int, ...] | None = None) -> tuple[int, list[int]]:
    """Launch one run per strategy (and device count) of ``config`` as a sweep; they queue one after another."""
    config = with_absolute_paths(config)
    configs = sweep_configs(config, strategies, device_counts)
    if data_roots is not None:
        check_dashboard_bounds(config.dataset, config.model, config.model_args, data_roots)
    engine = make_engine(db_url)
    if config.where == "slurm":  # one job array, a task per run
        from trainer_backend.control.slurm_job import check_database_reachable, check_world, submit_array

        for each in configs:
            check_world(each)
        check_database_reachable(absolute_database_url(database_url(db_url)))
        sweep_id = store.create_sweep(engine, config.to_dict(), [c.strategy for c in configs])
        return sweep_id, submit_array(configs, db_url=db_url, sweep_id=sweep_id,
                                      array_limit=config.slurm_array_limit)
    sweep_id = store.create_sweep(engine, config.to_dict(), [c.strategy for c in configs])
    return sweep_id, [launch(c, db_url=db_url, sweep_id=sweep_id, data_roots=data_roots) for c in configs]


def proc_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, fields of /proc/PID/stat after the name) for every process (Linux): state, ppid,
    pgrp, ... utime and stime are fields 11 and 12 of the list. Processes that end meanwhile are skipped."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            yield int(entry.name), (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    return [pid for pid, fields in proc_stats() if int(fields[2]) == pgid and fields[0] not in ("Z", "X")]


def cancel(run_id: int, *, db_url: str | None = None, grace_s: float = CANCEL_GRACE_S) -> str:
    """Stop the run and every process it started; returns its final status.

    SIGTERM first (the supervisor records 'cancelled' and stops its ranks), SIGKILL to whatever is
    left after ``grace_s``, so a run hung in a collective still ends within seconds. A process that
    is gone, or whose pid now belongs to another process (``is_run_process``), is not signalled; one of another user
    raises CancelNotDelivered (the run is marked cancelled all the same, and stops itself at its
    next heartbeat)."""
    return _end_early(run_id, "cancelled", "cancelled by the user", db_url=db_url, grace_s=grace_s)


def prune(run_id: int, reason: str, *, db_url: str | None = None, grace_s: float = CANCEL_GRACE_S) -> str:
    """End the trial run ``run_id`` as ``pruned`` (its search's pruner judged it hopeless; ``reason`` says why),
    every process of it stopped as ``cancel`` stops them and every epoch it recorded kept; returns its final
    status (the end it had reached first, where it ended meanwhile)."""
    return _end_early(run_id, "pruned", reason, db_url=db_url, grace_s=grace_s)


def _end_early(run_id: int, status: str, reason: str, *, db_url: str | None, grace_s: float) -> str:
    engine = make_engine(db_url)
    run = store.get_run(engine, run_id)
    if run is None:
        raise LookupError(f"no run with id {run_id}")
    if run.status not in state.ACTIVE_STATUSES:
        return run.status
    if (run.config or {}).get("where") == "slurm":
        from trainer_backend.control.slurm_job import cancel_job

        state.finish(engine, run_id, status, error=reason)
        cancel_job(engine, run)
        return store.get_run(engine, run_id).status
    # Marked before the signal: the run's own process then records nothing over it, and a
    # torchrun job tells this cancel from torchrun's own SIGTERM (and does not resume it).
    if state.finish(engine, run_id, status, error=reason) and run.pid and run.host == socket.gethostname():
        try:
            if is_run_process(run.pid, run_id, run.measurements.get(state.PROCESS_START_KEY)):
                _signal_run(run.pid, grace_s)
        except PermissionError:
            raise CancelNotDelivered(
                f"run {run_id} is marked cancelled, but its process {run.pid} belongs to another user and cannot be "
                f"signalled from here: it stops itself within {state.HEARTBEAT_INTERVAL_S:g} s if it still trains; "
                "otherwise ask its owner (or root) to end it"
            ) from None
    return store.get_run(engine, run_id).status


def is_run_process(pid: int, run_id: int, recorded_start: str | None) -> bool:
    """Whether ``pid`` is still run ``run_id``'s own process. A pid a run recorded is reused once
    that process ends, possibly by another run's supervisor, which a cancel must not signal: the
    process must be the one that started when the pid was recorded (``state.process_start``).
    For a run recorded without that, its command line must run Parallax's trainer and, for a
    launched supervisor, this very run. True where /proc cannot tell."""
    same = state.is_same_process(pid, recorded_start)
    if same is not None:
        return same
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return False
    except OSError:
        return True
    if not any(part.startswith(b"trainer_backend") or b"trainer_backend/" in part for part in command):
        return False
    if b"supervisor" in command:  # python -m trainer_backend supervisor N ...
        after = command[command.index(b"supervisor") + 1:]
        return bool(after) and after[0] == str(run_id).encode()
    return True


def _signal_run(pid: int, grace_s: float) -> None:
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return
    # A launched supervisor leads its own group; a foreground `run` shares its shell's group, so
    # only its own pid is signalled and it stops its ranks itself.
    own_group = pgid == pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM) if own_group else os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        alive = group_members(pgid) if own_group else ([pid] if state.process_alive(pid) else [])
        if not alive:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL) if own_group else os.kill(pid, signal.SIGKILL)
