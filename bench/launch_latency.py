"""Launch latency: from ``python -m trainer_backend launch`` to the run's first training step.

``launch`` is started as a process (the dashboard's Launch button calls the same function) for a
``single`` run and a ``ddp`` run on two CPU processes, in turn, five times each (resnet18 on
digits, dataset cache already built). This process then polls the run's row every 50 ms: the
first step is when the recorded progress reaches step 1. Each run is cancelled as soon as it has
taken its first step. On the way the timeline marks when ``launch`` returned, when the supervisor
claimed the run (its interpreter started and imported the training code), when its checks before
training ended (the "run_id=N ..." line in its log: dataset and model built once), and when the
training process (or rank 0) started (its ``rank0.pid`` file).

Where the time goes inside those phases is measured apart: the import time of the supervisor's
modules (``python -X importtime``), loading the dataset cache, building the model, and for DDP
the parts of a rank's start (``torch.multiprocessing.spawn`` to the rank's first line, the rest
of its imports, gloo rendezvous, data, model and DDP wrap), timed in two spawned probe ranks: a
rank on a GPU starts so; a CPU run's ranks fork from a fork of the supervisor, which has the
Parallax imported.

    python bench/launch_latency.py            # full: 5 launches of each
    python bench/launch_latency.py --quick    # one of each, tiny model
"""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (  # noqa: E402
    PYTHON,
    ROOT,
    child_env,
    digits_workload,
    parallax_command,
    parallax_home,
    parse_args,
    run_id_from,
    run_timed,
)
from bench.machine import CpuShare, process_tree_cpu_s  # noqa: E402
from bench.report import Report  # noqa: E402
from bench.stats import alternate, at_most  # noqa: E402

METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
POLL_S = 0.05
PHASES = ("launch returned", "supervisor claimed the run", "checks before training done", "training process started",
          "first step")


def launch_to_first_step(settings: dict, strategy: str, devices: str, db_url: str, home: Path,
                         cpu: CpuShare) -> dict:
    """Seconds from starting ``launch`` to each mark of the run's timeline."""
    from db import make_engine, store
    from trainer_backend.control.lifecycle import cancel

    engine = make_engine(db_url)
    started = time.perf_counter()
    done = run_timed(parallax_command(
        "launch", "--dataset", settings["dataset"], "--model", settings["model"], "--strategy", strategy,
        "--devices", devices, "--epochs", "1", "--batch-size", str(settings["batch_size"]),
        "--image-size", str(settings["image_size"]), db_url=db_url))
    marks = {"launch returned": time.perf_counter() - started}
    run_id = run_id_from(done.stdout)
    from db.folders import run_folder_name

    folder = home / "runs" / run_folder_name(engine, run_id)
    announce = f"run_id={run_id} {strategy} on"
    try:
        while "first step" not in marks:
            now = time.perf_counter() - started
            if now > 300:
                raise RuntimeError(f"run {run_id} took no step in 300 s; its log:\n{_read(folder / 'run.log')}")
            run = store.get_run(engine, run_id)
            if run.status in ("failed", "lost", "cancelled", "completed") and not (run.progress_step or 0) >= 1:
                raise RuntimeError(f"run {run_id} ended {run.status} before its first step: {run.error}")
            if run.status != "queued":
                marks.setdefault("supervisor claimed the run", now)
            if announce in _read(folder / "run.log"):
                marks.setdefault("checks before training done", now)
            if (folder / "rank0.pid").exists():
                marks.setdefault("training process started", now)
            if (run.progress_step or 0) >= 1:
                marks["first step"] = now
            time.sleep(POLL_S)
    finally:
        # The detached supervisor is not our child: count its CPU as ours, not as other people's load.
        supervisor = store.get_run(engine, run_id).pid
        if supervisor:
            cpu.count_as_own(process_tree_cpu_s(supervisor))
        cancel(run_id, db_url=db_url)  # waits until every process of the run is gone
    # A mark first seen in the same poll as a later one happened no later than it.
    for earlier, later in zip(PHASES[-2::-1], PHASES[:0:-1]):
        marks[earlier] = min(marks.get(earlier, marks[later]), marks[later])
    return marks


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


IMPORT_PACKAGES = ("torch", "timm", "torchvision", "sklearn", "scipy", "pandas", "sqlalchemy", "alembic")


def import_times(module: str = "trainer_backend.supervisor.runner") -> dict[str, float]:
    """Import seconds of ``module`` (by default what the supervisor imports): 'total', and for each
    package in IMPORT_PACKAGES the cumulative time where it is first imported, which includes
    what it pulls in first (so these overlap and do not add up)."""
    done = subprocess.run([PYTHON, "-X", "importtime", "-c", f"import {module}"], cwd=ROOT,
                          env=child_env(), capture_output=True, text=True, timeout=300)
    times: dict[str, float] = {}
    for line in done.stderr.splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)", line)
        if not match:
            continue
        name, seconds = match.group(3), int(match.group(1)) / 1e6
        if not match.group(2):
            times["total"] = times.get("total", 0.0) + seconds
        elif name in IMPORT_PACKAGES and name not in times:
            times[name] = seconds
    return times


def probe_rank(rank: int, port: int, world_size: int, settings: dict, out_dir: str) -> None:
    """What a DDP rank does before its first step, timed (mirrors trainer.main)."""
    entered = time.time()
    import torch
    import torch.distributed as dist

    from trainer_backend.datasets import prepare_data
    from trainer_backend.rank.models import create_model
    from trainer_backend.rank.trainer import main  # noqa: F401  (the rest of a rank's imports)

    imported = time.time()
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, None, False, timeout=datetime.timedelta(minutes=2))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    joined = time.time()
    data = prepare_data(settings["dataset"], image_size=settings["image_size"])
    loaded = time.time()
    model = create_model(settings["model"], num_classes=data.info.num_classes, in_chans=data.info.in_chans)
    torch.nn.parallel.DistributedDataParallel(model)
    wrapped = time.time()
    dist.destroy_process_group()
    stamps = {"entered": entered, "imported": imported, "joined": joined, "loaded": loaded, "wrapped": wrapped}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(stamps))


def rank_start_parts(settings: dict) -> dict[str, float]:
    """Seconds of each part of a DDP rank's start, slowest rank, from two spawned probe ranks."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(minutes=2), wait_for_workers=False)
    with tempfile.TemporaryDirectory() as out_dir:
        spawned = time.time()
        mp.spawn(probe_rank, args=(server.port, 2, settings, out_dir), nprocs=2, join=True)
        ranks = [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(2)]
    del server
    slowest = {key: max(rank[key] for rank in ranks) for key in ranks[0]}
    return {
        "spawn to the rank's first line (interpreter, torch import)": slowest["entered"] - spawned,
        "rest of the rank's imports (timm, SQLAlchemy, the training code)": slowest["imported"] - slowest["entered"],
        "gloo rendezvous (init_process_group)": slowest["joined"] - slowest["imported"],
        "dataset cache load": slowest["loaded"] - slowest["joined"],
        "model build and DDP wrap": slowest["wrapped"] - slowest["loaded"],
    }


def single_start_parts(settings: dict) -> dict[str, float]:
    """Seconds to load the dataset cache and build the model in this (warm) process."""
    from trainer_backend.datasets import prepare_data
    from trainer_backend.rank.models import create_model

    start = time.perf_counter()
    data = prepare_data(settings["dataset"], image_size=settings["image_size"])
    loaded = time.perf_counter()
    create_model(settings["model"], num_classes=data.info.num_classes, in_chans=data.info.in_chans)
    return {"dataset cache load": loaded - start, "model build": time.perf_counter() - loaded}


def phase_lengths(marks: dict[str, float]) -> dict[str, float]:
    lengths, previous = {}, 0.0
    for phase in PHASES:
        lengths[phase] = marks[phase] - previous
        previous = marks[phase]
    return lengths


def main() -> None:
    args = parse_args(__doc__)
    settings = digits_workload(args.quick)
    report = Report("launch_latency", "Launch latency", method=METHOD)
    report.settings = {**settings, "epochs": 1, "repeats": args.repeats, "ddp": "2 CPU processes"}
    with parallax_home() as home:
        db_url = f"sqlite:///{home / 'parallax.db'}"
        from trainer_backend.datasets import prepare_data

        started = time.perf_counter()
        prepare_data(settings["dataset"], image_size=settings["image_size"])
        report.details["dataset_decode_s"] = time.perf_counter() - started
        runs = alternate({
            "single": lambda: launch_to_first_step(settings, "single", "cpu", db_url, home, report.cpu),
            "ddp": lambda: launch_to_first_step(settings, "ddp", "cpu,cpu", db_url, home, report.cpu),
        }, args.repeats)
        imports = import_times("db" if args.quick else "trainer_backend.supervisor.runner")
        singles = single_start_parts(settings)
        ranks = rank_start_parts(settings)

    report.add("single: launch to first step", [m["first step"] for m in runs["single"]], unit=" s",
               target=at_most(10))
    report.add("ddp (2 CPU processes): launch to first step", [m["first step"] for m in runs["ddp"]], unit=" s",
               target=at_most(15))
    for strategy in ("single", "ddp"):
        for phase in PHASES:
            values = [phase_lengths(m)[phase] for m in runs[strategy]]
            report.add(f"{strategy}: {phase} (phase length)", values, unit=" s", headline=False)
    report.add("imports of the supervisor (python -X importtime)", [imports.get("total", 0.0)], unit=" s",
               headline=False)
    for package in IMPORT_PACKAGES:
        if package in imports:
            report.add(f"import {package} (with what it first pulls in)", [imports[package]], unit=" s",
                       headline=False)
    for part, seconds in singles.items():
        report.add(f"single: {part}", [seconds], unit=" s", headline=False)
    for part, seconds in ranks.items():
        report.add(f"ddp rank: {part}", [seconds], unit=" s", headline=False)
    if "timm" in imports:
        report.note(
            f"The supervisor's imports take {imports['total']:.1f} s: torch {imports.get('torch', 0):.1f} s, timm "
            f"{imports['timm']:.1f} s (of which torchvision {imports.get('torchvision', 0):.1f} s: timm's "
            "feature-extraction helpers import torchvision.models, which imports torch._dynamo and sympy), "
            f"SQLAlchemy and Alembic {imports.get('sqlalchemy', 0) + imports.get('alembic', 0):.1f} s. "
            + ("scikit-learn is not imported: the dataset's split is cached with its pixels. " if "sklearn" not in
               imports else f"scikit-learn {imports['sklearn']:.1f} s. ")
            + "A DDP rank on a GPU is a new interpreter (spawn) and pays the same imports again; CPU ranks are "
              "forked from a fork of the supervisor, which has them already.")
    report.details.update({"imports": imports, "timelines": runs, "single_parts": singles, "rank_parts": ranks})
    report.note(f"Decoding the digits into the dataset cache (first run on a machine only) took "
                f"{report.details['dataset_decode_s']:.2f} s; every launch above found the cache.")
    report.note("Phases: 'launch returned' is the launch command's own process; 'supervisor claimed the run' is "
                "the detached supervisor's interpreter start and imports; 'checks before training done' is the "
                "preflight (dataset and model built once, a probe forward); for ddp 'training process started' "
                "is starting the ranks (on CPU forked from a fork of the supervisor, which has the training code imported); "
                "'first step' is the rank's data, model, rendezvous and the step itself.")
    report.finish(args)


if __name__ == "__main__":
    main()
