"""The rules of the Slurm fields (contract/fields.py, section "Slurm") beyond their bounds: names Slurm takes,
its time and memory formats, extra #SBATCH lines, and what a run on Slurm can be.

    check_slurm_options(RunConfig(where="slurm", strategy="ddp", slurm_nodes=2, slurm_time="1:00:00"))

Each refusal is one line naming the value and what is allowed, raised as the config is built, before anything
is submitted. Imports nothing heavy: the Launch form checks with it on every change.
"""

from __future__ import annotations

import re
from typing import Any

from contract.fields import WHERE, split_sbatch_options
from contract.strategy_specs import find

# What sbatch accepts for a partition, account or QoS name (Slurm's own names are letters, digits, _ - .).
NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
MEMORY = re.compile(r"[0-9]{1,9}[KMGT]?")
# sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
TIME = re.compile(r"[0-9]{1,7}(:[0-9]{1,2}){0,2}|[0-9]{1,4}-[0-9]{1,2}(:[0-9]{1,2}){0,2}")
EXTRA = re.compile(r"--[A-Za-z][A-Za-z0-9\-]*(=[\x21-\x7e][\x20-\x7e]*)?")
MAX_EXTRA_LINES = 64
# Options the rendered script sets itself (control/slurm_job.py): a line that changed one would break the job.
SET_BY_PARALLAX = ("job-name", "output", "error", "open-mode", "requeue", "no-requeue", "signal", "nodes",
                   "ntasks", "ntasks-per-node", "array", "parsable", "gpus-per-node", "cpus-per-task", "partition",
                   "time", "mem", "account", "qos", "wrap", "chdir")


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
        if not EXTRA.fullmatch(line) or len(line) > 1000:
            raise _refuse("slurm_extra", f"slurm_extra line {shown(line)} is not allowed: each line is one sbatch "
                          "option starting with --, e.g. --constraint=a100, on one line of printable text")
        option = line[2:].split("=", 1)[0]
        if option in SET_BY_PARALLAX:
            raise _refuse("slurm_extra", f"slurm_extra line {shown(line)} is not allowed: Parallax sets --{option} "
                          "itself (use the Slurm fields, or leave it out)")
    if cfg.where != "slurm":
        return
    known = find(cfg.strategy)
    if known is None or not known.distributed:
        raise _refuse("where", f"where slurm is not allowed with strategy {cfg.strategy}: a Slurm job runs torchrun, "
                      "which ddp, fsdp and pp join; choose one of those")
    if cfg.uses_cuda and cfg.slurm_gpus_per_node < 1:
        raise _refuse("slurm_gpus_per_node", "slurm_gpus_per_node 0 is not allowed with GPU devices: ask for 1 or "
                      "more GPUs per node, or train on cpu")
    if not cfg.uses_cuda and cfg.slurm_gpus_per_node > 0:
        raise _refuse("slurm_gpus_per_node", f"slurm_gpus_per_node {cfg.slurm_gpus_per_node} is not allowed with "
                      "CPU devices: use 0, or --devices cuda")
    processes = processes_per_node(cfg)
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
    """Training processes torchrun starts on each node: one per GPU asked for, or on CPUs the run's devices
    spread over its nodes (at least one each)."""
    if cfg.slurm_gpus_per_node > 0:
        return cfg.slurm_gpus_per_node
    return max(1, len(cfg.devices) // max(1, cfg.slurm_nodes))


def needed_cpus(cfg: Any) -> int:
    """CPU cores a node of the job needs: one for each training process and one for each of its loader workers
    (the validation loader's workers wait while the training loader's work)."""
    return processes_per_node(cfg) * (1 + cfg.num_workers)


def cpus_per_node(cfg: Any) -> int:
    """The CPU cores the job asks for on each node (sbatch and srun --cpus-per-task): the field's, else what the
    run needs."""
    return cfg.slurm_cpus_per_task or needed_cpus(cfg)
