"""Runs onto a Slurm cluster: one sbatch script per run (or one job array per sweep), rendered into the run's
folder, submitted with ``sbatch --parsable``.

    run_id = submit(RunConfig(where="slurm", strategy="ddp", slurm_nodes=2))       # returns at once
    sweep_id, run_ids = submit_sweep(configs, array_limit=2)                         # one array, a task per run

The job runs ``srun`` with one task per node, each a torchrun agent, all meeting (c10d) at the first node's
address; every process runs ``python -m trainer_backend run`` with the run's config (``slurm-config.json`` in
its folder), and rank 0 takes over the run Parallax recorded here (``PARALLAX_RUN_ID``,
supervisor/torchrun.py), so the dashboard follows it as any run. The job's output (``slurm.log``) goes to the
run's folder, created here before the job starts. The run's ``measurements["slurm"]`` keeps the job id and
the script's file. ``docs/SLURM.md`` shows a rendered script and what the cluster must provide.

The nodes must reach the run's database and its folder: a PostgreSQL URL, or the SQLite home on a file system
the nodes share (``PARALLAX_SHARED_HOME=1`` says so), or a cluster whose nodes are all this machine. Anything
else is refused in one line before a run is recorded (``check_database_reachable``).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

from db import make_engine, store
from db.connection import absolute_database_url
from db.folders import run_folder
from contract.environment import database_url, parallax_home

from contract.config import ConfigError, RunConfig
from contract.model_source import with_model_source
from contract.sbatch_parsing import sbatch_word
from contract.slurm_options import cpus_per_node, processes_per_node
from contract.strategy_specs import find
from contract.user_paths import with_absolute_paths
from contract.world import SUBMITTED_RUN_ENV

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SCRIPT_FILE = "slurm.sbatch"
LOG_FILE = "slurm.log"
CONFIG_FILE = "slurm-config.json"
CANCEL_FILE = "slurm-cancel"  # written by cancel before it signals the job: its USR1 then does not requeue
SLURM_KEY = "slurm"  # Run.measurements["slurm"]: {"job_id", "script", "log", "array_task"}
SHARED_HOME_ENV = "PARALLAX_SHARED_HOME"
COMMAND_TIMEOUT_S = 30.0
SIGNAL_LEAD_S = 120  # USR1 this long before the time limit (Slurm may send it up to ~15 s late)
EPOCH_WAIT_S = 90  # after USR1, how long the ranks may take to leave a resume point (at a step or an epoch's end)
RESUME_EPOCH = "resume.json"  # rank/resume.py's RESUME_EPOCH_FILE, written after each resume point
STOP_REQUEST = "stop-requested"  # rank/stopping.py's STOP_FILE: the ranks stop at the next agreed step
RDZV_PORT_BASE = 29500


class SlurmUnavailable(ValueError):
    """Slurm cannot take the run here (no sbatch, a controller that does not answer): the one-line reason."""


def slurm_command(*argv: str, timeout_s: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run one Slurm client command; a missing client or a timeout becomes SlurmUnavailable in one line."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmUnavailable(f"{argv[0]} is not installed here: Slurm's client commands (slurm-client) are "
                               "needed to run on a Slurm cluster") from None
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"{argv[0]} did not answer within {timeout_s:g} s: is slurmctld reachable?") from None


def node_addresses() -> dict[str, str]:
    """{node name: address} of every node of the cluster, from ``scontrol show node --oneliner``."""
    result = slurm_command("scontrol", "show", "node", "--oneliner")
    if result.returncode != 0:
        raise SlurmUnavailable(f"scontrol show node failed: {result.stderr.strip() or result.stdout.strip()}")
    nodes = {}
    for line in result.stdout.splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if "NodeName" in fields:
            nodes[fields["NodeName"]] = fields.get("NodeAddr") or fields["NodeName"]
    return nodes


def _this_machine(address: str) -> bool:
    if address in ("localhost", socket.gethostname(), socket.gethostname().split(".")[0]):
        return True
    try:
        resolved = socket.gethostbyname(address)
    except OSError:
        return False
    return resolved.startswith("127.") or resolved == _own_address()


def _own_address() -> str | None:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


def check_database_reachable(url: str) -> None:
    """Refuse, in one line, a database the cluster's nodes cannot reach: SQLite is taken only where its home
    is declared shared (PARALLAX_SHARED_HOME=1) or every node of the cluster is this machine."""
    if not url.startswith("sqlite"):
        return  # a server the nodes reach over the network (its address is the user's to get right)
    if os.environ.get(SHARED_HOME_ENV) == "1":
        return
    elsewhere = [name for name, address in node_addresses().items() if not _this_machine(address)]
    if elsewhere:
        raise ConfigError("where", f"where slurm needs a database the nodes can reach: the SQLite file in "
                          f"{parallax_home()} is on this machine and node {elsewhere[0]} is not; use PostgreSQL "
                          f"(PARALLAX_DB_URL), or put PARALLAX_HOME on a file system every node mounts at the same "
                          f"path and set {SHARED_HOME_ENV}=1")


def check_world(config: RunConfig) -> RunConfig:
    """The config as the job's world will train it (one device per process over every node), refused in one
    line where it cannot (a batch that does not divide over the processes, a staged model without enough)."""
    per_node = processes_per_node(config)
    # GPUs as torchrun gives them (cuda:LOCAL_RANK on every node); CPU processes share one kind of device.
    devices = tuple(f"cuda:{i}" for _ in range(config.slurm_nodes) for i in range(per_node)) if config.uses_cuda \
        else ("cpu",) * (config.slurm_nodes * per_node)
    if not find(config.strategy).distributed:
        # One process on one node, over the GPUs Slurm gives the job (cuda:0 …); single takes the first of them.
        devices = devices[:1] if find(config.strategy).one_device else devices
        try:
            return config.replace(devices=devices, nodes=1)
        except ConfigError as exc:
            raise ConfigError(exc.field, f"on Slurm (one {config.strategy} process on {len(devices)} "
                              f"{'GPU' if config.uses_cuda else 'CPU device'}(s)): {exc}") from None
    try:
        return config.replace(devices=devices, nodes=config.slurm_nodes if config.uses_cuda else 1)
    except ConfigError as exc:
        raise ConfigError(exc.field, f"on Slurm ({config.slurm_nodes} node(s) × {processes_per_node(config)} "
                          f"process(es)): {exc}") from None


def one_task(config: RunConfig) -> bool:
    """Whether the job runs the run as one task without torchrun: single, dp and mp (one process)."""
    return not find(config.strategy).distributed


def in_one_task_job() -> bool:
    """Whether this process is the one task of a job this module submitted (its script exports the run's id)."""
    return bool(os.environ.get(SUBMITTED_RUN_ENV) and os.environ.get("SLURM_JOB_ID"))


def sbatch_options(config: RunConfig, *, job_name: str, output: Path) -> list[str]:
    """The #SBATCH lines of a run's job, in the order the script shows them."""
    # The log's path is written as sbatch reads it back: a home with blanks or a # stays one path.
    lines = [f"--job-name={job_name}", f"--output={sbatch_word(str(output))}", "--open-mode=append", "--requeue",
             f"--signal=B:USR1@{SIGNAL_LEAD_S}", f"--nodes={config.slurm_nodes}", "--ntasks-per-node=1",
             f"--cpus-per-task={cpus_per_node(config)}"]
    if config.slurm_gpus_per_node:
        lines.append(f"--gpus-per-node={config.slurm_gpus_per_node}")
    for name, option in (("slurm_partition", "partition"), ("slurm_time", "time"), ("slurm_mem", "mem"),
                         ("slurm_account", "account"), ("slurm_qos", "qos")):
        if getattr(config, name):
            lines.append(f"--{option}={getattr(config, name)}")
    return lines + list(config.slurm_extra)


def task_processes(config: RunConfig) -> int:
    """How a job starts ``config``'s run: 0 for one task without torchrun (single, dp, mp), else the processes
    torchrun starts on each node."""
    return 0 if one_task(config) else processes_per_node(config)


def render_script(config: RunConfig, run_ids: list[int], folders: list[Path], *, job_name: str, output: Path,
                  python: str = sys.executable, task_configs: list[RunConfig] | None = None) -> str:
    """The batch script of one run, or of a job array whose task i trains ``run_ids[i]`` in ``folders[i]``.
    ``config`` gives the job's #SBATCH lines; ``task_configs`` (one per task, default ``config``) say how each
    task starts its run: a sweep's array may mix one-task strategies with torchrun's, and device counts."""
    q = shlex.quote
    header = "\n".join(f"#SBATCH {line}" for line in sbatch_options(config, job_name=job_name, output=output))
    task = '"${SLURM_ARRAY_TASK_ID:-0}"'
    processes = [task_processes(c) for c in task_configs or [config]]
    if len(set(processes)) > 1:
        how = ("Each task as its run needs: single, dp and mp in one process without torchrun, the others a "
               "torchrun agent per node (c10d rendezvous at the first node's address).")
    elif processes[0] == 0:
        how = f"One task: {config.strategy} trains in one process, without torchrun."
    else:
        how = "One task per node, each a torchrun agent; they meet at the first node's address (c10d rendezvous)."
    script = f"""#!/bin/bash
{header}
# Rendered by Parallax (trainer_backend/control/slurm_job.py); docs/SLURM.md explains each line.
# {how}
set -u
RUN_IDS=({' '.join(str(i) for i in run_ids)})
RUN_FOLDERS=({' '.join(q(str(f)) for f in folders)})
export PARALLAX_RUN_ID=${{RUN_IDS[{task}]}}
RUN_FOLDER=${{RUN_FOLDERS[{task}]}}
MAX_REQUEUES={config.max_requeues}
export PYTHONPATH={q(str(PROJECT_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}
export PYTHONUNBUFFERED=1
echo "parallax: run $PARALLAX_RUN_ID, job $SLURM_JOB_ID, attempt $((${{SLURM_RESTART_COUNT:-0}} + 1)), on $SLURM_JOB_NODELIST at $(date -u +%FT%TZ)"

# Slurm's warning before the time limit or a preemption (USR1): the ranks are asked to stop (STOP_REQUEST in the
# run's folder); within a few steps they agree on one, leave a resume point there (resume.json names its epoch
# and step) and exit. Once it is there (or after EPOCH_WAIT_S) the job requeues itself, at most MAX_REQUEUES
# times, and the requeued job continues at that step. A cancel from Parallax is never requeued.
# SIGTERM is not trapped here (scancel sends it too): the ranks take a preemption's or requeue's SIGTERM as a
# request to stop at a step, and Slurm requeues such a job itself.
EPOCH_WAIT_S={EPOCH_WAIT_S}
resume_epoch() {{ cat "$RUN_FOLDER/{RESUME_EPOCH}" 2>/dev/null || echo none; }}
requeue() {{
    if [[ -e "$RUN_FOLDER/{CANCEL_FILE}" ]]; then
        echo "parallax: cancelled from Parallax; not requeued"
        return
    elif (( ${{SLURM_RESTART_COUNT:-0}} >= MAX_REQUEUES )); then
        echo "parallax: signal received; requeued $MAX_REQUEUES time(s) already (max_requeues), so the job is not requeued"
        return
    fi
    echo "parallax: signal received; the ranks stop at the next step they agree on (up to $EPOCH_WAIT_S s)"
    local before waited=0
    before=$(resume_epoch)
    touch "$RUN_FOLDER/{STOP_REQUEST}"
    while [[ $(resume_epoch) == "$before" ]] && (( waited < EPOCH_WAIT_S )) && kill -0 "$srun_pid" 2>/dev/null; do
        sleep 1
        waited=$((waited + 1))
    done
    # The ranks exit once their point at a step is saved: that one is requeued even when srun has ended.
    if ! kill -0 "$srun_pid" 2>/dev/null && [[ $(resume_epoch) == "$before" || $(resume_epoch) != *'"step"'* ]]; then
        echo "parallax: the run ended meanwhile; not requeued"
        return
    fi
    echo "parallax: requeueing job $SLURM_JOB_ID after ${{waited}} s (resume point: $(resume_epoch))"
    scontrol requeue "$SLURM_JOB_ID"
}}
trap requeue USR1
rm -f "$RUN_FOLDER/{STOP_REQUEST}"  # an earlier attempt's request that no step took
"""
    # single, dp and mp: one process over the node's devices, as `parallax run` trains it, without torchrun. srun
    # is given the CPUs again: since Slurm 22.05 a step does not inherit sbatch's --cpus-per-task.
    cpus = cpus_per_node(config)
    alone = (f"srun --kill-on-bad-exit=1 --ntasks=1 --cpus-per-task={cpus} {q(python)} -m trainer_backend run "
             f'--config "$RUN_FOLDER/{CONFIG_FILE}" --quiet &\n')

    def torchrun(per_node: str) -> str:
        return f"""head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
head_address=$(scontrol show node "$head_node" | grep -o 'NodeAddr=[^ ]*' | head -n 1 | cut -d= -f2)
rdzv_port=$(( {RDZV_PORT_BASE} + SLURM_JOB_ID % 20000 ))
srun --kill-on-bad-exit=1 --ntasks-per-node=1 --cpus-per-task={cpus} {q(python)} -m torch.distributed.run \\
    --nnodes="$SLURM_JOB_NUM_NODES" --nproc-per-node={per_node} \\
    --rdzv-backend=c10d --rdzv-endpoint="$head_address:$rdzv_port" --rdzv-id="$SLURM_JOB_ID" \\
    -m trainer_backend run --config "$RUN_FOLDER/{CONFIG_FILE}" --quiet &
"""
    if len(set(processes)) > 1:
        # One script for every task of the array, each started as its own run needs.
        launch = f"""
TASK_PROCESSES=({' '.join(map(str, processes))})  # per task: torchrun's processes per node; 0: one, without torchrun
processes=${{TASK_PROCESSES[{task}]}}
if (( processes == 0 )); then
{alone}else
{torchrun('"$processes"')}fi
"""
    else:
        launch = "\n" + (alone if processes[0] == 0 else torchrun(str(processes[0])))
    return script + launch + """srun_pid=$!
# A trapped signal ends `wait` early: wait again until srun itself has ended, and exit with its status.
wait "$srun_pid"
status=$?
while kill -0 "$srun_pid" 2>/dev/null; do
    wait "$srun_pid"
    status=$?
done
exit "$status"
"""


def _prepare(config: RunConfig) -> RunConfig:
    if config.where != "slurm":
        raise ConfigError("where", f"where {config.where} is not slurm: launch it on this machine instead")
    check_world(config)
    return with_model_source(with_absolute_paths(config))


def submit(config: RunConfig, *, db_url: str | None = None, sweep_id: int | None = None,
           search_trial: tuple[int, int] | None = None) -> int:
    """Record the run as queued, render its script and submit it; returns the run id at once."""
    return submit_array([config], db_url=db_url, sweep_id=sweep_id,
                        search_trials=None if search_trial is None else [search_trial])[0]


def submit_array(configs: list[RunConfig], *, db_url: str | None = None, sweep_id: int | None = None,
                 array_limit: int = 0, search_trials: list[tuple[int, int]] | None = None) -> list[int]:
    """Submit one job for one config, else one job array (``--array=0-K%M``, M = ``array_limit``, 0: none),
    task i training configs[i] (the array takes the first config's Slurm options). Every config is checked
    and the database judged reachable before any run is recorded; a refused sbatch fails every run it recorded,
    with sbatch's words. ``search_trials``: each config's (search id, trial number), for a search's trials."""
    configs = [_prepare(c) for c in configs]
    url = absolute_database_url(database_url(db_url))
    check_database_reachable(url)
    engine = make_engine(url)
    trials = search_trials or [None] * len(configs)
    run_ids = [store.create_run(engine, c.to_dict(), status="queued", world_size=check_world(c).world_size,
                                sweep_id=sweep_id, search_trial=trial) for c, trial in zip(configs, trials)]
    folders = [run_folder(engine, run_id, create=True) for run_id in run_ids]
    for config, folder in zip(configs, folders):
        (folder / CONFIG_FILE).write_text(json.dumps(config.to_dict(), indent=1))
    first = configs[0]
    many = len(configs) > 1
    # A search may submit several arrays (one more when it is resumed): each named from its first trial.
    group = f"sweep-{sweep_id}" if search_trials is None else f"search-{search_trials[0][0]}-trial-{search_trials[0][1]}"
    output = (folders[0].parent / f"{group}-task-%a.log") if many else folders[0] / LOG_FILE
    logs = [output.with_name(output.name.replace("%a", str(i))) for i in range(len(configs))]
    for log in logs:
        log.touch()  # the Run page tails it before the job starts
    name = f"parallax-{group}" if many else f"parallax-{run_ids[0]}"
    script = render_script(first, run_ids, folders, job_name=name, output=output, task_configs=configs)
    for folder in folders:
        (folder / SCRIPT_FILE).write_text(script)
    argv = ["sbatch", "--parsable"]
    if many:
        argv.append(f"--array=0-{len(configs) - 1}" + (f"%{array_limit}" if array_limit else ""))
    # The database URL travels in sbatch's environment (exported to the job), never in the script's text.
    env_url = {"PARALLAX_DB_URL": url, "PARALLAX_HOME": str(parallax_home())}
    try:
        result = subprocess.run([*argv, str(folders[0] / SCRIPT_FILE)], capture_output=True, text=True,
                                timeout=COMMAND_TIMEOUT_S, env={**os.environ, **env_url}, cwd=folders[0],
                                stdin=subprocess.DEVNULL)
        refused = result.stderr.strip() or result.stdout.strip() if result.returncode != 0 else None
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        refused = f"sbatch could not be run ({type(exc).__name__}: {exc})"
    if refused is not None:
        from db import run_state as state

        for run_id in run_ids:
            state.finish(engine, run_id, "failed", error=f"sbatch refused the job: {refused}")
        raise SlurmUnavailable(f"sbatch refused the job: {refused.splitlines()[0] if refused else 'no reason given'}")
    job_id = result.stdout.strip().split(";")[0]
    for index, (run_id, log) in enumerate(zip(run_ids, logs)):
        store.set_measurements(engine, run_id, {SLURM_KEY: {
            "job_id": f"{job_id}_{index}" if many else job_id, "array_job_id": job_id if many else None,
            "script": SCRIPT_FILE, "log": str(log)}})
    return run_ids


def resubmit(engine, url: str, run_id: int) -> str:
    """Submit the reopened (queued) run ``run_id`` again with the script kept in its folder; its job resumes it
    from its last resume point. Returns the new job id; a refused sbatch fails the run with sbatch's words."""
    folder = run_folder(engine, run_id, create=True)
    (folder / CANCEL_FILE).unlink(missing_ok=True)
    try:
        config = RunConfig.from_dict(json.loads((folder / CONFIG_FILE).read_text()))
    except (OSError, ValueError) as exc:
        raise ValueError(f"run {run_id} cannot be submitted again: its {CONFIG_FILE} cannot be read ({exc}); launch "
                         "it again instead") from None
    check_database_reachable(url)
    # A script of its own (a run of an array trains alone now); the one it ran with stays beside it.
    script = folder / SCRIPT_FILE
    if script.is_file():
        script.replace(folder / f"{SCRIPT_FILE}.before-resume")
    script.write_text(render_script(config, [run_id], [folder], job_name=f"parallax-{run_id}",
                                    output=folder / LOG_FILE))
    (folder / LOG_FILE).touch()
    env = {**os.environ, "PARALLAX_DB_URL": url, "PARALLAX_HOME": str(parallax_home())}
    result = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True,
                            timeout=COMMAND_TIMEOUT_S, env=env, cwd=folder, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        from db import run_state as state

        refused = (result.stderr or result.stdout).strip()
        state.finish(engine, run_id, "failed", error=f"sbatch refused the job: {refused}")
        raise SlurmUnavailable(f"sbatch refused the job: {refused.splitlines()[0] if refused else 'no reason given'}")
    job_id = result.stdout.strip().split(";")[0]
    info = slurm_info(store.get_run(engine, run_id)) or {}
    store.set_measurements(engine, run_id, {SLURM_KEY: {**info, "job_id": job_id, "array_job_id": None,
                                                        "log": str(folder / LOG_FILE)}})
    return job_id


def slurm_info(run) -> dict | None:
    """The run's Slurm job as submission recorded it ({"job_id", "script", "log", ...}), None for a local run."""
    info = (run.measurements or {}).get(SLURM_KEY) if run is not None else None
    return info if isinstance(info, dict) else None


def on_slurm(config: dict) -> bool:
    """Whether a stored config sends its run to Slurm."""
    return (config or {}).get("where") == "slurm" and find(str((config or {}).get("strategy"))) is not None


CANCEL_WAIT_S = 15.0


def cancel_job(engine, run, *, wait_s: float = CANCEL_WAIT_S) -> None:
    """Cancel the Slurm job of ``run`` (already marked cancelled): a running job first gets USR1 in its batch
    script, which, finding the cancel's mark, does not requeue, while rank 0's heartbeat sees the run cancelled
    and stops the ranks; after at most ``wait_s`` (its last finished epoch is on disk already: resume points are
    written at each epoch's end) ``scancel`` ends whatever is left. A pending job is simply removed."""
    import time

    info = slurm_info(run)
    if info is None or not info.get("job_id"):
        return
    job_id = str(info["job_id"])
    folder = run_folder(engine, run.id, create=True)
    (folder / CANCEL_FILE).write_text("cancelled from Parallax\n")
    state = _job_state(job_id)
    if state == "RUNNING":
        slurm_command("scancel", "--signal=USR1", "--batch", job_id)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _job_state(job_id) == "RUNNING":
            time.sleep(0.5)
    result = slurm_command("scancel", job_id)
    if result.returncode != 0 and "already completing or completed" not in result.stderr \
            and "Invalid job id" not in result.stderr:
        raise SlurmUnavailable(f"scancel {job_id} failed: {result.stderr.strip()}")


def _job_state(job_id: str) -> str | None:
    result = slurm_command("squeue", "-h", "-j", job_id, "-o", "%T")
    return result.stdout.strip() or None if result.returncode == 0 else None



MAX_TAIL_BYTES = 256 * 1024


def read_job_log(run, offset: int = 0, *, max_bytes: int = MAX_TAIL_BYTES) -> tuple[str, int]:
    """(text, next offset): what the job's output file holds from byte ``offset`` on, at most ``max_bytes``
    (from its end where more was written), for the Run page to tail; ("", offset) where it has none yet."""
    info = slurm_info(run)
    if info is None or not info.get("log"):
        return "", offset
    try:
        with open(info["log"], "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            if offset > size:  # the file was replaced: start again
                offset = 0
            offset = max(offset, size - max_bytes)
            handle.seek(offset)
            data = handle.read(size - offset)
    except OSError:
        return "", offset
    return data.decode("utf-8", errors="replace"), offset + len(data)
