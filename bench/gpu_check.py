"""``make gpu-check``: the first thing to run on a machine with a GPU.

With CUDA it first answers whether Parallax is the bottleneck of a comparison: Parallax
against bench/gpu.py's hand-written loop on both data paths (the dataset kept on the GPU; the host
path with loader workers and pinned non-blocking copies), images/s per pair against a target of
0.98, with each side's synchronising calls per training step (Parallax's with the NaN guard, the step
hooks and the stop check on). Right after the pairs, what a run does besides its steps
(bench/gpu_run_checks.py): ddp under ``torchrun --standalone`` with ``--max-restarts 1`` (the stop check
on) against the same job without, a stop and resume at a step over NCCL, NaN stops and skips, the SDK on
one visible GPU, SIGTERM during a long kernel. Then it runs a short series of real
runs of Parallax on cuda:0 (resnet18 on the digits at 128 px, batch 128, 3 epochs: single in
bf16, with ``--amp off``, and ddp and fsdp as worlds of one), prints for each the epochs' training
images/s, the largest step point's images/s (and its ratio to the best epoch's: above 2 a step point
overstates; epoch 1's own figure is held down by cuDNN's algorithm search in its first step, so it
is no yardstick), MFU with the peak it divides by, and the peak memory; a JPEG folder of mixed sizes
trained with ``--decode workers`` (decoded on the GPU) and from the cache, losses compared; the
memory estimate against the allocator's peak for single, ddp and fsdp stored larger than they
train, and the epoch that holds ``--amp off``'s peak. Last it runs
``tests/system/test_gpu.py`` with the time left of a 10-minute budget, and writes it all to
docs/BENCHMARKS.md (section "GPU check") with the GPU named. It exits 1 if a run or a test failed
or a figure is out of bounds. Without CUDA it says so in one line, writes nothing and exits 0.

It installs nothing and needs no virtual environment: it runs under the python that starts it, with
whatever that python imports (``make gpu-check PY=python3``; wheels installed with ``pip install
--target DIR`` are found through ``PYTHONPATH=DIR``).

    python bench/gpu_check.py                # the runs, then tests/system/test_gpu.py
    python bench/gpu_check.py --no-tests     # the runs only
    python bench/gpu_check.py --docs PATH    # write the section to another file
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import gpu_run_checks  # noqa: E402
from bench.common import DOCS_PATH, PYTHON, ROOT, child_env, parallax_home  # noqa: E402

BUDGET_S = 600
RUN_TIMEOUT_S = 240  # a compiled run's warm-up included
MIN_TEST_S = 60
STEP_POINT_S = "0.1"  # several step points per epoch, even on a fast GPU
WORKLOAD = ("--dataset", "digits", "--model", "resnet18", "--image-size", "128", "--batch-size", "128",
            "--epochs", "3", "--quiet")
# The memory estimate is compared with the allocator's peak on the runs stored larger than they
# train (STORED_SIZE > the image size: the device crops, with its own workspace), and --amp off's
# peak is found epoch by epoch.
STORED_SIZE = "144"
RUNS: list[tuple[str, tuple[str, ...]]] = [
    ("single bf16", ("--strategy", "single", "--devices", "0", "--amp", "bf16", "--stored-size", STORED_SIZE)),
    ("single --amp off", ("--strategy", "single", "--devices", "0", "--amp", "off")),
    ("ddp, world of one", ("--strategy", "ddp", "--devices", "0", "--amp", "bf16", "--stored-size", STORED_SIZE)),
    ("fsdp, world of one", ("--strategy", "fsdp", "--devices", "0", "--amp", "bf16", "--stored-size", STORED_SIZE)),
]
# Run first, right after the pairs: a torchrun job without the stop check (not resumable) and one with it
# (--max-restarts 1: a look about every 2 s, a resume point each epoch); (name, flags, torchrun's own flags).
TORCHRUN_PAIR: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    ("torchrun --standalone, ddp", ("--strategy", "ddp", "--devices", "cuda", "--amp", "bf16"), ()),
    ("torchrun --standalone --max-restarts 1, ddp (stop check)", ("--strategy", "ddp", "--devices", "cuda", "--amp",
                                                                  "bf16"), ("--max-restarts", "1")),
]
# The time plan on one H200 (10 minutes in all), the product's question first: Parallax against
# the hand-written loop, resnet50 at 160 px, batch 128, 6 epochs of the digits (~0.4 s each), two
# pairs per data path started in turn (~50 s a pair, most of it each process's start and epoch 1's
# cuDNN search) plus Parallax's sync count per path (~20 s), 4 minutes; the torchrun pair (~25 s each) and
# the checks of bench/gpu_run_checks.py (a stopped and resumed job ~40 s, four NaN runs ~10 s each, the SDK
# script ~15 s, two SIGTERMs ~10 s), an estimated 2.5 minutes, not yet measured on a GPU; the four runs above
# about 25 s each, under 2 minutes; the JPEG folder (~100 small files) decoded on the GPU and from the cache, 2
# runs of 2 epochs, 30 s; three estimates on the CPU, 20 s: about 9 minutes; tests/system/test_gpu.py gets the
# rest, at least MIN_TEST_S (the whole file takes about 6 minutes on its own: `pytest tests/system/test_gpu.py`;
# --compile, --channels-last and fp16 with clipping, once runs here too, are its tests').
# Two pairs, not one: on an H200 one process's median epoch differs from the next's, same side and
# same code, by up to 15 % (cuDNN picks its kernels per process), so one pair's ratio spread over
# 0.956-1.070 in eight pairs whose median was 1.01 (docs/BENCHMARKS.md).
DEVICE = "cuda:0"
COMPARE = {"dataset": "digits", "model": "resnet50", "epochs": 6, "batch_size": 128, "image_size": 160}
PAIRS = 2
JPEG_CLASSES, JPEG_PER_CLASS, JPEG_SIZES = 4, 24, (40, 200)
JPEG_FLAGS = ("--model", "resnet18", "--image-size", "64", "--batch-size", "32", "--epochs", "2", "--seed", "0",
              "--bn-stats-images", "0", "--amp", "off", "--num-workers", "2", "--quiet")
MAX_LOSS_GAP = 0.1  # decoded on the GPU and from the cache: the epochs' losses within 10 %
MAX_ESTIMATE_ERROR = 0.1  # the estimate within 10 % of the allocator's peak
TARGET_RATIO = 0.98  # Parallax's images/s over the hand-written loop's
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


def run_one(name: str, flags: tuple[str, ...], db_url: str, timeout_s: float, workload: tuple[str, ...] | None = None,
            *, agent: tuple[str, ...] = (), env: dict | None = None) -> dict:
    """One real run to its end, summarised; a failure is summarised too, with its reason.
    ``workload``: the flags before ``flags`` (WORKLOAD unless given); a run whose name starts with "torchrun" is
    started by torchrun, with ``agent``'s flags too; ``env``: more of the run's environment."""
    from db import make_engine, store

    engine = make_engine(db_url)
    before = {run.id for run in store.list_runs(engine)}
    command = [*((*TORCHRUN, *agent) if name.startswith("torchrun") else (PYTHON,)), "-m", "trainer_backend", "run",
               *(WORKLOAD if workload is None else workload), *flags]
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=ROOT, env=child_env(PARALLAX_STEP_POINT_S=STEP_POINT_S, **(env or {})),
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
               "problems": [], "error": run.get("error"), "notes": run.get("notes") or [],
               "epochs_recorded": [e["epoch"] for e in epochs],
               "skipped_steps": [e["extra"].get("skipped_steps", 0) for e in epochs]}
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
        "epoch_peak_memory_mb": [round(max(e["peak_memory_mb"].values(), default=0), 1) for e in epochs],
        "train_loss": [e.get("train_loss") for e in epochs],
    })
    if summary["max_step_over_epoch"] is not None and summary["max_step_over_epoch"] > MAX_STEP_OVER_EPOCH:
        summary["problems"].append(f"a step point at {summary['max_step_over_epoch']}x the best epoch's images/s")
    if summary["mfu"] is not None and not 0 < summary["mfu"] <= 1:
        summary["problems"].append(f"MFU {summary['mfu']}")
    if summary["peak_source"] and "CPU" in summary["peak_source"]:
        summary["problems"].append(f"a CPU peak on a GPU run: {summary['peak_source']}")
    return summary


def compare_with_hand_loop(db_url: str) -> dict[str, dict]:
    """bench/gpu.py's comparison on DEVICE at COMPARE's sizes, PAIRS pairs per data path; each
    path's result gains its problems (a median ratio under TARGET_RATIO)."""
    from bench.gpu import compare_paths

    paths = compare_paths(COMPARE, db_url, PAIRS, device=DEVICE, label="gpu-check")
    for result in paths.values():
        result["problems"] = []
        if "ratios" in result and statistics.median(result["ratios"]) < TARGET_RATIO:
            result["problems"].append(f"Parallax / hand-written {statistics.median(result['ratios']):.3f}, under "
                                      f"{TARGET_RATIO}")
    return paths


def write_jpeg_folder(folder: Path, seed: int = 0) -> Path:
    """JPEG_CLASSES class folders of JPEG_PER_CLASS photos-like images, each of its own size
    (JPEG_SIZES, width and height drawn apart): the case where a GPU decode meets one shape per image."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for label in range(JPEG_CLASSES):
        (folder / f"class{label}").mkdir(parents=True, exist_ok=True)
        for index in range(JPEG_PER_CLASS):
            width, height = (int(v) for v in rng.integers(*JPEG_SIZES, size=2))
            base = np.zeros((height, width, 3), dtype=np.float32)
            base[..., label % 3] = 180.0  # each class its own colour, under noise
            pixels = np.clip(base + rng.normal(0, 40, size=base.shape), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"class{label}" / f"{index}.jpg", quality=90)
    return folder


def jpeg_losses(folder: Path, db_url: str, timeout_s: float) -> dict:
    """The JPEG folder trained with ``--decode workers`` (on a GPU, the GPU decodes) and with the
    cache, alike otherwise: each epoch's training loss, and the largest relative gap between them."""
    runs = {}
    device_flags = ("--devices", "cpu" if DEVICE == "cpu" else DEVICE.split(":")[-1])
    for decode in ("workers", "cache"):
        runs[decode] = run_one(f"JPEG folder, --decode {decode}",
                               ("--dataset", str(folder), *JPEG_FLAGS, *device_flags, "--decode", decode),
                               db_url, timeout_s, workload=())
    losses = {decode: run.get("train_loss") or [] for decode, run in runs.items()}
    problems = [f"--decode {decode}: {run['status']}" for decode, run in runs.items() if run["status"] != "completed"]
    gap = None
    if losses["workers"] and len(losses["workers"]) == len(losses["cache"]):
        gap = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses["workers"], losses["cache"]))
        if not all(math.isfinite(v) for v in losses["workers"]) or gap > MAX_LOSS_GAP:
            problems.append(f"losses {losses['workers']} decoded in the workers against {losses['cache']} from the "
                            f"cache (gap {gap:.3f}, more than {MAX_LOSS_GAP})")
    return {"losses": losses, "gap": gap, "problems": problems}


def estimate_against_peak(result: dict, timeout_s: float = 120) -> dict | None:
    """For a run stored larger than it trains: ``parallax estimate``'s peak for its flags against
    the allocator's (the largest epoch's ``max_memory_allocated``); None for other runs."""
    flags = result.get("flags", "").split()
    if "--stored-size" not in flags or "peak_memory_mb" not in result:
        return None
    workload = [flag for flag in WORKLOAD if flag != "--quiet"]
    command = [PYTHON, "-m", "trainer_backend", "estimate", *workload, *flags, "--json"]
    try:
        done = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"name": result["name"], "problems": [f"estimate did not end within {timeout_s:.0f} s"]}
    if done.returncode != 0:
        return {"name": result["name"], "problems": [f"estimate exited {done.returncode}: {done.stderr[-300:]}"]}
    (estimate,) = json.loads(done.stdout)
    estimated = max(device["total_mb"] for device in estimate["devices"].values())
    error = estimated / result["peak_memory_mb"] - 1 if result["peak_memory_mb"] else None
    problems = ([f"estimate {estimated:,.0f} MB against a peak of {result['peak_memory_mb']:,.0f} MB "
                 f"({error:+.1%})"] if error is None or abs(error) > MAX_ESTIMATE_ERROR else [])
    return {"name": result["name"], "estimate_mb": round(estimated, 1), "peak_mb": result["peak_memory_mb"],
            "error": error, "problems": problems}


def run_tests(timeout_s: float) -> dict:
    """tests/system/test_gpu.py under pytest, or why not. Each test's line is printed as it ends, so a
    check cut off by its budget still shows what passed; at the budget pytest's process group is killed."""
    try:
        import pytest  # noqa: F401
    except ImportError:
        return {"summary": "not run: pytest cannot be imported", "failed": False}
    started = time.monotonic()
    command = [PYTHON, "-m", "pytest", "tests/system/test_gpu.py", "-v", "-p", "no:cacheprovider", "-rfEs",
               "--durations=5"]
    child = subprocess.Popen(command, cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
    lines: list[str] = []
    def kill() -> None:
        with contextlib.suppress(ProcessLookupError):  # it may end just as the budget runs out
            os.killpg(child.pid, signal.SIGKILL)

    timer = threading.Timer(timeout_s, kill)
    timer.start()
    try:
        for line in child.stdout:
            lines.append(line.rstrip("\n"))
            print(line, end="", flush=True)
        child.wait()
    finally:
        timer.cancel()
    took = time.monotonic() - started
    passed = sum(" PASSED" in line for line in lines)
    if child.returncode == -signal.SIGKILL:
        return {"summary": f"cut off at {timeout_s:.0f} s after {passed} passed, "
                           f"{sum(' FAILED' in line for line in lines)} failed", "failed": True,
                "output": "\n".join(lines[-60:])}
    found = [line for line in lines if re.search(r"\b(passed|failed|skipped|error)", line) and line.startswith("=")]
    summary = found[-1].strip("= ") if found else f"pytest exited {child.returncode}"
    return {"summary": f"{summary} ({took:.0f} s)", "failed": child.returncode != 0,
            "output": "\n".join(lines[-80:])}


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


def paths_table(paths: dict[str, dict]) -> list[str]:
    from bench.gpu import DATA_PATHS

    rows = ["| data path | engine, images/s | hand-written loop, images/s | Parallax / hand-written, each pair | "
            "synchronising calls per training step (Parallax / hand-written) | status |",
            "| --- | --- | --- | --- | --- | --- |"]
    for path, r in paths.items():
        if "skipped" in r:
            why = "; ".join([r["skipped"], *r.get("problems", [])])
            rows.append(f"| {DATA_PATHS[path]} | — | — | — | — | not measured: {why} |")
            continue
        ratios = ", ".join(f"{v:.3f}" for v in r["ratios"])
        syncs = f"{figure(r['parallax_syncs_per_step'], 2)} / {figure(r['plain_syncs_per_step'], 2)}"
        status = "; ".join(r["problems"]) or f"at or above {TARGET_RATIO}"
        rows.append(f"| {DATA_PATHS[path]} | {', '.join(figure(v) for v in r['parallax'])} | "
                    f"{', '.join(figure(v) for v in r['plain'])} | {ratios} | {syncs} | {status} |")
    return rows


def memory_lines(results: list[dict], estimates: list[dict]) -> list[str]:
    lines = []
    if estimates:
        lines += ["| run | estimate, MB | allocator's peak, MB | estimate against peak | status |",
                  "| --- | --- | --- | --- | --- |"]
        for e in estimates:
            error = "—" if e.get("error") is None else f"{e['error']:+.1%}"
            lines.append(f"| {e['name']} | {figure(e.get('estimate_mb'), 1)} | {figure(e.get('peak_mb'), 1)} | {error} | "
                         f"{'; '.join(e['problems']) or 'within ' + format(MAX_ESTIMATE_ERROR, '.0%')} |")
        lines.append("")
    for r in results:
        if "--amp off" in r.get("flags", "") and r.get("epoch_peak_memory_mb"):
            peaks = r["epoch_peak_memory_mb"]
            top = peaks.index(max(peaks)) + 1
            lines += [f"{r['name']}: the allocator's peak per epoch (max_memory_allocated, reset each epoch) "
                      f"{', '.join(figure(v) for v in peaks)} MB: the peak is in epoch {top}.", ""]
    return lines


def section(gpu: str, environment: str, results: list[dict], tests: dict | None, *, paths: dict | None = None,
            jpeg: dict | None = None, estimates: list[dict] | None = None, checks: list[dict] | None = None) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
    flags = " ".join(WORKLOAD[:-1])
    lines = [BEGIN, "## GPU check (`make gpu-check`)", "",
             f"Measured on **{gpu}**, {environment}, {now}, by `bench/gpu_check.py`: one run of each, "
             f"`{flags}` (`PARALLAX_STEP_POINT_S={STEP_POINT_S}`), so the figures show that each path runs and "
             "what it records, not a tuned throughput. Epoch 1 carries cuDNN's algorithm search and the "
             "allocator's growth; MFU is the last epoch's.", "", *table(results), ""]
    if paths is not None:
        settings = ", ".join(f"{k} {v}" for k, v in COMPARE.items())
        lines += ["Parallax against a hand-written loop (`bench/gpu.py`): the same model, data, batch and AMP "
                  f"({settings}), each started in turn, {PAIRS} pair(s) per data path; images/s is the median of "
                  "the epochs after the first. Synchronising calls are counted with "
                  "`torch.cuda.set_sync_debug_mode(\"warn\")` over one epoch's training steps, its start and end "
                  "included, with what a run adds to each step: the NaN guard, the step hooks writing step points "
                  "and the stop check (a look after every step).", "", *paths_table(paths), ""]
    if checks:
        lines += ["What a run does besides its steps (`bench/gpu_run_checks.py`), right after the pairs:", "",
                  *gpu_run_checks.table(checks), ""]
    if jpeg is not None:
        gap = "—" if jpeg["gap"] is None else f"{jpeg['gap']:.3f}"
        lines += [f"A JPEG folder of {JPEG_CLASSES * JPEG_PER_CLASS} images of mixed sizes ({JPEG_SIZES[0]}–"
                  f"{JPEG_SIZES[1]} px a side), `{' '.join(JPEG_FLAGS[:-1])}`: training loss per epoch with "
                  f"`--decode workers` {', '.join(f'{v:.4f}' for v in jpeg['losses']['workers']) or '—'}, from the "
                  f"cache {', '.join(f'{v:.4f}' for v in jpeg['losses']['cache']) or '—'}; largest relative gap "
                  f"{gap}{' (' + '; '.join(jpeg['problems']) + ')' if jpeg['problems'] else ''}.", ""]
    memory = memory_lines(results, estimates or [])
    if memory:
        lines += [f"The memory estimate (`parallax estimate`) against the allocator's peak, stored at {STORED_SIZE} px:",
                  "", *memory]
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
    parser.add_argument("--min-test-s", type=float, default=MIN_TEST_S,
                        help="the tests' time even where the runs used the budget up")
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
    results, checks = [], []
    with parallax_home("parallax-gpu-check-") as home:
        db_url = f"sqlite:///{home / 'parallax.db'}"
        os.environ["PARALLAX_DB_URL"] = db_url
        try:
            try:  # the product's question first: is Parallax the bottleneck of a comparison?
                paths = compare_with_hand_loop(db_url)
            except Exception as exc:  # a run that failed: the check goes on, and fails, saying so
                failure = f"{type(exc).__name__}: {str(exc)[-1500:]}"
                paths = {"device": {"skipped": "failed", "problems": [failure]}}
                print(failure, flush=True)
            print("\n".join(paths_table(paths)), flush=True)
            # Then what a run does besides its steps (bench/gpu_run_checks.py), the stop check's cost first.
            for name, flags, agent in TORCHRUN_PAIR:
                results.append(run_one(name, flags, db_url, RUN_TIMEOUT_S, agent=agent))
                print("\n".join(table(results[-1:])[2:]), flush=True)
            if len(results) == 2:
                checks.append(gpu_run_checks.stop_check_cost(results[0], results[1], gpu_run_checks.pair_ratios(paths)))
            checks += gpu_run_checks.run_checks(run_one, home, db_url, RUN_TIMEOUT_S, DEVICE)
            for name, flags in RUNS:
                result = run_one(name, flags, db_url, RUN_TIMEOUT_S)
                results.append(result)
                print("\n".join(table([result])[2:]), flush=True)
                if result.get("output") and result["status"] != "completed":
                    print(result["output"], flush=True)
            estimates = [e for e in (estimate_against_peak(r) for r in results) if e is not None]
            for line in memory_lines(results, estimates):
                print(line, flush=True)
            jpeg = jpeg_losses(write_jpeg_folder(home / "jpeg-mixed"), db_url, RUN_TIMEOUT_S)
            print(f"JPEG folder, training losses: {jpeg['losses']} (gap {jpeg['gap']})", flush=True)
        finally:
            os.environ.pop("PARALLAX_DB_URL", None)
    tests = None
    # written before the tests too, so that a check cut off in them keeps its figures
    write_section(args.docs, section(gpu, environment, results, tests, paths=paths, jpeg=jpeg, estimates=estimates,
                                     checks=checks))
    if not args.no_tests:
        left = max(args.min_test_s, args.budget_s - (time.monotonic() - started))
        print(f"tests/system/test_gpu.py (at most {left:.0f} s) ...", flush=True)
        tests = run_tests(left)
        print(f"tests/system/test_gpu.py: {tests['summary']}", flush=True)
    write_section(args.docs, section(gpu, environment, results, tests, paths=paths, jpeg=jpeg, estimates=estimates,
                                     checks=checks))
    print("\n".join(table(results)), flush=True)
    print(f"wrote {args.docs} in {time.monotonic() - started:.0f} s", flush=True)
    failed = (any(r["status"] != "completed" or r.get("problems") for r in results) or bool(tests and tests["failed"])
              or any(part.get("problems") for part in [*paths.values(), jpeg, *estimates, *checks]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
