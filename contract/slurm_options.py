"""The rules of the Slurm fields (contract/fields.py, section "Slurm") beyond their bounds: names Slurm takes,
its time and memory formats, extra #SBATCH lines, and what a run on Slurm can be.

    check_slurm_options(RunConfig(where="slurm", strategy="ddp", slurm_nodes=2, slurm_time="1:00:00"))

Each refusal is one line naming the value and what is allowed, raised as the config is built, before anything
is submitted. Every strategy runs on Slurm: ddp, fsdp and pp as torchrun's processes on every node, single, dp
and mp as a job of one task on one node (control/slurm_job.py). Imports nothing heavy: the Launch form checks with it on every change.
"""

from __future__ import annotations

import re
from typing import Any

from contract.fields import WHERE, split_sbatch_options
from contract.sbatch_parsing import SbatchLineError, read_sbatch_lines
from contract.strategy_specs import find

# What sbatch accepts for a partition, account or QoS name (Slurm's own names are letters, digits, _ - .).
NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
MEMORY = re.compile(r"[0-9]{1,9}[KMGT]?")
# sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
TIME = re.compile(r"[0-9]{1,7}(:[0-9]{1,2}){0,2}|[0-9]{1,4}-[0-9]{1,2}(:[0-9]{1,2}){0,2}")
PRINTABLE = re.compile(r"[\x20-\x7e]*")
MAX_EXTRA_LINES = 64
MAX_EXTRA_LINE_LENGTH = 1000
# What Parallax sets for a job, and why a line may not set it again: the rendered script's own lines
# (control/slurm_job.py's sbatch_options), sbatch's command line (--parsable, --array), and what would take the
# job away from Parallax (another script, another user, another cluster, an environment without its database).
_OWN_LINE = "Parallax sets it itself (use the Slurm fields, or leave it out)"
SET_BY_PARALLAX = {
    **dict.fromkeys(("job-name", "output", "open-mode", "requeue", "signal", "nodes", "ntasks-per-node",
                     "cpus-per-task", "gpus-per-node", "partition", "time", "mem", "account", "qos", "array",
                     "parsable"), _OWN_LINE),
    "error": "the job's standard error goes to its log (--output), which the Run page shows",
    "no-requeue": "Parallax sets --requeue itself, so that a preempted job resumes",
    "ntasks": "Parallax sets one task per node (--ntasks-per-node=1), each a torchrun agent",
    "wrap": "Parallax submits its own batch script",
    "chdir": "the job runs where Parallax submits it",
    "wait": "sbatch would not answer with the job's id until the job had ended",
    "test-only": "sbatch would submit nothing",
    "help": "sbatch would submit nothing",
    "usage": "sbatch would submit nothing",
    "version": "sbatch would submit nothing",
    "export": "the job needs the environment Parallax submits it with (its database's address)",
    "export-file": "the job needs the environment Parallax submits it with (its database's address)",
    "get-user-env": "the job needs the environment Parallax submits it with (its database's address)",
    "uid": "the job runs as the user whose home holds the run's files",
    "gid": "the job runs as the user whose home holds the run's files",
    "clusters": "Parallax follows the job on this machine's cluster",
}


class SlurmOptionError(ValueError):
    """A Slurm field Slurm would not take; config.py raises it as the ConfigError of ``field``."""

    def __init__(self, field_name: str, message: str):
        super().__init__(message)
        self.field = field_name


_refuse = SlurmOptionError


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (as config.shown), so a refusal stays one line."""
    text = repr(value[:limit] if isinstance(value, (str, list, tuple)) else value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _check_text(cfg: Any, name: str, pattern: re.Pattern, allowed: str) -> None:
    value = getattr(cfg, name)
    if value is None:
        return
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise _refuse(name, f"{name} {shown(value)} is not allowed: {allowed}")


def parse_extra(value) -> tuple[str, ...]:
    """slurm_extra as a tuple of lines (a list in JSON, a text of options on the command line)."""
    if isinstance(value, str):
        return tuple(split_sbatch_options(value))
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return value


def check_slurm_options(cfg: Any) -> None:
    """Refuse (SlurmOptionError, one line) a Slurm field Slurm would not take, or a run Slurm cannot train."""
    if cfg.where not in WHERE:
        raise _refuse("where", f"where {shown(cfg.where)} is not allowed: choose one of {', '.join(WHERE)}")
    for name in ("slurm_partition", "slurm_account", "slurm_qos"):
        _check_text(cfg, name, NAME, "give a Slurm name of letters, digits, _, - and . (at most 128), or leave it blank")
    _check_text(cfg, "slurm_mem", MEMORY, "give a whole number with an optional K, M, G or T, e.g. 64G, or leave it "
                "blank")
    _check_text(cfg, "slurm_time", TIME, "give minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, e.g. 2:00:00, "
                "or leave it blank")
    extra = cfg.slurm_extra
    if not isinstance(extra, tuple) or not all(isinstance(line, str) for line in extra):
        raise _refuse("slurm_extra", f"slurm_extra {shown(extra)} is not allowed: give a list of sbatch options, "
                      "each starting with --")
    if len(extra) > MAX_EXTRA_LINES:
        raise _refuse("slurm_extra", f"slurm_extra has {len(extra)} lines: at most {MAX_EXTRA_LINES} are allowed")
    for line in extra:
        if not PRINTABLE.fullmatch(line) or len(line) > MAX_EXTRA_LINE_LENGTH:
            raise _refuse("slurm_extra", f"slurm_extra line {shown(line)} is not allowed: each line holds sbatch "
                          "options, each starting with - or --, e.g. --constraint=a100, on one line of printable "
                          f"text (at most {MAX_EXTRA_LINE_LENGTH} characters)")
    try:
        options = read_sbatch_lines(extra)
    except SbatchLineError as exc:
        raise _refuse("slurm_extra", f"slurm_extra line {shown(extra[exc.line])} is not allowed: {exc}") from None
    for option in options:
        if option.sets in SET_BY_PARALLAX:
            what = option.written.split("=", 1)[0]
            named = "" if what == f"--{option.sets}" else f" ({what} is sbatch's --{option.sets})"
            raise _refuse("slurm_extra", f"slurm_extra line {shown(extra[option.line])} is not allowed: it sets "
                          f"--{option.sets}{named}, and {SET_BY_PARALLAX[option.sets]}")
    if cfg.where != "slurm":
        return
    known = find(cfg.strategy)
    if known is None:
        return  # RunConfig names the strategies there are
    if not known.distributed and cfg.slurm_nodes > 1:
        raise _refuse("slurm_nodes", f"slurm_nodes {cfg.slurm_nodes} is not allowed with strategy {cfg.strategy}: it "
                      "runs in one process, a one-task job on one node; use 1 node, or ddp, fsdp or pp to span nodes")
    if cfg.uses_cuda and cfg.slurm_gpus_per_node < 1:
        raise _refuse("slurm_gpus_per_node", "slurm_gpus_per_node 0 is not allowed with GPU devices: ask for 1 or "
                      "more GPUs per node, or train on cpu")
    if not cfg.uses_cuda and cfg.slurm_gpus_per_node > 0:
        raise _refuse("slurm_gpus_per_node", f"slurm_gpus_per_node {cfg.slurm_gpus_per_node} is not allowed with "
                      "CPU devices: use 0, or --devices cuda")
    processes = training_processes_per_node(cfg)
    if cfg.slurm_cpus_per_task and cfg.slurm_cpus_per_task < processes:
        kind = "GPU" if cfg.uses_cuda else "CPU"
        raise _refuse("slurm_cpus_per_task", f"slurm_cpus_per_task {cfg.slurm_cpus_per_task} is not allowed: it "
                      f"gives each of the {processes} {kind} training processes on a node less than one core; ask "
                      f"for at least {processes}, or 0 for what the run needs ({needed_cpus(cfg)}: "
                      f"{processes} × (1 + {cfg.num_workers} loader workers))")
    if known.staged and cfg.slurm_nodes * processes_per_node(cfg) < 2:
        raise _refuse("slurm_nodes", f"strategy {cfg.strategy} needs at least 2 processes, one per stage: use 2 or "
                      "more nodes or processes per node")


def processes_per_node(cfg: Any) -> int:
    """The devices a job trains on on each node: one per GPU asked for, or on CPUs the run's devices spread over
    its nodes (at least one each). Under ddp, fsdp and pp, torchrun starts a process for each; single, dp and mp
    use them from their one process (single takes the first)."""
    if cfg.slurm_gpus_per_node > 0:
        return cfg.slurm_gpus_per_node
    return max(1, len(cfg.devices) // max(1, cfg.slurm_nodes))


def training_processes_per_node(cfg: Any) -> int:
    """The training processes on each node: torchrun's, one per device, under ddp, fsdp and pp; one under single,
    dp and mp, whatever the devices it uses."""
    known = find(cfg.strategy)
    return processes_per_node(cfg) if known is None or known.distributed else 1


def needed_cpus(cfg: Any) -> int:
    """CPU cores a node of the job needs: one for each training process and one for each of its loader workers
    (the validation loader's workers wait while the training loader's work)."""
    return training_processes_per_node(cfg) * (1 + cfg.num_workers)


def cpus_per_node(cfg: Any) -> int:
    """The CPU cores the job asks for on each node (sbatch and srun --cpus-per-task): the field's, else what the
    run needs."""
    return cfg.slurm_cpus_per_task or needed_cpus(cfg)
