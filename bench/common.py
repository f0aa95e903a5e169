"""What every benchmark script shares to run Parallax: the flags (``parse_args``), a fresh
PARALLAX_HOME, timed subprocesses, Parallax's command line and its exported runs.

    args = parse_args(__doc__)
    with parallax_home() as home:
        run = run_parallax(digits_workload(args.quick), db_url)

The rest lives beside it: ``stats`` (A/B alternation, summaries, targets), ``report`` (the
``Report``, results.json, docs/BENCHMARKS.md), ``machine`` (CPU share, machine description) and
``browser`` (the dashboard in a real server, and chromium).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "bench"
RESULTS_PATH = BENCH_DIR / "results.json"
DOCS_PATH = ROOT / "docs" / "BENCHMARKS.md"
PYTHON = sys.executable
FULL_REPEATS = 5
QUIET_LOAD = 0.5  # 1-minute load average under which the machine counts as quiet


# --- command line ---------------------------------------------------------------------------


def parse_args(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """The flags every benchmark takes: --quick, --repeats, --results."""
    parser = argparse.ArgumentParser(description=description.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny settings and one repeat: checks that the script runs, measures nothing")
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"repeats of each contender (default {FULL_REPEATS}; 1 with --quick)")
    parser.add_argument("--results", type=Path, default=None,
                        help=f"merge the figures into this JSON file (default {RESULTS_PATH.relative_to(ROOT)}; "
                        "none with --quick)")
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    if args.repeats is None:
        args.repeats = 1 if args.quick else FULL_REPEATS
    if args.results is None and not args.quick:
        args.results = RESULTS_PATH
    return args


# --- environment for runs -------------------------------------------------------------------


@contextlib.contextmanager
def parallax_home(prefix: str = "parallax-bench-") -> Iterator[Path]:
    """A fresh PARALLAX_HOME for this process and its children, removed afterwards.

    Benchmark runs never touch the user's database or checkpoints. Datasets come from
    ``PARALLAX_DATA_DIR`` where it is set (a cache keyed by the files and the preprocessing, which a
    benchmark only adds to), else from the fresh home; every benchmark decodes its set before the
    runs it times, so neither changes a figure."""
    home = Path(tempfile.mkdtemp(prefix=prefix))
    saved = {key: os.environ.get(key) for key in ("PARALLAX_HOME", "PARALLAX_DB_URL")}
    os.environ["PARALLAX_HOME"] = str(home)
    os.environ.pop("PARALLAX_DB_URL", None)
    try:
        yield home
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(home, ignore_errors=True)


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a benchmark subprocess: the project importable, output unbuffered,
    and no hub lookups (every model is built from scratch)."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", **extra}


@dataclass
class Timed:
    seconds: float
    stdout: str
    stderr: str


def run_timed(command: list[str], *, timeout: float = 600, env: dict[str, str] | None = None) -> Timed:
    """Run ``command`` to its end and return its wall-clock time; raise with its output if it fails."""
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env or child_env(), capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return Timed(seconds, done.stdout, done.stderr)


def parallax_command(*args: str, db_url: str | None = None) -> list[str]:
    """``python -m trainer_backend [--db URL] ARGS``."""
    db = ["--db", db_url] if db_url else []
    return [PYTHON, "-m", "trainer_backend", *db, *args]


def run_id_from(output: str) -> int:
    """The N of the last ``run_id=N ...`` line the CLI printed."""
    for line in reversed(output.splitlines()):
        if line.startswith("run_id="):
            return int(line.split()[0].split("=", 1)[1])
    raise RuntimeError(f"no run_id line in:\n{output[-2000:]}")


def export_run(run_id: int, db_url: str | None = None) -> dict[str, Any]:
    """What ``python -m trainer_backend export N`` prints, parsed."""
    done = run_timed(parallax_command("export", str(run_id), db_url=db_url))
    return json.loads(done.stdout)


def digits_workload(quick: bool, epochs: int = 3) -> dict[str, Any]:
    """The training work Parallax benchmarks share: resnet18 on digits at 32x32, batch 128.

    Quick: one epoch of timm's tiny test_resnet at 16x16, enough to show that the script runs."""
    if quick:
        return {"dataset": "digits", "model": "test_resnet", "epochs": 1, "batch_size": 128, "image_size": 16}
    return {"dataset": "digits", "model": "resnet18", "epochs": epochs, "batch_size": 128, "image_size": 32}


def run_parallax(settings: dict[str, Any], db_url: str, *extra: str, strategy: str = "single",
               devices: str = "cpu") -> dict[str, Any]:
    """One foreground ``trainer_backend run``: its wall time, run id and the epochs it recorded."""
    from db import make_engine, store

    done = run_timed(parallax_command(
        "run", "--dataset", settings["dataset"], "--model", settings["model"], "--strategy", strategy,
        "--devices", devices, "--epochs", str(settings["epochs"]), "--batch-size", str(settings["batch_size"]),
        "--image-size", str(settings["image_size"]), "--quiet",
        # Like for like: the contenders validate on BatchNorm's running averages; what
        # re-estimating them costs is measured in bench/first_run.py.
        "--bn-stats-images", "0", *extra, db_url=db_url))
    run_id = run_id_from(done.stdout)
    # What `python -m trainer_backend export N` prints, read in this process (saves a process start).
    exported = store.export_run(make_engine(db_url), run_id)
    if exported["status"] != "completed":
        raise RuntimeError(f"run {run_id} ended {exported['status']}: {exported['error']}")
    return {"wall_s": done.seconds, "run_id": run_id, "epochs": exported["epochs"], "export": exported}


def prime_dataset_cache(settings: dict[str, Any], quick: bool) -> None:
    """Decode the dataset into PARALLAX_HOME's cache before the timed runs, so that none of them
    pays the decode. Skipped with --quick: it imports torch here, and the digits decode in the
    first run is tenths of a second."""
    if not quick:
        from trainer_backend.datasets import prepare_data

        prepare_data(settings["dataset"], image_size=settings["image_size"])


def epoch_field(run: dict[str, Any], name: str, *, later: bool = True) -> float:
    """The median of one recorded epoch field over a run's epochs (after the first, by default)."""
    values = [e[name] for e in run["epochs"]]
    return statistics.median(later_epochs(values) if later else values)


def later_epochs(values: list[float]) -> list[float]:
    """Epochs after the first: the first carries one-off costs (allocator growth, oneDNN kernel
    selection, page faults) that every contender pays once."""
    return values[1:] if len(values) > 1 else values


