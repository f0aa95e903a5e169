"""Command line: train in the foreground or the background, cancel, list and export runs.

    parallax run --dataset digits --model resnet18 --strategy ddp --devices cpu,cpu \\
        --epochs 5 --batch-size 128 --lr 1e-3
    parallax launch --strategy ddp --devices cpu,cpu --epochs 20   # returns at once
    parallax search --param lr=1e-4:1e-1:log --param batch_size=32,64 --trials 8 --pruner median
    parallax cancel 8
    parallax list --status completed --tag baseline --json   # one JSON object a line
    parallax predict 7 photo.png          # a class per image, with the run's preprocessing
    parallax predict 7 --folder holdout/  # accuracy on a folder of class sub-folders
    parallax export 7
    parallax export 7 --csv out/     # epochs.csv, steps.csv, system.csv
    parallax estimate --model resnet50 --image-size 224 --batch-size 256 --strategy ddp --devices 0,1

``python -m trainer_backend`` takes the same commands; every message names the command as users type it,
``parallax`` (``PROG``).

Each command imports what it needs inside its function: a bad flag is refused before torch, timm or
the database are loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from contract.config import STRATEGIES, ConfigError, RunConfig, parse_devices, shown, shown_length
from contract.fields import FIELDS, Field
from trainer_backend.rank.plugins import load_plugins
from contract.printable import one_line, printable_lines, shown_name
from contract.python_process import leave_without_shutdown
from trainer_backend.supervisor.startup import engine_imports
from contract.storage import DiskFullError, check_export_dir
from contract.strategy_specs import spec as strategy_spec
from contract.strategy_specs import distributed_base, sweep_base_for
from contract.user_paths import user_path, with_absolute_paths
from trainer_backend.supervisor.model_check import check_model_before_launch

USER_ERRORS: tuple[type[Exception], ...] = (ValueError, LookupError, FileNotFoundError, DiskFullError)
MAX_CONFIG_FILE_BYTES = 2**20
# Longer than any flag needs (a list of 4,096 devices is under 50,000 characters), far shorter than
# what would cost memory or time to echo or search.
MAX_ARGUMENT_LENGTH = 65_536
PROG = "parallax"  # the command's one name in usage lines and messages, however it was started
_BYTE_ORDER_MARKS = {"UTF-32": b"\xff\xfe\x00\x00", "UTF-16": b"\xff\xfe", "UTF-16 (big-endian)": b"\xfe\xff"}


class OneLineParser(argparse.ArgumentParser):
    """Bad flags end in one line naming the flag and what is allowed, not the whole usage text."""

    def error(self, message: str):
        # argparse quotes the value it refuses: a long one is shortened, as every message here is
        message = re.sub(r"'([^']{61,})'", lambda m: shown(m.group(1)), message)
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def run_id_arg(text: str) -> int:
    """argparse type for a run id: a whole number a database row can hold, else one line saying so."""
    from db.store import MAX_ID, parse_id

    value = parse_id(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"run id {text!r} is not allowed: give a whole number from 1 to {MAX_ID}")
    return value


def path_arg(text: str) -> Path:
    """argparse type for a path a user gives: absolute against the folder the command runs in (user_paths)."""
    return Path(user_path(text))


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per field of the catalogue, with its help, bounds and default; default=None everywhere, so
    that only flags the user typed override --config."""
    parser.add_argument("--config", type=path_arg, help="JSON file with config fields; flags given here override "
                        "it; its relative paths, as the flags', are from the folder the command runs in")
    for spec in FIELDS.values():
        if spec.parse is None:
            parser.add_argument(spec.flag, action=argparse.BooleanOptionalAction, default=None, help=flag_help(spec))
        else:
            parser.add_argument(spec.flag, type=spec.parse, choices=flag_choices(spec), help=flag_help(spec))


def flag_choices(spec: Field) -> list[str] | None:
    """The values argparse accepts for a flag: its field's list, or the strategy registry's names."""
    if spec.registry == "strategies":
        return list(STRATEGIES)
    return list(spec.choices) if spec.choices is not None else None


def flag_help(spec: Field) -> str:
    """The field's help, then its bounds and default: 'Passes over the training images (a whole number from 1
    to 10000; default 3).'; the strategies' help names each one."""
    text = spec.help
    if spec.registry == "strategies":
        text = text.rstrip(".") + ": " + " | ".join(f"{name}: {what}" for name, what in STRATEGIES.items())
    text = text.rstrip(".")
    notes = [spec.allowed] if spec.kind in (int, float) and None not in (spec.low, spec.high) else []
    if spec.kind is not bool and spec.default not in (None, ()):
        default = spec.default
        shown_default = ",".join(default) if isinstance(default, tuple) else f"{default:g}" if isinstance(
            default, float) else default
        notes.append(f"default {shown_default}")
    if notes:
        text += f" ({'; '.join(notes)})"
    return (text + ".").replace("%", "%%")  # argparse formats help with %


def config_from_args(args: argparse.Namespace, *, sweep: bool = False, world=None) -> RunConfig:
    """The RunConfig the flags (and --config) ask for; under torchrun (``world``) its devices are
    one per process of torchrun's world, of the kind --devices names."""
    values: dict = {}
    if args.config is not None:
        values = read_config_file(args.config)
    for name in RunConfig.__dataclass_fields__:
        given = getattr(args, name, None)
        if given is not None:
            values[name] = given
    if sweep:
        # The base of a sweep only has to be valid for some strategy; each run's strategy and
        # devices are set (and validated) per strategy before anything is launched.
        several = len(parse_devices(values.get("devices", RunConfig.devices))) > 1
        values["strategy"] = (distributed_base() if values.get("where") == "slurm" else
                              sweep_base_for(2 if several else 1)).name
    if world is not None:
        from contract.world import values_for_world

        values = values_for_world(values, world)
    # Before any check reads them, and as the run will store them: the processes that train run elsewhere.
    return with_absolute_paths(RunConfig.from_dict(values))


def read_config_file(path: Path) -> dict:
    """The fields a --config file holds; anything else (too big, not UTF-8, not JSON, nested past
    reason, not an object) is one ConfigError naming the file."""
    name = shown(str(path), 240)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CONFIG_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError("config", f"cannot read config file {name}: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_FILE_BYTES:
        raise ConfigError("config", f"config file {name} is larger than {MAX_CONFIG_FILE_BYTES // 2**20} MiB: a "
                          "config is a small JSON object of fields")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        saved_as = next((f" (it starts with a {bom} byte-order mark)" for bom, mark in _BYTE_ORDER_MARKS.items()
                         if raw.startswith(mark)), "")
        raise ConfigError("config", f"config file {name} is not UTF-8 text{saved_as}: byte {exc.start} cannot be "
                          "decoded; save it as UTF-8") from None
    try:
        values = json.loads(text)
    except RecursionError:
        raise ConfigError("config", f"config file {name} nests its values too deeply to read: a config is a flat "
                          "JSON object of fields") from None
    except ValueError as exc:  # JSONDecodeError, and Python's limit on the digits of a whole number
        why = str(exc) if len(str(exc)) <= 120 else str(exc)[:119] + "…"
        raise ConfigError("config", f"config file {name} is not valid JSON: {why}") from None
    if not isinstance(values, dict):
        raise ConfigError("config", f"config file {name} must hold a JSON object")
    return values


def _refuse_outsized_arguments(argv: list[str]) -> None:
    """A value longer than any flag can need is refused before argparse echoes it whole."""
    for index, value in enumerate(argv):
        if len(value) > MAX_ARGUMENT_LENGTH:
            flag = argv[index - 1] if index and argv[index - 1].startswith("--") else "an argument"
            raise ConfigError("argv", f"{flag} {shown_length(value)} is not allowed: a value on the command line "
                              f"has at most {MAX_ARGUMENT_LENGTH:,} characters")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description="Parallax training engine")
    parser.add_argument("--db", help="SQLAlchemy database URL (default: PARALLAX_DB_URL, else SQLite in PARALLAX_HOME)")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train in the foreground; ends with 'run_id=N status=S'")
    _add_config_flags(run)
    run.add_argument("--quiet", action="store_true", help="print only the final run_id line")
    run.add_argument("--resume-job", action="store_true",
                     help="under torchrun: take over the newest run of this --rdzv-id with the same training if it "
                     "was lost or failed, and resume it from its last finished epoch (a new job otherwise starts "
                     "a new run)")
    launch = sub.add_parser("launch", help="start the run in the background (queued until its devices are "
                            "free); prints 'run_id=N status=queued' and returns")
    _add_config_flags(launch)
    sweep = sub.add_parser("sweep", help="run one config under several strategies, one after another, "
                           "then print the scaling report")
    _add_config_flags(sweep)
    sweep.add_argument("--strategies", required=True, help="comma list, e.g. single,ddp,mp,pp,fsdp")
    sweep.add_argument("--device-counts", help="also sweep over device counts, e.g. 1,2,4: each multi-device strategy "
                       "runs once per count (on CPU the devices are that many cpu processes; on GPUs the first N of "
                       "--devices); single runs once, on one device")
    sweep.add_argument("--target-acc", type=float, default=0.9, help="for 'time to target accuracy' (default 0.9)")
    sweep.add_argument("--report", type=path_arg, help="also write the report as a self-contained HTML file")
    search = sub.add_parser("search", help="search fields for the best validation accuracy (or the fastest settings "
                            "that fit, --speed): each trial an ordinary run, drawn by Optuna, hopeless ones pruned")
    _add_config_flags(search)
    from trainer_backend.control.search_command import add_search_flags

    add_search_flags(search)
    estimate = sub.add_parser("estimate", help="peak memory per device of a run's flags, before launching: "
                              "parameters, gradients, optimizer state, activations, communication buffers; "
                              "no GPU touched, no weights read")
    _add_config_flags(estimate)
    estimate.add_argument("--strategies", help="estimate each of these strategies on the devices a sweep gives "
                          "it, e.g. single,ddp,fsdp,mp,pp")
    estimate.add_argument("--json", action="store_true", help="print the estimate as JSON")
    cancel = sub.add_parser("cancel", help="stop a queued or running run and every process it started")
    cancel.add_argument("run_id", type=run_id_arg)
    resume = sub.add_parser("resume", help="continue a failed, cancelled or lost run from its last finished epoch, "
                            "as the same run, in the background; ends with 'run_id=N status=queued'")
    resume.add_argument("run_id", type=run_id_arg)
    resume.add_argument("--devices", help="resume on these devices instead (ddp, fsdp and dp take any number; "
                        "mp and pp as many as they have stages)")
    export = sub.add_parser("export", help="print a run as JSON: config, status, error, per-epoch "
                            "metrics, per-step points and system samples")
    export.add_argument("run_id", type=run_id_arg)
    export.add_argument("--profile-dir", type=path_arg, help="also write the run's profile here: "
                        "trace-rank<R>.json.gz (Perfetto, chrome://tracing), ops.csv and report.html")
    export.add_argument("--csv", type=path_arg, metavar="DIR", help="write the run as CSV files for spreadsheets "
                        "instead of printing JSON: epochs.csv, steps.csv (per-step points) and system.csv "
                        "(a row per system sample, a column per process and GPU figure)")
    listing = sub.add_parser("list", help="one line per run, newest first, with its best validation accuracy and "
                             "images/s")
    listing.add_argument("--status", action="append", help="only runs in this status: queued, running, completed, "
                         "failed, cancelled or lost (repeat for several)")
    listing.add_argument("--tag", action="append", help="only runs with this tag (repeat for any of several)")
    listing.add_argument("--json", action="store_true", help="print one JSON object per run, a line each (JSON "
                         "lines, for jq)")
    predict = sub.add_parser("predict", help="classify image files with a run's best checkpoint and the run's own "
                             "preprocessing; with --folder, the accuracy on a folder of class sub-folders")
    predict.add_argument("run_id", type=run_id_arg)
    predict.add_argument("images", nargs="*", type=path_arg, help="image files: one line each, 'PATH CLASS "
                         "PROBABILITY'")
    predict.add_argument("--folder", type=path_arg, help="a folder with one sub-folder per class (the run's class "
                         "names): prints the accuracy over its images, and per class")
    predict.add_argument("--json", action="store_true", help="print the predictions (or the accuracy) as JSON")
    supervisor = sub.add_parser("supervisor", help=argparse.SUPPRESS)  # what `launch` starts, detached
    supervisor.add_argument("run_id", type=run_id_arg)
    supervisor.add_argument("--data-roots", help="launched from the dashboard: refuse dataset folders outside these")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        _refuse_outsized_arguments(argv)
    except ConfigError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    commands = {"run": _cmd_run, "launch": _cmd_launch, "sweep": _cmd_sweep, "search": _cmd_search, "cancel": _cmd_cancel, "resume": _cmd_resume,
                "supervisor": _cmd_supervisor, "export": _cmd_export, "list": _cmd_list, "estimate": _cmd_estimate,
                "predict": _cmd_predict}
    try:
        load_plugins()
        if args.command in ("run", "launch", "sweep", "search"):
            from trainer_backend.control.lifecycle import check_environment

            check_environment()  # a bad PARALLAX_* number: one line before any run is recorded
        if args.command in ("launch", "sweep", "search") and _under_torchrun():
            raise ValueError(f"'{args.command}' starts background runs on this machine; under torchrun use "
                             "'run', which joins torchrun's world")
        return commands[args.command](args)
    except USER_ERRORS as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)  # names from the outside world cannot forge a line
        return 2
    except Exception as exc:
        problem = _database_problem(exc, args.db)
        if problem is None:
            raise
        print(f"error: {one_line(problem)}", file=sys.stderr)
        return 2


def _database_problem(exc: Exception, url: str | None) -> str | None:
    """One line for a database that cannot be opened, or that failed a command after it opened (it
    became read-only or unreachable, refused a value); None for any other error."""
    from sqlalchemy.exc import SQLAlchemyError

    from db.access import DatabaseUnavailable, describe_failure
    from db.connection import DatabaseLockedError
    from contract.environment import database_url

    if isinstance(exc, (DatabaseUnavailable, DatabaseLockedError)):  # locked, full or read-only: it says why
        return str(exc)
    if isinstance(exc, SQLAlchemyError):
        return describe_failure(database_url(url), exc, opened=True)  # open_database raises DatabaseUnavailable
    return None


def open_database(url: str | None):
    """The engine, or DatabaseUnavailable naming the database (imported here: a bad flag stays instant)."""
    from db.access import open_database as open_or_explain

    return open_or_explain(url)


def _under_torchrun() -> bool:
    from contract.world import torchrun_world

    world = torchrun_world()
    return world is not None and world.world_size > 1


def _cmd_run(args: argparse.Namespace) -> int:
    from contract.world import refuse, torchrun_world

    world = torchrun_world()
    try:
        config = config_from_args(args, world=world)  # refuse bad values before torch and timm are even imported
    except ConfigError as exc:
        if world is None:
            raise
        return refuse(world, exc)  # one line per machine, not one per process
    if world is not None and world.joined_by(config):
        with engine_imports():
            from trainer_backend.supervisor.torchrun import run_in_world

        # Done, stopped or refused, this process of the job has recorded what it had to: it leaves
        # without interpreter shutdown, which can abort a process of a gloo world (see that function).
        leave_without_shutdown(run_in_world(config, world, db_url=args.db, echo=not args.quiet,
                                            resume_job=args.resume_job))
    if config.where == "slurm":
        from trainer_backend.control.slurm_job import check_world, in_one_task_job, one_task

        if world is None and one_task(config) and in_one_task_job():
            # The one task of a job of single, dp or mp (its script runs this without torchrun).
            with engine_imports():
                from trainer_backend.supervisor.torchrun import run_one_task_job

            return run_one_task_job(check_world(config), db_url=args.db, echo=not args.quiet)
        raise ConfigError("where", "where slurm submits the run to Slurm: use 'launch' (or 'sweep'), which return "
                          "at once; 'run' trains in the foreground on this machine")
    if args.resume_job:
        raise ConfigError("resume_job", "--resume-job takes over a run of a torchrun job: use it under torchrun "
                          "with --strategy ddp, fsdp or pp and the job's --rdzv-id")
    check_model_before_launch(config)  # your own model, in a child process, before a run is recorded
    open_database(args.db)
    with engine_imports():
        from trainer_backend.supervisor.runner import execute_run

    run_id, status = execute_run(config, db_url=args.db, echo=not args.quiet)
    if status != "completed":
        from db import make_engine, store

        error = store.get_run(make_engine(args.db), run_id).error or ""
        print(f"error: {printable_lines(error)}", file=sys.stderr)
    print(f"run_id={run_id} status={status}", flush=True)
    return 0 if status == "completed" else 1


def _cmd_launch(args: argparse.Namespace) -> int:
    from trainer_backend.control.lifecycle import launch

    config = config_from_args(args)
    check_model_before_launch(config)  # your own model, in a child process, before it is queued
    open_database(args.db)
    run_id = launch(config, db_url=args.db)
    if config.where == "slurm":
        from db import make_engine, store
        from trainer_backend.control.slurm_job import slurm_info

        info = slurm_info(store.get_run(make_engine(args.db), run_id)) or {}
        print(f"run_id={run_id} status=queued slurm_job={info.get('job_id')}", flush=True)
        return 0
    print(f"run_id={run_id} status=queued", flush=True)
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    import time

    from db import run_state, make_engine, store

    from trainer_backend.control.lifecycle import cancel, launch_sweep, parse_device_counts, sweep_configs

    config = config_from_args(args, sweep=True)
    device_counts = parse_device_counts(args.device_counts)
    if not 0 < args.target_acc <= 1:  # also refuses nan
        raise ValueError(f"--target-acc {args.target_acc} is not allowed: give a validation accuracy in (0, 1], "
                         "e.g. 0.9")
    if args.report is not None and args.report.is_dir():
        raise ValueError(f"--report {args.report} is a folder: give the path of the HTML file to write")
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    configs = sweep_configs(config, strategies, device_counts)  # every run's config refused or accepted before any is recorded
    for staged_or_first in [c for i, c in enumerate(configs) if i == 0 or strategy_spec(c.strategy).staged]:
        check_model_before_launch(staged_or_first)  # your own model; mp and pp also cut it into stages
    open_database(args.db)
    sweep_id, run_ids = launch_sweep(config, strategies, db_url=args.db, device_counts=device_counts)
    engine = make_engine(args.db)
    how = "one Slurm job array" if config.where == "slurm" else "they run one after another"
    print(f"sweep_id={sweep_id} runs={','.join(map(str, run_ids))} (queued; {how})", flush=True)
    pending = list(run_ids)
    try:
        while pending:
            run_state.mark_lost_runs(engine)
            watch_slurm(engine)
            for run_id in list(pending):
                run = store.get_run(engine, run_id)
                if run.status not in run_state.ACTIVE_STATUSES:
                    print(f"run_id={run_id} status={run.status}", flush=True)
                    if run.error:
                        print(f"  {run.strategy}: {one_line(run.error.splitlines()[0])}", flush=True)
                    pending.remove(run_id)
            time.sleep(1.0)
    except KeyboardInterrupt:
        for run_id in pending:
            try:
                cancel(run_id, db_url=args.db)
            except ValueError as exc:  # marked cancelled, but another user's process: say so, go on
                print(f"error: {exc}", file=sys.stderr)
        print(f"sweep_id={sweep_id} cancelled", flush=True)
        return 1
    from reports.scaling_forecast import format_forecast, sweep_forecast
    from reports.sweep_report import format_table, mfu_note, strategy_advice, sweep_html, sweep_table

    table = sweep_table(engine, sweep_id, target_acc=args.target_acc)
    print(format_table(table))
    if note := mfu_note(table):
        print(note)
    print(format_forecast(sweep_forecast(engine, sweep_id)))
    print(strategy_advice(table))
    if args.report is not None:
        from contract.storage import write_export

        write_export(args.report, sweep_html(engine, sweep_id, target_acc=args.target_acc).encode(), "sweep report")
        print(f"wrote {args.report}", file=sys.stderr)
    return 0 if (table["status"] == "completed").all() else 1


def _cmd_search(args: argparse.Namespace) -> int:
    from trainer_backend.control.search_command import run_search_command

    return run_search_command(args, lambda sweep: config_from_args(args, sweep=sweep), open_database)


def _cmd_cancel(args: argparse.Namespace) -> int:
    from trainer_backend.control.lifecycle import cancel

    print(f"run_id={args.run_id} status={cancel(args.run_id, db_url=args.db)}", flush=True)
    return 0


def _cmd_resume(args: argparse.Namespace) -> int:
    from trainer_backend.control.lifecycle import resume

    open_database(args.db)
    run_id = resume(args.run_id, db_url=args.db, devices=args.devices)
    print(f"run_id={run_id} status=queued", flush=True)
    return 0


def _cmd_supervisor(args: argparse.Namespace) -> int:
    from db import make_engine
    from contract.environment import database_url
    from trainer_backend.supervisor.liveness import claim_if_free

    # Before Parallax's imports (seconds of CPU): a run whose devices are free leaves the queue now.
    claim_if_free(make_engine(database_url(args.db)), args.run_id)
    with engine_imports():
        from trainer_backend.supervisor.runner import work

    roots = [Path(p) for p in args.data_roots.split(os.pathsep)] if args.data_roots is not None else None
    status = work(args.run_id, db_url=args.db, data_roots=roots)
    print(f"run_id={args.run_id} status={status}", flush=True)
    return 0 if status == "completed" else 1


def _engine_with_fresh_states(url: str | None):
    """The engine, after marking runs whose process died as lost: a read never shows a dead run as running."""
    from db import run_state

    engine = open_database(url)
    run_state.mark_lost_runs(engine)
    watch_slurm(engine)
    return engine


def watch_slurm(engine) -> None:
    """Runs sent to Slurm whose job has ended without them recording it: marked with Slurm's final state."""
    from trainer_backend.control.slurm_status import watch_slurm_runs

    watch_slurm_runs(engine)


def _cmd_export(args: argparse.Namespace) -> int:
    from db import store

    for flag, directory in (("--profile-dir", args.profile_dir), ("--csv", args.csv)):
        if directory is not None:
            check_export_dir(directory, flag)  # before any output: nothing half-done
    engine = _engine_with_fresh_states(args.db)
    exported = store.export_run(engine, args.run_id)
    if args.csv is None:
        print(json.dumps(exported, indent=2))
    else:
        from reports.run_csv import write_run_csv

        for path in write_run_csv(exported, args.csv):
            print(f"wrote {path}")
    if args.profile_dir is not None:
        from reports.profile import write_profile_dir

        for path in write_profile_dir(engine, args.run_id, args.profile_dir):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def _cmd_estimate(args: argparse.Namespace) -> int:
    """Peak memory per device, for one strategy or several, with each device's free memory. Of
    several strategies, one that cannot be estimated (a model whose layers do not run in sequence,
    under mp or pp) is named in one line on stderr, and the others are still shown; exit 2 then."""
    config = config_from_args(args, sweep=bool(args.strategies))
    with engine_imports():
        from trainer_backend.rank.forecast.memory_estimate import dataset_shape, estimate_memory, stored_data
        from trainer_backend.rank.forecast.free_memory import available_memory_mb, fits
        from trainer_backend.rank.forecast.memory_fit import format_table, table_rows

    if args.strategies:
        from trainer_backend.control.lifecycle import sweep_configs

        configs = sweep_configs(config, [s.strip() for s in args.strategies.split(",") if s.strip()])
    else:
        configs = [config]
    num_classes, in_chans = dataset_shape(config)
    stored = stored_data(config)  # the strategies share the dataset and the GPUs
    reports, refused = [], []
    for each in configs:
        try:
            estimate = estimate_memory(each, num_classes=num_classes, in_chans=in_chans, stored=stored)
        except ValueError as exc:
            if len(configs) == 1:
                raise
            refused.append(f"strategy {each.strategy}: {exc}")
            continue
        reports.append((each, estimate, available_memory_mb(each)))
    if args.json:
        print(json.dumps([{**estimate.to_dict(), "devices_asked": list(each.devices), "batch_size": each.batch_size,
                           "table": table_rows(estimate, free),
                           "fits": [{"device": f.device, "needed_mb": round(f.needed_mb, 1),
                                     "free_mb": round(f.free_mb, 1), "fits": f.fits, "verdict": f.verdict}
                                    for f in fits(estimate, free)]}
                          for each, estimate, free in reports], indent=2))
    else:
        for index, (_each, estimate, free) in enumerate(reports):
            if index:
                print()
            print(format_table(estimate, free, notes=False))
        for note in dict.fromkeys(note for _, estimate, _ in reports for note in estimate.notes):
            print(note)
    for line in refused:
        print(f"error: {one_line(line)}", file=sys.stderr)
    return 2 if refused else 0


def _cmd_list(args: argparse.Namespace) -> int:
    """One line (or JSON object) per run, newest first, with the figures the Runs page shows."""
    from db.dashboard import RunFilters, run_table
    from db.tables import RUN_STATUSES

    for status in args.status or ():
        if status not in RUN_STATUSES:
            raise ValueError(f"--status {shown(status)} is not allowed: choose from {', '.join(RUN_STATUSES)}")
    filters = RunFilters(statuses=tuple(args.status or ()), tags=tuple(args.tag or ()))
    rows = [{"run_id": row["id"], "status": row["status"], "strategy": row["strategy"], "model": row["model"],
             "dataset": row["dataset"], "tags": row["tags"], "epochs_done": row["epochs_done"],
             "best_val_acc": row["best_val_acc"], "images_per_s": row["mean_images_per_s"],
             "created_at": row["created_at"].isoformat()}
            for row in run_table(_engine_with_fresh_states(args.db), filters)]
    if args.json:  # JSON lines: one object a line, as `jq` and `grep` read a listing
        for row in rows:
            print(json.dumps(row))
        return 0
    for row in rows:
        accuracy = "-" if row["best_val_acc"] is None else f"{row['best_val_acc']:.4f}"
        speed = "-" if row["images_per_s"] is None else f"{row['images_per_s']:.1f}"
        print(f"run_id={row['run_id']} status={row['status']} strategy={row['strategy']} "
              f"model={shown_name(row['model'])} dataset={shown_name(row['dataset'])} best_val_acc={accuracy} "
              f"images_per_s={speed}")
    return 0


def _cmd_predict(args: argparse.Namespace) -> int:
    """A class per image file, or the accuracy on a labelled folder, from the run's best checkpoint."""
    from db import store
    from trainer_backend.control.housekeeping import run_file

    if not args.images and args.folder is None:
        raise ValueError("predict needs image files or --folder FOLDER: e.g. predict 7 photo.png, or "
                         "predict 7 --folder holdout/")
    if args.images and args.folder is not None:
        raise ValueError("predict takes image files or --folder FOLDER, not both")
    engine = open_database(args.db)
    if store.get_run(engine, args.run_id) is None:
        raise LookupError(f"no run with id {args.run_id}: 'list' shows the runs")
    checkpoint = run_file(engine, args.run_id, "best.pt")
    if not checkpoint.is_file():
        raise FileNotFoundError(f"run {args.run_id} has no best checkpoint ({checkpoint}): it finished no epoch "
                                "with a validation accuracy")
    with engine_imports():
        from trainer_backend.control.predict import Predictor

    predictor = Predictor(checkpoint, args.run_id)
    if args.folder is not None:
        accuracy, images, per_class = predictor.folder_accuracy(str(args.folder))
        if args.json:
            print(json.dumps({"run_id": args.run_id, "folder": str(args.folder), "images": images,
                              "accuracy": accuracy, "per_class_accuracy": per_class}, indent=2))
        else:
            print(f"accuracy={accuracy:.4f} images={images}")
            for name, value in per_class.items():
                print(f"  {shown_name(name)}: {value:.4f}")
        print(predictor.changes(), file=sys.stderr)  # what was done to the images, apart from what programs read
        return 0
    predictions = predictor.predict(args.images)
    if args.json:
        print(json.dumps([{"path": str(p.path), "class": p.class_name, "probability": p.probability}
                          for p in predictions], indent=2))
    else:
        for p in predictions:
            print(f"{shown_name(str(p.path))} {shown_name(p.class_name)} {p.probability:.4f}")
    print(predictor.changes(), file=sys.stderr)
    return 0
