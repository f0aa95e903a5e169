"""Join the world torchrun started instead of spawning one: runs across machines.

    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint node0:29400 --rdzv-id exp-1 \\
        -m trainer_backend run --strategy ddp --devices cuda --model resnet50 --epochs 10

Every process torchrun starts runs ``python -m trainer_backend run``. Under ddp, fsdp and pp each
joins torchrun's world (``init_process_group`` by ``env://``) on ``cuda:LOCAL_RANK``, or on the CPU
with ``cores // LOCAL_WORLD_SIZE`` threads, and trains its part with the same per-rank code as a
spawned run (``trainer.main``), so the metrics are the same global ones. The world comes
from torchrun; ``--devices`` only says which kind of device. Global rank 0 alone writes the
database: one run for the whole job with its world size, machines and their hosts, and torchrun's
job id (``--rdzv-id``), by which a job restarted under ``--max-restarts N`` finds its run again and
resumes it from the last finished epoch (``resume``). A new job (its first attempt) always starts a
run of its own, even under a job id and training used before (the default id is "none"), unless
``--resume-job`` asks it to take over that earlier run where it was lost or failed. While it trains,
every machine is sampled as a spawned run's main process samples its own (``sampler``): the host's
CPU and memory, the processes of the ranks on that machine and their GPUs. The process of local
rank 0 samples each machine; the other machines' samples reach rank 0, which writes them, through
torchrun's store (``machine_samples``). It meters each machine's energy too, and rank 0 sums the
machines' joules once per epoch (``job_energy``).

A Slurm job of single, dp or mp has one task and no torchrun (control/slurm_job.py): its process is rank 0 of a
world of one (``run_one_task_job``), and takes over, trains and records its run as a ddp job's rank 0 does.

Reading torchrun's environment (``world``) imports nothing heavy; this module, which trains, is
imported only once a process is known to join.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import socket
import sys
import time
import traceback
import uuid
from typing import NamedTuple

import torch
import torch.distributed as dist

from db import elastic, make_engine, store
from db import run_state as state
from db.folders import named_run_folder, run_folder, run_folder_name
from contract.environment import database_url

from contract.config import ConfigError, RunConfig
from contract.devices import cuda_indices
from trainer_backend.telemetry.job_energy import EnergyPart
from trainer_backend.supervisor.liveness import Heartbeat, RunCancelled, install_cancel_handler, raise_cancelled
from trainer_backend.telemetry.machine_samples import StoreDrain, StorePusher, sample_store
from trainer_backend.supervisor.preflight import USER_ERRORS, announce, preflight, run_notes, with_oom_hint
from trainer_backend.telemetry.sampler import SystemSampler
from trainer_backend.rank.strategies import collective_timeout
from trainer_backend.rank.divergence import TrainingDiverged
from trainer_backend.rank.loop import with_resolved_amp
from trainer_backend.rank.trainer import RankSpec, load_data, read_rank_failures
from trainer_backend.rank.trainer import main as train_rank
from trainer_backend.rank.stopping import (StoppedAtStep, stop_escalating, stop_on_sigterm,
                                             stop_taken, when_blocked)
from trainer_backend.telemetry.recorder import run_started_at_s
from contract.world import (SUBMITTED_RUN_ENV, TorchrunWorld, check_joinable, joined_config, local_device, refuse,
                            world_note)

STOPPED_EXIT = 1  # a process told to stop (rank/stopping.py): not 0, so that torchrun may restart the job


class Member(NamedTuple):
    """What each process of the world tells the others when it joins."""

    host: str
    node: int
    device: str
    restarts: int
    pid: int
    capability: tuple[int, int] | None = None  # its GPU's compute capability; None on the CPU


def run_in_world(config: RunConfig, world: TorchrunWorld, *, db_url: str | None = None, echo: bool = True,
                 resume_job: bool = False) -> int:
    """Join torchrun's world and train this process's part of the job; returns the exit code."""
    try:
        check_joinable(config.strategy, world)
        device = local_device(config, world)
    except ConfigError as exc:
        return refuse(world, exc)
    if submitted_run_id() is not None:
        # Slurm's SIGTERM (a preemption or a requeue) reaches every process: each asks for a stop at a step
        # (rank/stopping.py), and ends as before where none comes in time.
        stop_on_sigterm(raise_cancelled if world.rank == 0 else None)
    elif world.rank == 0:
        install_cancel_handler()  # a cancel from the dashboard or `cancel` reaches rank 0
    try:
        return _join(config, world, device, db_url, echo, resume_job)
    except (RunCancelled, KeyboardInterrupt):
        return 1  # torchrun (or the user) stopped the job before this run existed


def _join(config: RunConfig, world: TorchrunWorld, device: str, db_url: str | None, echo: bool, resume_job: bool) -> int:
    timeout = collective_timeout()
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    # The store the processes meet at: torchrun's agent's, or else one that rank 0 serves, as
    # env:// would. It is held here to the end, not by the process group alone: training's
    # teardown destroys the group, and the other machines' last system samples reach rank 0
    # through this store after that (machine_samples).
    served_by_rank0 = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world.world_size,
                          is_master=served_by_rank0 and world.rank == 0, timeout=timeout, multi_tenant=True)
    # The agent's store outlives a restart, with the last attempt's keys in it; taken as they
    # are, the processes of a restarted job meet stale peers and hang (pytorch#135712).
    # Each attempt keeps to keys of its own. A store rank 0 serves is new with every attempt, and
    # takes no prefix: each machine counts its restarts, so after a restart one machine alone
    # counted, prefixes from those counts would differ and the processes would never meet.
    group_store = store if served_by_rank0 else dist.PrefixStore(f"parallax/attempt-{world.restart_count}", store)
    # Bound to cuda:LOCAL_RANK, as a ProcessGroup binds its ranks (strategies/process_group.py says why).
    dist.init_process_group(backend, store=group_store, rank=world.rank, world_size=world.world_size, timeout=timeout,
                            device_id=torch.device(device) if device.startswith("cuda") else None)
    try:
        members: list = [None] * world.world_size
        # Each pid rides along with what every process tells the others anyway, labelled with its
        # global rank: each machine's sampler follows the processes of its machine by them. (Finding them
        # as the children of torchrun's agent would need each one's rank read from its environment.)
        capability = tuple(torch.cuda.get_device_capability(device)) if device.startswith("cuda") else None
        dist.all_gather_object(members, Member(socket.gethostname(), world.node_rank, device, world.restart_count,
                                               os.getpid(), capability))
        by_node = {m.node: m.host for m in members}
        hosts = [by_node[node] for node in sorted(by_node)]
        # Each machine's agent counts restarts of its own, so any count above 0 means a restart.
        restarted = any(m.restarts > 0 for m in members)
        try:
            joined = joined_config(config, [m.device for m in members], nodes=len(hosts))
            # --amp auto from the weakest GPU of every machine, the same answer in every process.
            joined = with_resolved_amp(joined, [m.capability for m in members if m.capability is not None])
        except ConfigError as exc:
            return refuse(world, exc)  # every process reaches the same verdict
        url = database_url(db_url)
        sampling = Sampling(world.node_rank, members)
        if world.rank == 0:
            return _lead(joined, world, hosts, url, echo, restarted, resume_job, sampling, group_store)
        return _follow(joined, world, url, resume_job, sampling, group_store)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class Decision(NamedTuple):
    """What rank 0 tells every process to do: "train" run ``run_id``, or "stop" with exit ``code``.

    ``folder_name`` comes from rank 0, the one process that opens the database: a machine of the
    job that has no copy of it still keys its files alike. ``attempt`` names this attempt's keys
    in torchrun's store for the other machines' system samples (``machine_samples``): new for every
    attempt, since restart counts are per machine and two attempts could share one."""

    action: str
    run_id: int | None
    code: int = 0
    folder_name: str | None = None
    attempt: str | None = None


# Rank 0 decides after its preflight, which builds the dataset cache: a large folder takes longer
# than any collective may wait. The others wait for this key in the store, not in a collective;
# should rank 0 die meanwhile, torchrun ends the job (or its store goes with it), ending this wait.
# Each other machine's local rank 0 builds that machine's cache meanwhile, and rank 0 waits for
# its key (DATA_READY_KEY/<node>) alike before it tells the processes to train.
DECIDED_KEY = "parallax/decided"
DATA_READY_KEY = "parallax/data-ready"
DECISION_WAIT = datetime.timedelta(days=7)
ATTEMPT_ENDED_KEY = "parallax/attempt-ended"
ATTEMPT_ENDED_WAIT = datetime.timedelta(minutes=10)  # rank 0 writing a large point on a slow disk


def _tell(decision: Decision | None, store) -> Decision:
    """Rank 0 tells every process its ``Decision``; every other process passes None and gets it."""
    if dist.get_rank() == 0:
        store.set(DECIDED_KEY, "1")
    else:
        store.wait([DECIDED_KEY], DECISION_WAIT)
    holder = [decision]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def _follow(joined: RunConfig, world: TorchrunWorld, url: str, resume_job: bool, sampling: Sampling, group_store) -> int:
    if world.local_rank == 0 and sampling.remote:
        try:
            load_data(joined)  # this machine's dataset cache, built before any collective waits on it
        finally:  # a failure here ends this process, and torchrun the job; rank 0 must not wait for it
            group_store.set(f"{DATA_READY_KEY}/{world.node_rank}", "1")
    decision = _tell(None, group_store)
    if decision.action == "stop":
        return decision.code
    run_id = decision.run_id
    # Local rank 0 of a machine other than rank 0's samples it, for rank 0 to write.
    samples = remote_sampler(run_id, joined, sampling, decision.attempt) if world.local_rank == 0 and sampling.remote \
        else None
    with samples or contextlib.nullcontext():
        try:
            train_rank(_rank_spec(joined, world, run_id, url, echo=False, folder_name=decision.folder_name,
                                  resume_job=resume_job, sampling=sampling))
        except StoppedAtStep:
            _wait_for_rank_0(group_store, decision.attempt)
            return STOPPED_EXIT
    return 0


def _wait_for_rank_0(group_store, attempt: str) -> None:
    """A process that stopped at a step leaves once rank 0 has written the resume point and recorded the stop:
    torchrun stops the whole job as soon as one process exits other than 0, which would end rank 0 mid-save."""
    with contextlib.suppress(Exception):  # rank 0 (and the store it serves) gone: nothing to wait for
        group_store.wait([f"{ATTEMPT_ENDED_KEY}/{attempt}"], ATTEMPT_ENDED_WAIT)


def _rank_spec(joined: RunConfig, world: TorchrunWorld, run_id: int, url: str, *, echo: bool, folder_name: str,
               resume_job: bool, sampling: Sampling) -> RankSpec:
    """What this process of the job trains: its rank's part of the one run, resumable where torchrun
    may restart it or the job asks to resume; its machine's local rank 0 meters the machine."""
    resumable = world.max_restarts > 0 or resume_job or submitted_run_id() is not None
    return RankSpec(joined, world.rank, run_id, url, echo=echo, resumable=resumable,
                    folder_name=folder_name, energy_part=sampling.energy_part(joined, meters=world.local_rank == 0))


def _lead(joined: RunConfig, world: TorchrunWorld, hosts: list[str], url: str, echo: bool, restarted: bool,
          resume_job: bool, sampling: Sampling, group_store) -> int:
    """Rank 0: open (or find) the job's run, tell every process, train and record how it ended.
    ``sampling`` says what its system sampler samples and which machines' samples it takes in."""
    try:
        info = preflight(joined)
        notes = [world_note(joined, world, hosts), *run_notes(joined, info)]
        engine = make_engine(url)
        run_id, status = _open_run(engine, joined, world, hosts, notes, restarted, resume_job)
        folder_name = run_folder_name(engine, run_id)
    except USER_ERRORS as exc:
        _tell(Decision("stop", None, 2), group_store)
        print(f"error: {exc}", file=sys.stderr, flush=True)
        fail_submitted_run(url, exc)
        return 2
    except BaseException:
        _tell(Decision("stop", None, 1), group_store)
        raise
    if status != "running":
        # A restart of a job whose run has ended (cancelled, say): nothing to resume, and exit
        # code 0 for a run that ended on purpose, so torchrun does not restart it again.
        code = 0 if status in ("completed", "cancelled") else 1
        _tell(Decision("stop", run_id, code), group_store)
        print(f"run_id={run_id} status={status}", flush=True)
        return code
    attempt = uuid.uuid4().hex
    others = [node for node in sampling.machines if node != sampling.node]
    group_store.wait([f"{DATA_READY_KEY}/{node}" for node in others], DECISION_WAIT)
    _tell(Decision("train", run_id, 0, folder_name, attempt), group_store)
    if echo:
        announce(run_id, joined, info, notes)
    try:
        status = _train_and_record(engine, run_id, url, joined, world, echo, folder_name, resume_job, sampling,
                                   attempt)
    finally:
        with contextlib.suppress(Exception):
            group_store.set(f"{ATTEMPT_ENDED_KEY}/{attempt}", "1")  # processes stopped at a step may leave now
    run = store.get_run(engine, run_id)
    if status not in ("completed", "running"):
        print(f"error: {run.error or ''}", file=sys.stderr, flush=True)
    elif status == "running":
        print(f"run_id={run_id} attempt {world.restart_count + 1} stopped; torchrun may restart the job "
              f"({world.restarts_left} restart(s) left)", file=sys.stderr, flush=True)
    print(f"run_id={run_id} status={status}", flush=True)
    return 0 if status == "completed" else 1


def _open_run(engine, joined: RunConfig, world: TorchrunWorld, hosts: list[str], notes: list[str],
              restarted: bool, resume_job: bool = False) -> tuple[int, str]:
    """The job's run: the one an earlier attempt of this job left unfinished, else a new one.
    (run id, status); a restart of a job whose run has ended gets that run and its status.

    Only a restarted attempt carries on in an earlier run: a new job, under a job id and training
    used before, would otherwise mix its epochs into a run that ended long ago (or into one that a
    job still running owns). ``resume_job`` asks a new job to take over a lost or failed run."""
    pid, host = os.getpid(), socket.gethostname()
    if submitted_run_id() is not None:
        return _take_submitted_run(engine, submitted_run_id(), joined, world, hosts, notes)
    if resume_job and not restarted:
        state.mark_lost_runs(engine)  # a run whose job died is lost, and may be taken over
    found = elastic.find_job_run(engine, world.job_id)
    # The same job id with the same training is the same job (the world may have changed size).
    same = found is not None and same_training(store.get_run(engine, found[0]).config, joined.to_dict())
    if same and (restarted or resume_job):
        run_id, status = found
        statuses = elastic.RESUMABLE_STATUSES if restarted else elastic.TAKEOVER_STATUSES
        if elastic.resume_job_run(engine, run_id, pid=pid, host=host, nodes=len(hosts), hosts=hosts, statuses=statuses):
            store.add_notes(engine, run_id, notes)
            _forget_failures(engine, run_id)
            return run_id, "running"
        if restarted:
            return run_id, store.get_run(engine, run_id).status
        raise ValueError(f"--resume-job: run {run_id} of torchrun job {world.job_id} is {status}; only a run that was "
                         f"{' or '.join(elastic.TAKEOVER_STATUSES)} is taken over (leave out --resume-job to start a new run)")
    if resume_job and not restarted:
        raise ValueError(f"--resume-job: no run of torchrun job {world.job_id} (--rdzv-id) with this training to take "
                         "over; leave out --resume-job to start a new run")
    # Started at once: the job's processes are already running on every machine, so it does
    # not wait in this machine's queue.
    # Each write through the waits every must-land write has: a locked database is waited out, and a full or
    # read-only one is one line naming it, not an OperationalError and its traceback. One at a time: a retried
    # create_run never makes a second run.
    from db.connection import retry_when_locked

    run_id = retry_when_locked(lambda: store.create_run(engine, joined.to_dict(), status="running", notes=notes,
                                                        world_size=joined.world_size), what="record the job's run")
    retry_when_locked(lambda: store.set_process(engine, run_id, pid=pid, host=host), what="record the run's process")
    retry_when_locked(lambda: elastic.record_job(engine, run_id, elastic_run_id=world.job_id, nodes=len(hosts),
                                                 hosts=hosts), what="record the torchrun job")
    return run_id, "running"


# Statuses a submitted run is taken over from: queued (the job's first start), running or lost (a job that Slurm
# requeued, its earlier attempt stopped by a signal). Slurm runs one attempt of a job at a time.
SUBMITTED_STATUSES = ("queued", "running", "lost")


def run_one_task_job(config: RunConfig, *, db_url: str | None = None, echo: bool = True) -> int:
    """The one task of a Slurm job of single, dp or mp (``config`` on the job's devices, control/slurm_job.py's
    ``check_world``): takes over the run recorded at submission and trains it in this process, without
    torchrun, as rank 0 of a world of one. So it is what a ddp job's rank 0 is: its SIGTERM (a preemption, a
    requeue) and USR1's stop request stop it at a step with a resume point, a requeued job resumes there, a
    cancel stops it, and how each attempt ended is recorded alike. Returns the exit code."""
    world = TorchrunWorld(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0,
                          job_id=os.environ.get("SLURM_JOB_ID") or "none", restart_count=0, max_restarts=0)
    stop_on_sigterm(raise_cancelled)
    try:
        return _lead_alone(config, world, database_url(db_url), echo)
    except (RunCancelled, KeyboardInterrupt):
        return 1  # Slurm (or the user) stopped the job before this run existed


def _lead_alone(config: RunConfig, world: TorchrunWorld, url: str, echo: bool) -> int:
    host = socket.gethostname()
    sampling = Sampling(0, [Member(host, 0, config.devices[0], 0, os.getpid())])
    try:
        config = with_resolved_amp(config)  # --amp auto from the job's GPUs
        info = preflight(config)
        notes = [f"Slurm job {world.job_id} runs {config.strategy} as one task on {host}, in one process on "
                 f"{','.join(config.devices)} (no torchrun).", *run_notes(config, info)]
        engine = make_engine(url)
        run_id, status = _take_submitted_run(engine, submitted_run_id(), config, world, [host], notes)
        folder_name = run_folder_name(engine, run_id)
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        fail_submitted_run(url, exc)
        return 2
    if status != "running":  # a requeued job whose run has ended meanwhile (a cancel)
        print(f"run_id={run_id} status={status}", flush=True)
        return 0 if status in ("completed", "cancelled") else 1
    if echo:
        announce(run_id, config, info, notes)
    status = _train_and_record(engine, run_id, url, config, world, echo, folder_name, False, sampling,
                               uuid.uuid4().hex)
    if status not in ("completed", "running"):
        print(f"error: {store.get_run(engine, run_id).error or ''}", file=sys.stderr, flush=True)
    print(f"run_id={run_id} status={status}", flush=True)
    return 0 if status == "completed" else 1


def fail_submitted_run(url: str, exc: BaseException) -> None:
    """The run a Slurm job was submitted for, refused before it trains (its data, its model, a file changed
    since the launch), ends failed with the reason: Slurm's poll would know only the job's exit code."""
    run_id = submitted_run_id()
    if run_id is None:
        return
    try:
        state.finish(make_engine(url), run_id, "failed", error=str(exc))
    except Exception as unrecorded:  # the database may be what failed: the job's log keeps the reason
        print(f"error: run {run_id}'s failure is not recorded ({type(unrecorded).__name__}: {unrecorded})",
              file=sys.stderr, flush=True)


def submitted_run_id() -> int | None:
    raw = os.environ.get(SUBMITTED_RUN_ENV)
    return int(raw) if raw and raw.isdecimal() else None


def _take_submitted_run(engine, run_id: int, joined: RunConfig, world: TorchrunWorld, hosts: list[str],
                        notes: list[str]) -> tuple[int, str]:
    """The run recorded at submission, running under this job; (run id, its status) where it has ended (a cancel)."""
    pid, host = os.getpid(), socket.gethostname()
    if not elastic.resume_job_run(engine, run_id, pid=pid, host=host, nodes=len(hosts), hosts=hosts,
                                  statuses=SUBMITTED_STATUSES):
        run = store.get_run(engine, run_id)
        if run is None:
            raise LookupError(f"no run with id {run_id} ({SUBMITTED_RUN_ENV}): was the job submitted to another "
                              "database?")
        return run_id, run.status
    store.set_config(engine, run_id, joined.to_dict(), world_size=joined.world_size)
    elastic.record_job(engine, run_id, elastic_run_id=world.job_id, nodes=len(hosts), hosts=hosts)
    restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    store.add_notes(engine, run_id, notes + ([f"Slurm requeued job {world.job_id} {restarts} time(s); it resumes from "
                                              "its last resume point (the step where its ranks stopped, or else its "
                                              "last finished epoch)."] if restarts else []))
    _forget_failures(engine, run_id)
    return run_id, "running"


def same_training(stored: dict, joined: dict) -> bool:
    """Whether two configs train the same thing, whatever world they were given."""
    ignored = ("devices", "nodes")
    return {k: v for k, v in stored.items() if k not in ignored} == {k: v for k, v in joined.items() if k not in ignored}


def _forget_failures(engine, run_id: int) -> None:
    """A new attempt's failures are its own: drop the tracebacks the previous one left here."""
    for path in run_folder(engine, run_id, create=True).glob("rank*.failure.json"):
        path.unlink(missing_ok=True)


def _train_and_record(engine, run_id: int, url: str, joined: RunConfig, world: TorchrunWorld, echo: bool,
                      folder_name: str, resume_job: bool, sampling: Sampling, attempt: str) -> str:
    """Rank 0 trains its part and records how the attempt ended; returns the run's status."""
    status = None
    try:
        started = time.time()
        # Blocked in a collective past a SIGTERM's grace, rank 0 is ended from the grace's thread: this first.
        when_blocked(lambda grace_s: record_sigterm(engine, run_id, world, folder_name, started,
                                                   blocked_after_s=grace_s))
        try:
            # As in a spawned run, the sampler stops and writes what it holds however training ends,
            # and a sampler that fails leaves a note in the run, never a failed rank.
            # The SIGTERM guard is the innermost context: it acts before the sampler writes.
            with (Heartbeat(engine, run_id), machine_sampler(engine, run_id, joined, sampling, attempt),
                  _sigterm_ignored_once_training_raises()):
                train_rank(_rank_spec(joined, world, run_id, url, echo=echo, folder_name=folder_name,
                                      resume_job=resume_job, sampling=sampling))
            state.finish(engine, run_id, "completed")
        except KeyboardInterrupt:
            state.finish(engine, run_id, "cancelled", error="cancelled by the user (Ctrl-C)")
        except StoppedAtStep as stopped:  # told to stop (rank/stopping.py): the next attempt continues there
            where = f"after step {stopped.step} of epoch {stopped.epoch}, its resume point saved there."
            if store.get_run(engine, run_id).status == "cancelled":  # the heartbeat's SIGTERM: a cancel
                note = f"Cancelled: the ranks stopped {where}"
            elif stop_taken() == "SIGTERM":
                note = (f"The job was told to stop (SIGTERM from Slurm: a preemption, a requeue, the time limit or "
                        f"scancel) and stopped {where}")
            else:
                note = f"The job was told to stop and stopped {where}"
            store.add_notes(engine, run_id, [note])
        except RunCancelled:
            record_sigterm(engine, run_id, world, folder_name, started)
        except Exception as exc:
            _record_first()  # as above, where the sampler itself failed to start
            own = f"rank 0 raised an exception:\n{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}"
            _attempt_failed(engine, run_id, world, _failure_cause(folder_name, started) or own)
        status = store.get_run(engine, run_id).status
    finally:
        if status != "completed":
            # Recorded (or recording failed): from here on torchrun's SIGTERM may end this process
            # at once, even if leaving a process group whose peers are gone would hang.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return status


def record_sigterm(engine, run_id: int, world: TorchrunWorld, folder_name: str, started: float, *,
                   blocked_after_s: float | None = None) -> None:
    """How an attempt that a SIGTERM ended is recorded. ``cancel`` marks the run cancelled before it signals;
    Slurm's (a requeue, a preemption, the time limit) leaves the run as it is, for a requeued job to resume or for
    the poll (control/slurm_status.py) to record Slurm's end; any other is torchrun stopping the job, which it
    does when another of its processes has failed. ``blocked_after_s``: rank 0 was still waiting in a collective
    (on a peer that never came) when the SIGTERM's grace of that many seconds ran out, and ends without a step."""
    cause = _failure_cause(folder_name, started)
    why = (f" Rank 0 was blocked in a collective (waiting on a peer) and reached no step within the "
           f"{blocked_after_s:g} s grace after the signal, so the attempt ended without a resume point at a step."
           if blocked_after_s is not None else "")
    if store.get_run(engine, run_id).status == "cancelled":
        pass
    elif cause is None and submitted_run_id() is not None:
        store.add_notes(engine, run_id, [f"Slurm stopped attempt {int(os.environ.get('SLURM_RESTART_COUNT') or 0) + 1} "
                                         f"of job {world.job_id} (SIGTERM).{why}"])
    else:
        _attempt_failed(engine, run_id, world, (cause or (
            "torchrun stopped rank 0 (SIGTERM), most likely because another process of the job failed; "
            "torchrun's output names it")) + (f"\n{why.strip()}" if why else ""))


@contextlib.contextmanager
def _sigterm_ignored_once_training_raises():
    """Another process's failure often reaches rank 0 first as an error in a collective, and
    torchrun's SIGTERM follows: it must not cut short the sampler's last write (the attempt's
    samples) or the record of how the attempt ended. ``_train_and_record`` restores the default."""
    try:
        yield
    except Exception:
        _record_first()
        raise


def _record_first() -> None:
    """Training has raised: how the attempt ended is recorded before any SIGTERM may end rank 0 (torchrun's is
    ignored from here, and one from Slurm that asked for a stop at a step no longer escalates)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stop_escalating()


class Sampling:
    """What the sampler of this process's machine samples, from what every process told the
    others when it joined: ``neighbours``, the processes of this machine {global rank: pid}, and
    the machines of the job by node rank, named for notes."""

    def __init__(self, node: int, members: list[Member]):
        self.node = node
        self.neighbours = {rank: m.pid for rank, m in enumerate(members) if m.node == node}
        self.machines = {n: f"node {n} ({host})" for n, host in sorted({m.node: m.host for m in members}.items())}
        self.lead_node = members[0].node  # rank 0's machine, which writes the run
        self.remote = node != self.lead_node

    def machine(self) -> str | None:
        """This machine's name in notes, where the job has several."""
        return self.machines[self.node] if len(self.machines) > 1 else None

    def cuda_indices(self, joined: RunConfig) -> list[int]:
        """The GPUs the ranks of this machine train on (``cuda:LOCAL_RANK``); all of a one-process run's."""
        if len(self.neighbours) == 1 and len(self.machines) == 1:  # a world of one process: all its devices
            return cuda_indices(joined.devices)
        return cuda_indices([joined.devices[rank] for rank in sorted(self.neighbours)])

    def energy_part(self, joined: RunConfig, *, meters: bool) -> EnergyPart | None:
        """This process's part in metering the job's energy where it spans machines (None on one
        machine: rank 0 meters it all, as in a spawned run); the process that ``meters`` is local rank 0."""
        if len(self.machines) == 1:
            return None
        return EnergyPart(dict(self.machines), self.node, meters, tuple(self.cuda_indices(joined)) if meters else ())


def machine_sampler(engine, run_id: int, joined: RunConfig, sampling: Sampling, attempt: str) -> SystemSampler:
    """The system sampler of rank 0's machine: its host, the processes of its ranks (their global
    ranks label them, as in a spawned run) and the GPUs they train on; and, where the job has
    other machines, their samples as they arrive through torchrun's store, under ``attempt``'s keys."""
    others = {node: name for node, name in sampling.machines.items() if node != sampling.node}
    started_at_s = run_started_at_s(engine, run_id)
    drain = None
    if others:
        try:
            drain = StoreDrain(sample_store(run_id, attempt), others, started_at_s)
        except Exception as exc:  # the run trains on, sampled on this machine only, and says so
            store.add_notes(engine, run_id, [f"System samples of {', '.join(others.values())} are not recorded: "
                                             f"torchrun's store could not be reached ({type(exc).__name__}: {exc})."])
    sampler = SystemSampler(engine, run_id, started_at_s, sampling.cuda_indices(joined), node=sampling.node,
                            machine=sampling.machine(), extra=drain)
    sampler.watch(sampling.neighbours)
    return sampler


def remote_sampler(run_id: int, joined: RunConfig, sampling: Sampling, attempt: str) -> SystemSampler | None:
    """The system sampler of a machine other than rank 0's: as rank 0's, but its rows, in wall
    time, and its notes go to rank 0 through torchrun's store. None where that store cannot be
    reached (rank 0 then notes the machine's samples as missing)."""
    try:
        pusher = StorePusher(sample_store(run_id, attempt), sampling.node)
    except Exception as exc:
        print(f"parallax: {sampling.machine()} is not sampled: torchrun's store could not be reached "
              f"({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)
        return None
    sampler = SystemSampler(None, run_id, 0.0, sampling.cuda_indices(joined), node=sampling.node,
                            machine=sampling.machine(), sink=pusher)
    sampler.watch(sampling.neighbours)
    return sampler


def _failure_cause(folder_name: str, since: float) -> str | None:
    """The first failure of this attempt among the ranks on this machine (a rank that fails makes
    its peers fail mid-collective; the first one is the cause)."""
    failures = [f for f in read_rank_failures(named_run_folder(folder_name)) if f["time"] >= since]
    if not failures:
        return None
    first = min(failures, key=lambda f: f["time"])
    if first.get("type") == TrainingDiverged.__name__:  # one verdict every rank reached together: its own words
        return first["message"]
    return with_oom_hint(f"rank {first['rank']} raised an exception:\n{first['traceback']}")


def _attempt_failed(engine, run_id: int, world: TorchrunWorld, cause: str) -> None:
    """With restarts left the run stays running for the restarted job to resume; else it failed."""
    if world.restarts_left:
        summary = next((line for line in reversed(cause.strip().splitlines()) if line.strip()), cause)
        store.add_notes(engine, run_id, [
            f"Attempt {world.restart_count + 1} of the torchrun job stopped ({summary.strip()}); torchrun restarts "
            f"it ({world.restarts_left} restart(s) left) and it resumes from its last finished epoch."])
    else:
        state.finish(engine, run_id, "failed", error=cause)
