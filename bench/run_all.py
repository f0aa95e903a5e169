"""Run every benchmark, then write bench/results.json and the tables in docs/BENCHMARKS.md.

    python bench/run_all.py                       # the whole suite (make bench): 12 minutes on 2 cores, and
                                                  # bench/history.py's 100,000 runs (hours on a busy machine)
    python bench/run_all.py --only dashboard,profiler   # some of them; the others' figures are kept
    python bench/run_all.py --render              # rewrite docs/BENCHMARKS.md from bench/results.json
    python bench/run_all.py --quick               # tiny settings; writes to a temporary folder, not docs/

Each benchmark runs in its own process, one after the other, so that none inherits another's
threads, imports or memory, except the four that compare something with Parallax's own run
(engine overhead, Lightning, profiler, DDP on CPU): they run together in bench/shared_runs.py,
one rotation that shares Parallax's runs among them. Take figures on a quiet machine: the 1-minute load average is
printed first, and each benchmark records how busy other processes kept the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import shared_runs  # noqa: E402
from bench.common import BENCH_DIR, DOCS_PATH, PYTHON, QUIET_LOAD, RESULTS_PATH, ROOT, child_env  # noqa: E402
from bench.gpu_check import keep_section  # noqa: E402
from bench.report import read_results, render_markdown  # noqa: E402

# Order of the table; each is bench/<name>.py and its key in results.json. "gpu" measures only
# where CUDA exists; elsewhere it records that it skipped, and says so in one line.
BENCHMARKS = ("overhead", "lightning_compare", "data_pipeline", "dashboard", "writes", "launch_latency",
              "profiler", "ddp_cpu", "first_run", "watch_cost", "time_to_interactive", "series_cost", "series_read",
              "forecast", "switches", "recipe", "memory_estimate", "data_scale", "gpu", "nonfinite_check", "sdk_log", "history",
              "delete_runs", "rank_clock", "search", "watch_script_cost")

PREAMBLE = """# Benchmarks

What Parallax costs and what it buys, measured on this project's reference machine (2 CPU cores,
no GPU). `make bench` installs the benchmark extras (`requirements-bench.txt`: PyTorch Lightning,
which Parallax itself does not use) and runs `bench/run_all.py`, which runs every script in
`bench/`, writes `bench/results.json` and rewrites this file. Each script also runs alone:
`python bench/overhead.py` (`--quick` for a tiny check that it runs, `--repeats N`).

How the figures are taken: every contender is measured at least 5 times, and contenders that are
compared run in turn within one invocation (A B A B …), so that slow drifts of the machine fall on
both. The four benchmarks that compare something with Parallax's own run (1, 2, 7 and 8) share
those Parallax runs: one rotation starts the Parallax run and then each one's contender (Parallax, plain
script, Lightning, profiled run, DDP run, Parallax, …), and each pairs its contender with the Parallax
run of the same round. A figure is the median, with the smallest and largest of the repeats; a
comparison is quoted as the median of the ratios of pairs run in the same round. Training throughput
is taken from the epochs after the first, which carry one-off costs (allocator growth, kernel
selection). Every benchmark works in its own temporary `PARALLAX_HOME`.

What is measured: Parallax against a hand-written PyTorch loop and against PyTorch Lightning, the
cached data pipeline against decoding TIFFs on every access, dashboard render times with 500 runs,
the cost of database writes, launch latency (and where it goes), the profiler's cost, what DDP on CPU
buys, the default run's time and accuracy, and a whole run's memory over its dataset's decoded size
with 1, 2 and 4 ranks (`bench/data_scale.py`); take figures on a quiet machine (how long
`make bench` took is said above the summary below). [RELIABILITY.md](RELIABILITY.md) lists every fault and bad input
Parallax is tested against and what the user sees, with the figures of a 10-minute soak
(`bench/soak.py`).

## The first GPU: `make gpu-check`

On a machine with CUDA, `make gpu-check` (at most 10 minutes; its runs took 3 on one H100) trains a
short series of real runs on `cuda:0` (resnet18 on the digits at 128 px: single in bf16, `--amp off`,
`--compile`, `--channels-last`, ddp and fsdp as worlds of one, fp16 with `--grad-clip`, and ddp under
`torchrun --standalone`), prints for each the epochs' images/s, the largest step point's images/s,
MFU with its `peak_source` and the peak memory, then runs `tests/system/test_gpu.py` in the time
left, and writes the table with the GPU's name to this file (section *GPU check*, which `make bench`
keeps). It exits 1 if a run or test failed or a figure is out of bounds (a step point above twice the
best epoch's images/s, an MFU above 1, a CPU peak on a GPU run). Without CUDA it prints one line and
exits 0. It installs nothing and needs no `.venv`: it runs under `.venv/bin/python` where that
exists, else under the python you name, for instance where PyTorch is preinstalled and the rest came
as wheels installed to a folder:

```console needs=gpu,checkout
$ pip install --target /opt/wheels sqlalchemy alembic mako greenlet streamlit plotly   # or from local wheel files
$ PYTHONPATH=/opt/wheels make gpu-check PY=python3
```

## The test suite's time

`make test` (three pytest-xdist workers) runs about 2,050 tests (about 100 skipped here: the GPU tests and what
needs several machines). It is bound by the CPU. On 2 cores it took 1,380 s in CI (2026-12-07) and 2,097 s and
2,348 s on a 2-core machine shared with other work (load average 7 to 16, 2026-12-07); the goal is 600 s. The
longest tests there: the resumed search's fixture (185-196 s), the README's examples (145-180 s), the Slurm
browser test (137-150 s), the run page's layout at three widths (110-123 s). Each guide's examples are a unit of
their own under `--dist loadfile` (tests/conftest.py `SPLIT_FILES`), so the three workers share them. A run's
supervisor importing torch and timm costs 3.5 to 4 s of CPU. Earlier, with 1,179 tests: 400 to 445 s on 2 cores
(2026-11-27). `make test-fast`: about 1,370 tests in 1 to 7 minutes (2026-12-07, the same busy machine).

## The benchmarks at a glance
"""


def units(chosen: list[str]) -> list[tuple[str, list[str]]]:
    """The processes that measure ``chosen``, in order: (label, command arguments after the interpreter).

    The chosen members of bench/shared_runs.py run as one process, where the first of them stands."""
    shared = [name for name in chosen if name in shared_runs.MEMBERS]
    result: list[tuple[str, list[str]]] = []
    for name in chosen:
        if name not in shared_runs.MEMBERS:
            result.append((name, [str(BENCH_DIR / f"{name}.py")]))
        elif name == shared[0]:
            result.append((", ".join(shared), [str(BENCH_DIR / "shared_runs.py"), "--only", ",".join(shared)]))
    return result


def run_unit(label: str, arguments: list[str], results: Path, quick: bool) -> tuple[int, float]:
    command = [PYTHON, *arguments, "--results", str(results)] + (["--quick"] if quick else [])
    print(f"\n### {label}  (load average {os.getloadavg()[0]:.2f})", flush=True)
    started = time.perf_counter()
    code = subprocess.run(command, cwd=ROOT, env=child_env()).returncode
    return code, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny settings; results go to a temporary folder")
    parser.add_argument("--only", default="", help=f"comma list of benchmarks to run: {', '.join(BENCHMARKS)}")
    parser.add_argument("--render", action="store_true", help="only rewrite the markdown from the results file")
    parser.add_argument("--results", type=Path, default=None, help=f"default {RESULTS_PATH.relative_to(ROOT)}")
    parser.add_argument("--docs", type=Path, default=None, help=f"default {DOCS_PATH.relative_to(ROOT)}")
    args = parser.parse_args()
    if args.quick:
        scratch = Path(tempfile.mkdtemp(prefix="parallax-bench-quick-"))
        args.results = args.results or scratch / "results.json"
        args.docs = args.docs or scratch / "BENCHMARKS.md"
    results, docs = args.results or RESULTS_PATH, args.docs or DOCS_PATH
    chosen = [name.strip() for name in args.only.split(",") if name.strip()] or list(BENCHMARKS)
    unknown = sorted(set(chosen) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")

    failed = []
    if not args.render:
        load = os.getloadavg()[0]
        print(f"load average {load:.2f} at the start"
              + ("" if load < QUIET_LOAD else f" (above {QUIET_LOAD}: figures will be noisy)"), flush=True)
        started = time.perf_counter()
        for label, arguments in units(chosen):
            code, seconds = run_unit(label, arguments, results, args.quick)
            print(f"### {label}: {'ok' if code == 0 else f'FAILED (exit {code})'} in {seconds:.0f} s", flush=True)
            if code != 0:
                failed.append(label)
        suite_s = time.perf_counter() - started
        data = read_results(results)
        if set(chosen) == set(BENCHMARKS):
            data["suite_wall_s"] = suite_s
            data["suite_load_avg_start"] = load
            results.write_text(json.dumps(data, indent=2) + "\n")
        print(f"\nsuite: {suite_s / 60:.1f} minutes", flush=True)
    data = read_results(results)
    if not data:
        print(f"no results in {results}", file=sys.stderr)
        return 1
    order = list(BENCHMARKS)
    docs.parent.mkdir(parents=True, exist_ok=True)
    old = docs.read_text() if docs.exists() else ""
    docs.write_text(keep_section(old, render_markdown(data, order, PREAMBLE)))  # make gpu-check's section stays
    print(f"wrote {docs}", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
