"""``parallax search``: its flags, and the command that checks a search, records it and drives it here (or in
the background with ``--detach``), or resumes one (``--resume N``).

    parallax search --dataset digits --epochs 3 --param lr=1e-4:1e-1:log --param batch_size=32,64,128 \\
        --trials 8 --at-once 2 --pruner median
    parallax search --speed --devices cpu,cpu --epochs 3          # the fastest settings that fit
    parallax search --resume 4                                    # carry on after its driver was stopped or killed

Lines it prints: ``search_id=N ...`` first, one ``trial=K run_id=R ...`` line as each trial starts and ends,
then the answer and ``search_id=N status=finished``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from contract.search_space import (DEFAULT_TIMED_STEPS, MAX_AT_ONCE, MAX_TRIALS, OBJECTIVES, PRUNERS, SAMPLERS,
                                   SearchSpace, parse_param)

# The flags that define a search: with --resume, the search's own are used, and these are refused.
DEFINING = ("param", "objective", "target_acc", "trials", "timeout_s", "at_once", "sampler", "pruner",
            "sampler_seed", "timed_steps")


def add_search_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--param", action="append", metavar="NAME=LOW:HIGH[:log] | NAME=A,B,C",
                        help="a field to vary, as a range (log-uniform with :log, e.g. lr=1e-4:1e-1:log) or choices "
                        "(e.g. batch_size=32,64,128 or model=resnet18,mobilenetv3_small_100); repeat for several")
    parser.add_argument("--objective", choices=list(OBJECTIVES),
                        help="what to optimise: " + "; ".join(f"{k}: {v[1]}" for k, v in OBJECTIVES.items())
                        + " (default val_acc; images_per_s with --speed)")
    parser.add_argument("--target-acc", type=float, default=None, help="for time_to_acc (default 0.9)")
    parser.add_argument("--trials", type=int, help=f"how many trials (default 20; at most {MAX_TRIALS})")
    parser.add_argument("--timeout-s", type=float, help="no trial starts after this many seconds from the search's "
                        "start (default 0: no wall-time budget)")
    parser.add_argument("--at-once", type=int, help=f"trials queued or training at once (default 1, at most "
                        f"{MAX_AT_ONCE}); they share this machine's queue (PARALLAX_CPU_RUNS CPU runs at a time); on "
                        "Slurm, one job array with this many at once")
    parser.add_argument("--sampler", choices=SAMPLERS, help="how Optuna draws trials (default tpe)")
    parser.add_argument("--pruner", choices=PRUNERS, help="which trials end early as pruned (default none)")
    parser.add_argument("--sampler-seed", type=int, help="the sampler's seed (default 0)")
    parser.add_argument("--speed", action="store_true", help="find the fastest settings that fit: short timed runs "
                        "of every combination of the --param choices (default: strategy, batch size, "
                        "channels_last; AMP and compile on GPUs), those the memory forecast says will not fit skipped")
    parser.add_argument("--timed-steps", type=int, help=f"a speed trial's timed steps after its warm-up epoch "
                        f"(default {DEFAULT_TIMED_STEPS})")
    parser.add_argument("--resume", type=int, metavar="SEARCH_ID", help="carry on search SEARCH_ID (its driver was "
                        "stopped or killed): trials still training are followed again, new ones drawn to its budget")
    parser.add_argument("--detach", action="store_true", help="drive the search in the background; prints "
                        "'search_id=N status=running' and returns")
    parser.add_argument("--report", type=Path, help="when the search ends, also write its report as an HTML file")
    parser.add_argument("--data-roots", help=argparse.SUPPRESS)  # the dashboard's detached driver


def space_from_args(args: argparse.Namespace) -> SearchSpace:
    defaults = SearchSpace()
    kind = "speed" if args.speed else "hyper"

    def given(name, default):
        value = getattr(args, name)
        return default if value is None else value

    return SearchSpace(
        params=tuple(parse_param(text) for text in args.param or ()), kind=kind,
        objective=given("objective", "images_per_s" if kind == "speed" else defaults.objective),
        target_acc=given("target_acc", defaults.target_acc), trials=given("trials", defaults.trials),
        timeout_s=given("timeout_s", defaults.timeout_s), at_once=given("at_once", defaults.at_once),
        sampler=given("sampler", defaults.sampler), pruner=given("pruner", defaults.pruner),
        seed=given("sampler_seed", defaults.seed), timed_steps=given("timed_steps", defaults.timed_steps))


def run_search_command(args: argparse.Namespace, config_for, open_database) -> int:
    """The command's body: ``config_for(sweep)`` builds the base config from the flags (``sweep``: its strategy is
    the sweeps' base, where the search draws the strategy), ``open_database`` opens (or explains) the database."""
    from trainer_backend.control.search_lifecycle import check_resumable, create_search, drive, start_detached_driver

    if args.report is not None and args.report.is_dir():
        raise ValueError(f"--report {args.report} is a folder: give the path of the HTML file to write")
    if args.resume is not None:
        from contract.config import RunConfig

        config_flags = [name for name in ("config", *RunConfig.__dataclass_fields__) if getattr(args, name, None) is not None]
        given = [name for name in (*DEFINING, *config_flags) if getattr(args, name) not in (None, False)]
        if given or args.speed:
            flag = "--" + (given[0] if given else "speed").replace("_", "-")
            raise ValueError(f"{flag} is not allowed with --resume: a resumed search keeps its own settings")
        open_database(args.db)
        search_id = check_resumable(args.resume, db_url=args.db).id
    else:
        space = space_from_args(args)
        searched = {p.name for p in space.params}
        chooses_strategy = args.strategy is None and ("strategy" in searched or space.kind == "speed")
        base = config_for(chooses_strategy)
        open_database(args.db)
        search_id = create_search(base, space, db_url=args.db)
        print(f"search_id={search_id} (recorded; trials start now)", flush=True)
    roots = [Path(p) for p in args.data_roots.split(os.pathsep)] if args.data_roots is not None else None
    if args.detach:
        start_detached_driver(search_id, db_url=args.db, data_roots=roots)
        print(f"search_id={search_id} status=running (detached: the Search page follows it)", flush=True)
        return 0
    status = drive(search_id, db_url=args.db, data_roots=roots)
    _print_summary(search_id, args)
    print(f"search_id={search_id} status={status}" + (f" (parallax search --resume {search_id} carries on)"
                                                     if status == "stopped" else ""), flush=True)
    return 0 if status == "finished" else 1


def _print_summary(search_id: int, args: argparse.Namespace) -> None:
    import sys

    from contract.environment import database_url
    from db import make_engine
    from db.connection import absolute_database_url
    from db.searches import get_search
    from reports.search_report import search_html, summary_lines, trials_frame

    url = absolute_database_url(database_url(args.db))
    engine = make_engine(url)
    search = get_search(engine, search_id)
    for line in summary_lines(trials_frame(engine, url, search), search):
        print(line, flush=True)
    if args.report is not None:
        from contract.storage import write_export

        write_export(args.report, search_html(engine, url, search_id).encode(), "search report")
        print(f"wrote {args.report}", file=sys.stderr)
