"""``make gpu-check``: the first thing to run on a machine with a GPU.

With CUDA it runs a short series of real runs of the engine on cuda:0 (resnet18 on the digits at
128 px, batch 128, 3 epochs: single in bf16, with ``--amp off``, ``--compile`` and
``--channels-last``, ddp and fsdp as worlds of one, fp16 with ``--grad-clip``, and ddp under
``torchrun --standalone``), prints for each the epochs' training images/s, the largest step point's
images/s (and its ratio to the best epoch's: above 2 a step point overstates; epoch 1's own figure is
held down by cuDNN's algorithm search in its first step, so it is no yardstick), MFU with the peak
it divides by, and the peak memory, then runs ``tests/system/test_gpu.py`` with the time left of a
10-minute budget, and writes it all to docs/BENCHMARKS.md (section "GPU check") with the GPU named.
It exits 1 if a run or a test failed or a figure is out of bounds. Without CUDA it says so in one
line and exits 0.

It installs nothing and needs no virtual environment: it runs under the python that starts it, with
whatever that python imports (``make gpu-check PY=python3``; wheels installed with ``pip install
--target DIR`` are found through ``PYTHONPATH=DIR``).

    python bench/gpu_check.py                # the runs, then tests/system/test_gpu.py
    python bench/gpu_check.py --no-tests     # the runs only
    python bench/gpu_check.py --docs PATH    # write the section to another file
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DOCS_PATH, PYTHON, ROOT, child_env, parallax_home  # noqa: E402

BUDGET_S = 600
RUN_TIMEOUT_S = 240  # a compiled run's warm-up included
MIN_TEST_S = 120
STEP_POINT_S = "0.1"  # several step points per epoch, even on a fast GPU
WORKLOAD = ("--dataset", "digits", "--model", "resnet18", "--image-size", "128", "--batch-size", "128",
            "--epochs", "3", "--quiet")
RUNS: list[tuple[str, tuple[str, ...]]] = [
    ("single bf16", ("--strategy", "single", "--devices", "0", "--amp", "bf16")),
    ("single --amp off", ("--strategy", "single", "--devices", "0", "--amp", "off")),
    ("single bf16 --compile", ("--strategy", "single", "--devices", "0", "--amp", "bf16", "--compile")),
    ("single bf16 --channels-last", ("--strategy", "single", "--devices", "0", "--amp", "bf16", "--channels-last")),
    ("ddp, world of one", ("--strategy", "ddp", "--devices", "0", "--amp", "bf16")),
    ("fsdp, world of one", ("--strategy", "fsdp", "--devices", "0", "--amp", "bf16")),
    ("single fp16 --grad-clip 1", ("--strategy", "single", "--devices", "0", "--amp", "fp16", "--grad-clip", "1.0")),
    ("torchrun --standalone, ddp", ("--strategy", "ddp", "--devices", "cuda", "--amp", "bf16")),
]
TORCHRUN = (PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1")
BEGIN, END = "<!-- gpu-check: begin -->", "<!-- gpu-check: end -->"
MAX_STEP_OVER_EPOCH = 2.0  # a step point at more than twice the best epoch's images/s overstates


def nothing_to_check() -> tuple[str, int] | None:
    """(one line saying why there is nothing to check here, the exit status), or None where CUDA is
    available. A python without PyTorch is a mistake (the wrong PY), not a machine without a GPU."""
    try:
        import torch
    except ImportError as exc:
        return f"gpu-check: {PYTHON} cannot import PyTorch ({exc}): name the python that has it, PY=...", 1
    if not torch.cuda.is_available():
        return "gpu-check: no CUDA device on this machine (torch.cuda.is_available() is False): nothing to check", 0
    return None


def run_one(name: str, flags: tuple[str, ...], db_url: str, timeout_s: float) -> dict:
    """One real run to its end, summarised; a failure is summarised too, with its reason."""
    from db import make_engine, store

    engine = make_engine(db_url)
    before = {run.id for run in store.list_runs(engine)}
    command = [*(TORCHRUN if name.startswith("torchrun") else (PYTHON,)), "-m", "trainer_backend", "run",
               *WORKLOAD, *flags]
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=ROOT, env=child_env(PARALLAX_STEP_POINT_S=STEP_POINT_S),
                              capture_output=True, text=True, timeout=timeout_s)
        output = done.stdout[-2000:] + done.stderr[-3000:]
    except subprocess.TimeoutExpired:
        return {"name": name, "flags": " ".join(flags), "status": f"did not end within {timeout_s:.0f} s"}
    new = sorted({run.id for run in store.list_runs(engine)} - before)
    if not new:
        return {"name": name, "flags": " ".join(flags), "status": "no run recorded", "output": output}
    return summarise(name, flags, store.export_run(engine, new[-1]), time.monotonic() - started, output)


def summarise(name: str, flags: tuple[str, ...], run: dict, wall_s: float, output: str = "") -> dict:
    """The figures of one exported run, and what is out of bounds in them."""
    epochs = run["epochs"]
    summary = {"name": name, "flags": " ".join(flags), "status": run["status"], "wall_s": round(wall_s, 1),
               "problems": []}
    if run["status"] != "completed":
        summary["problems"].append(f"ended {run['status']}: {(run.get('error') or '').splitlines()[:1]}")
        summary["output"] = output
    if not epochs:
        return summary
    last = epochs[-1]
    best_epoch = max(e["images_per_s"] for e in epochs)
    points = [s["images_per_s"] for s in run.get("steps", []) if s.get("images_per_s") is not None]
    measured = run.get("measurements") or {}
    summary.update({
        "epoch_images_per_s": [round(e["images_per_s"], 1) for e in epochs],
        "max_step_images_per_s": round(max(points), 1) if points else None,
        "max_step_over_epoch": round(max(points) / best_epoch, 2) if points and best_epoch else None,
        "mfu": last["extra"].get("mfu"),
        "achieved_tflops": last["extra"].get("achieved_tflops"),
        "peak_tflops": measured.get("peak_tflops"),
        "peak_source": measured.get("peak_source"),
        "peak_memory_mb": round(max(max(e["peak_memory_mb"].values(), default=0) for e in epochs), 1),
        "peak_reserved_mb": round(max(max(e["extra"].get("peak_memory_reserved_mb", {}).values(), default=0)
                                      for e in epochs), 1),
        "forward_dtype": last["extra"].get("forward_dtype"),
    })
    if summary["max_step_over_epoch"] is not None and summary["max_step_over_epoch"] > MAX_STEP_OVER_EPOCH:
        summary["problems"].append(f"a step point at {summary['max_step_over_epoch']}x the best epoch's images/s")
    if summary["mfu"] is not None and not 0 < summary["mfu"] <= 1:
        summary["problems"].append(f"MFU {summary['mfu']}")
    if summary["peak_source"] and "CPU" in summary["peak_source"]:
        summary["problems"].append(f"a CPU peak on a GPU run: {summary['peak_source']}")
    return summary


def run_tests(timeout_s: float) -> dict:
    """tests/system/test_gpu.py under pytest, or why not."""
    try:
        import pytest  # noqa: F401
    except ImportError:
        return {"summary": "not run: pytest cannot be imported", "failed": False}
    started = time.monotonic()
    try:
        done = subprocess.run([PYTHON, "-m", "pytest", "tests/system/test_gpu.py", "-q", "-p", "no:cacheprovider", "-rfEs"],
                              cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stdout or b"")[-3000:]
        return {"summary": f"did not finish within {timeout_s:.0f} s", "failed": True,
                "output": tail.decode(errors="replace") if isinstance(tail, bytes) else tail}
    lines = [line for line in done.stdout.splitlines() if re.search(r"\b(passed|failed|skipped|error)", line)]
    summary = lines[-1].strip("= ") if lines else f"pytest exited {done.returncode}"
    return {"summary": f"{summary} ({time.monotonic() - started:.0f} s)", "failed": done.returncode != 0,
            "output": done.stdout[-6000:] + done.stderr[-2000:]}


def figure(value, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def table(results: list[dict]) -> list[str]:
    rows = ["| run | epoch images/s (epochs 1, 2, 3) | largest step point, images/s (× the best epoch's) | MFU | peak "
            "(TFLOPS, source) | peak memory MB (allocated / reserved) | status |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        epochs = ", ".join(figure(v) for v in r.get("epoch_images_per_s", [])) or "—"
        step = (f"{figure(r.get('max_step_images_per_s'))} (×{r['max_step_over_epoch']})"
                if r.get("max_step_over_epoch") is not None else "—")
        peak = f"{figure(r.get('peak_tflops'), 1)}, {r.get('peak_source') or '—'}"
        memory = f"{figure(r.get('peak_memory_mb'))} / {figure(r.get('peak_reserved_mb'))}"
        status = r["status"] + ("; " + "; ".join(r["problems"]) if r.get("problems") else "")
        rows.append(f"| {r['name']} | {epochs} | {step} | {figure(r.get('mfu'), 3)} | {peak} | {memory} | {status} |")
    return rows


def section(gpu: str, environment: str, results: list[dict], tests: dict | None) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
    flags = " ".join(WORKLOAD[:-1])
    lines = [BEGIN, "## GPU check (`make gpu-check`)", "",
             f"Measured on **{gpu}**, {environment}, {now}, by `bench/gpu_check.py`: one run of each, "
             f"`{flags}` (`PARALLAX_STEP_POINT_S={STEP_POINT_S}`), so the figures show that each path runs and "
             "what it records, not a tuned throughput. Epoch 1 carries cuDNN's algorithm search and the "
             "allocator's growth; MFU is the last epoch's.", "", *table(results), ""]
    if tests is not None:
        lines += [f"tests/system/test_gpu.py: {tests['summary']}.", ""]
    lines.append(END)
    return "\n".join(lines) + "\n"


def write_section(docs: Path, text: str) -> None:
    """Put the section in ``docs`` in place of the one there, or at the end."""
    old = docs.read_text() if docs.exists() else ""
    docs.write_text(replace_section(old, text))


def replace_section(old: str, text: str) -> str:
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        return head + text.rstrip("\n") + rest.split(END, 1)[1]
    return old.rstrip("\n") + ("\n\n" if old else "") + text


def keep_section(old: str, new: str) -> str:
    """``new`` (docs/BENCHMARKS.md as bench/run_all.py renders it) with the GPU check section of ``old``."""
    if BEGIN in old and END in old:
        return replace_section(new, BEGIN + old.split(BEGIN, 1)[1].split(END, 1)[0] + END + "\n")
    return new


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--no-tests", action="store_true", help="the runs only, not tests/system/test_gpu.py")
    parser.add_argument("--docs", type=Path, default=DOCS_PATH, help="where to write the section")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="the tests get what the runs leave of it")
    args = parser.parse_args()
    nothing = nothing_to_check()
    if nothing is not None:
        print(nothing[0], flush=True)
        return nothing[1]
    import torch

    started = time.monotonic()
    gpu = torch.cuda.get_device_name(0)
    environment = (f"{torch.cuda.device_count()} GPU(s) visible, torch {torch.__version__}, CUDA {torch.version.cuda}, "
                   f"Python {sys.version.split()[0]}")
    print(f"gpu-check on {gpu} ({environment})", flush=True)
    if shutil.which("nvidia-smi") is None:
        print("gpu-check: nvidia-smi is not on PATH (NVML readings may be missing)", flush=True)
    results = []
    with parallax_home("parallax-gpu-check-") as home:
        db_url = f"sqlite:///{home / 'parallax.db'}"
        os.environ["PARALLAX_DB_URL"] = db_url
        try:
            for name, flags in RUNS:
                result = run_one(name, flags, db_url, RUN_TIMEOUT_S)
                results.append(result)
                print("\n".join(table([result])[2:]), flush=True)
                if result.get("output") and result["status"] != "completed":
                    print(result["output"], flush=True)
        finally:
            os.environ.pop("PARALLAX_DB_URL", None)
    tests = None
    if not args.no_tests:
        left = max(MIN_TEST_S, args.budget_s - (time.monotonic() - started))
        print(f"tests/system/test_gpu.py (at most {left:.0f} s) ...", flush=True)
        tests = run_tests(left)
        print(f"tests/system/test_gpu.py: {tests['summary']}", flush=True)
        if tests["failed"]:
            print(tests.get("output", ""), flush=True)
    write_section(args.docs, section(gpu, environment, results, tests))
    print("\n".join(table(results)), flush=True)
    print(f"wrote {args.docs} in {time.monotonic() - started:.0f} s", flush=True)
    failed = any(r["status"] != "completed" or r.get("problems") for r in results) or bool(tests and tests["failed"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
