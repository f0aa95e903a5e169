"""The benchmarks that measure something against Parallax's own ``single`` run, in one rotation.

Parallax overhead (plain script), Lightning, the profiler (a profiled run) and DDP on CPU each
compare their contender with the same foreground ``trainer_backend run``: resnet18 on digits at
32x32, batch 128, Adam, 2 epochs, torch's default threads. Run together, they share those engine
runs: one rotation starts the Parallax run and then each benchmark's contenders in turn (Parallax,
plain, Lightning, profiled, ddp, engine, plain, …), five times, and each benchmark pairs its
contender with Parallax run of the same round. Run alone, a benchmark rotates Parallax run
with its own contenders only.

    python bench/shared_runs.py                                    # all four
    python bench/shared_runs.py --only profiler,ddp_cpu            # some of them
    python bench/shared_runs.py --quick                            # one tiny round

A benchmark module taking part defines ``KEY``, ``TITLE``, ``METHOD``, ``contenders(settings,
db_url)`` (its runs, by name), ``fill(report, runs, context)`` (its figures, from its runs and the
engine's under ``runs["parallax"]``) and optionally ``unavailable()`` (a reason to skip, or None).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any
from collections.abc import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import digits_workload, parallax_home, parse_args, prime_dataset_cache, run_parallax  # noqa: E402
from bench.report import Report  # noqa: E402
from bench.stats import alternate  # noqa: E402

MEMBERS = ("overhead", "lightning_compare", "profiler", "ddp_cpu")
PARALLAX = "parallax"


@dataclass
class Context:
    """What a benchmark's ``fill`` may need besides the runs."""

    settings: dict[str, Any]
    db_url: str
    quick: bool


def run(modules: list[ModuleType], description: str = __doc__) -> None:
    """Measure ``modules`` in one rotation around shared engine runs and record each one's figures."""
    args = parse_args(description, _only_flag if len(modules) > 1 else None)
    if len(modules) > 1 and args.only:
        wanted = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = sorted(set(wanted) - set(MEMBERS))
        if unknown:
            sys.exit(f"error: unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(MEMBERS)}")
        modules = [module for module in modules if module.KEY in wanted]
    settings = digits_workload(args.quick, epochs=2)
    reports: dict[ModuleType, Report] = {}
    for module in modules:
        report = Report(module.KEY, module.TITLE, method=module.METHOD)
        reason = getattr(module, "unavailable", lambda: None)()
        if reason:
            report.skip(reason)
            report.finish(args)
        else:
            reports[module] = report
    if not reports:
        return
    shared_with = [module.KEY for module in reports]
    with parallax_home() as home:
        db_url = f"sqlite:///{home / 'parallax.db'}"
        prime_dataset_cache(settings, args.quick)
        contenders: dict[str, Callable[[], Any]] = {PARALLAX: lambda: run_parallax(settings, db_url)}
        for module in reports:
            own = module.contenders(settings, db_url)
            clash = set(own) & set(contenders)
            if clash:
                raise ValueError(f"{module.KEY}: contender name(s) {sorted(clash)} already taken")
            contenders.update(own)
        runs = alternate(contenders, args.repeats)
        context = Context(settings, db_url, args.quick)
        for module, report in reports.items():
            report.settings = {**settings, "repeats": args.repeats,
                               "Parallax runs shared with": ", ".join(k for k in shared_with if k != module.KEY)
                               or "none"}
            module.fill(report, runs, context)
            report.finish(args)


def _only_flag(parser) -> None:
    parser.add_argument("--only", default="", help=f"comma list of: {', '.join(MEMBERS)} (default all)")


def main() -> None:
    run([importlib.import_module(f"bench.{name}") for name in MEMBERS])


if __name__ == "__main__":
    main()
