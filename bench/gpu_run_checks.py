"""What ``make gpu-check`` (bench/gpu_check.py) runs right after its Parallax-vs-hand pairs: the parts of a run
besides its training steps, on the GPU, each a pass or a problem in one table row.

- the stop check's cost: a torchrun job with ``--max-restarts 1`` (resumable: a look at the stop request about
  every 2 s, a resume point each epoch) against the same job without (``stop_check_cost``, from two of
  gpu_check's runs), within the spread of Parallax-vs-hand pairs;
- a job told to stop mid-epoch over NCCL, resumed at the next step by torchrun's restart, each epoch once;
- a NaN at step 30 under ``--on-nonfinite stop`` and ``skip``, single and torchrun DDP;
- the SDK on one visible GPU with ``LOCAL_RANK=3``: ``parallax.profile`` stores its window, and ``log`` of a
  CUDA tensor stores its value, reading it once per call;
- SIGTERM during a minute-long CUDA kernel: the process ends within the grace, rank 0 recording why.

Each function takes gpu_check's ``run_one`` (a real run, summarised) where it trains, and ``device``: "cuda:0",
or "cpu" where tests/bench/test_gpu_check.py checks the script on this machine.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import time
from pathlib import Path

from bench.common import PYTHON, ROOT, child_env

TINY = ("--dataset", "digits", "--image-size", "16", "--batch-size", "64", "--bn-stats-images", "0", "--quiet")
NAN_STEP = 30  # epoch 2, step 7 at 23 steps an epoch
STOP_ASKED_AT = 23 + 7  # a training forward of epoch 2
GRACE_S = 2.0
DEFAULT_SPREAD = 0.05  # where no pairs were measured


def devices_flag(device: str, torchrun: bool = False) -> tuple[str, ...]:
    if device == "cpu":
        return ("--devices", "cpu")
    return ("--devices", "cuda") if torchrun else ("--devices", device.split(":")[-1])


def row(name: str, result: str, problems: list[str]) -> dict:
    return {"name": name, "result": result, "problems": problems}


def stop_check_cost(without: dict, with_check: dict, pair_ratios: list[float]) -> dict:
    """The resumable torchrun job's best epoch images/s against the plain one's: a problem where it is lower
    by more than the spread of Parallax-vs-hand pairs' ratios (their max - min), measured minutes before."""
    spread = (max(pair_ratios) - min(pair_ratios)) if len(pair_ratios) > 1 else DEFAULT_SPREAD
    name = "stop check (torchrun --max-restarts 1 against none)"
    rates = [max(r.get("epoch_images_per_s") or [0]) for r in (with_check, without)]
    if not all(rates):
        return row(name, "—", [f"a run did not train: {with_check['status']}, {without['status']}"])
    ratio = rates[0] / rates[1]
    problems = [] if ratio >= 1 - spread else [f"{ratio:.3f} of the job without it, beyond the pairs' spread "
                                               f"{spread:.3f}"]
    return {**row(name, f"{rates[0]:,.0f} against {rates[1]:,.0f} images/s: {ratio:.3f} (pairs' spread "
                        f"{spread:.3f})", problems), "ratio": ratio, "spread": spread}


def stop_and_resume(run_one, db_url: str, timeout_s: float, device: str) -> dict:
    """torchrun, one process, ``--max-restarts 1``, told to stop at a step of epoch 2 (a look after every step):
    the restart resumes at the next step and records each epoch once."""
    name = "stop at a step and resume" + (" over NCCL" if device != "cpu" else " over gloo")
    run = run_one("torchrun, stopped at a step", ("--model", "parallax_asks_to_stop", "--epochs", "3",
                                                  *devices_flag(device, torchrun=True), "--strategy", "ddp"),
                  db_url, timeout_s, workload=TINY, agent=("--max-restarts", "1"),
                  env={"PARALLAX_PLUGINS": "tests.plugins.stop_asking_model",
                       "PARALLAX_TEST_ASK_AT": str(STOP_ASKED_AT), "PARALLAX_STOP_CHECK_S": "1e-6"})
    notes = run.get("notes") or []
    stopped = [n for n in notes if n.startswith("The job was told to stop and stopped after step")]
    problems = [] if run["status"] == "completed" else [f"ended {run['status']}"]
    if run.get("epochs_recorded") != [1, 2, 3]:
        problems.append(f"epochs recorded {run.get('epochs_recorded')}")
    if not stopped:
        problems.append("no stop at a step was taken")
    return row(name, stopped[0].removeprefix("The job was told to stop and ") if stopped else run["status"], problems)


def nan_stops(run_one, db_url: str, timeout_s: float, device: str) -> list[dict]:
    """A NaN loss at step 30 (epoch 2, step 7): ``stop`` fails the run naming that step, ``skip`` drops that one
    optimizer step and completes; single, and DDP under torchrun."""
    rows = []
    for launcher in ("single", "torchrun DDP"):
        torchrun = launcher != "single"
        for action in ("stop", "skip"):
            flags = ("--model", "parallax_nan_at_step", "--epochs", "2", "--on-nonfinite", action,
                     "--strategy", "ddp" if torchrun else "single", *devices_flag(device, torchrun))
            run = run_one(("torchrun, " if torchrun else "") + f"NaN {action}", flags, db_url, timeout_s,
                          workload=TINY, env={"PARALLAX_PLUGINS": "tests.plugins.nan_model",
                                              "PARALLAX_TEST_NAN_STEP": str(NAN_STEP)})
            error = run.get("error") or ""
            if action == "stop":
                ok = run["status"] == "failed" and error.startswith("loss became NaN at epoch 2 step 7")
                result = error.split(";")[0] if error else run["status"]
            else:
                skipped = run.get("skipped_steps")
                ok = run["status"] == "completed" and skipped == [0, 1]
                result = f"{run['status']}, optimizer steps dropped per epoch {skipped}"
            rows.append(row(f"NaN at step {NAN_STEP}, --on-nonfinite {action}, {launcher}", result,
                            [] if ok else [f"{run['status']}: {error[:200] or result}"]))
    return rows


PROFILED_SCRIPT = """
import json, warnings, torch, parallax
device = "cuda" if torch.cuda.is_available() else "cpu"
run = parallax.init(project="gpu-check", name="one visible GPU")
model = torch.nn.Linear(256, 256).to(device)
x = torch.randn(512, 256, device=device)
with parallax.profile(wait=0, warmup=0, active=2) as prof:
    for step in range(2):
        with prof.range("forward"):
            loss = model(x).square().mean()
        loss.backward()
        prof.step()
syncs = None
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
    for step in range(5):
        parallax.log({"loss": loss * step})
    if device == "cuda":
        torch.cuda.set_sync_debug_mode(0)
        syncs = sum("synchroniz" in str(w.message) for w in caught)
print(json.dumps({"run_id": run.run_id, "expected": [float(loss) * step for step in range(5)], "syncs": syncs}))
parallax.finish()
"""


def sdk_on_one_gpu(home: Path, db_url: str, timeout_s: float = 300) -> dict:
    """A script with ``parallax.profile`` and ``log`` of device tensors, as a task of ``srun --gpus-per-task=1``
    sees its GPU: ``CUDA_VISIBLE_DEVICES`` one GPU, ``LOCAL_RANK=3``."""
    from db import make_engine, profiles, script_metrics

    name = "SDK: profile and log on one visible GPU, LOCAL_RANK=3"
    script = home / "sdk_script.py"
    script.write_text(PROFILED_SCRIPT)
    visible = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    env = child_env(CUDA_VISIBLE_DEVICES=visible, LOCAL_RANK="3", PARALLAX_DB_URL=db_url, PYTHONPATH=str(ROOT))
    try:
        done = subprocess.run([PYTHON, str(script)], cwd=home, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return row(name, "—", [f"did not end within {timeout_s:.0f} s"])
    if done.returncode != 0:
        return row(name, "—", [f"exited {done.returncode}: {done.stderr[-300:]}"])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    engine = make_engine(db_url)
    values = [p["value"] for p in script_metrics.read_points(engine, [result["run_id"]], max_points=None)]
    problems = []
    if profiles.profiled_runs(engine, [result["run_id"]]) != {result["run_id"]}:
        problems.append("no profile stored")
    if len(values) != 5 or any(abs(a - b) > 1e-6 * max(1.0, abs(b)) for a, b in zip(values, result["expected"])):
        problems.append(f"logged {values}, expected {result['expected']}")
    if result["syncs"] not in (None, 5):
        problems.append(f"{result['syncs']} synchronising reads for 5 log calls")
    syncs = "" if result["syncs"] is None else f", {result['syncs']} synchronising reads for 5 log calls"
    return row(name, f"profile stored, {len(values)} values logged{syncs}", problems)


KERNEL_SCRIPT = """
import sys, torch
from trainer_backend.rank import stopping
recorded, role, grace_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
stopping.stop_on_sigterm((lambda signum, frame: None) if role == "rank0" else None, grace_s=grace_s)
stopping.when_blocked(lambda grace_s: open(recorded, "w").write(f"blocked {grace_s:g}"))
if torch.cuda.is_available():
    torch.cuda._sleep(10)  # the context, before the kernel
    print("in the kernel", flush=True)
    torch.cuda._sleep(int(60 * 1.5e9))  # about a minute of one kernel
    torch.cuda.synchronize()  # the main thread waits in C for it
else:
    a = torch.randn(6000, 6000)
    print("in the kernel", flush=True)
    while True:
        a @ a  # seconds in C at a time
"""


def sigterm_in_a_kernel(folder: Path, role: str, grace_s: float = GRACE_S, timeout_s: float = 120) -> dict:
    """SIGTERM half a second into a long kernel (on a CPU: a long matrix product) of a process that asks for a
    stop at a step on SIGTERM: it must end within the grace and 2 s, rank 0 by exit 128 + SIGTERM after recording
    from the grace's thread, any other rank by SIGALRM. {"code", "took_s", "recorded"}."""
    recorded = folder / f"sigterm-{role}.txt"
    recorded.unlink(missing_ok=True)
    child = subprocess.Popen([PYTHON, "-c", KERNEL_SCRIPT, str(recorded), role, str(grace_s)], cwd=ROOT,
                             env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline().strip()
        if line != "in the kernel":
            return {"code": child.wait(timeout_s), "took_s": None, "recorded": "", "error": child.stderr.read()[-300:]}
        time.sleep(0.5)
        signalled = time.monotonic()
        os.kill(child.pid, signal.SIGTERM)
        code = child.wait(timeout=timeout_s)
        return {"code": code, "took_s": time.monotonic() - signalled,
                "recorded": recorded.read_text() if recorded.exists() else ""}
    except subprocess.TimeoutExpired:
        return {"code": None, "took_s": None, "recorded": "", "error": f"still running after {timeout_s:.0f} s"}
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def sigterm_rows(folder: Path, device: str) -> list[dict]:
    rows = []
    for role, code, recorded in (("rank0", 128 + signal.SIGTERM, f"blocked {GRACE_S:g}"),
                                 ("other", -signal.SIGALRM, "")):
        seen = sigterm_in_a_kernel(folder, role)
        took = seen["took_s"]
        ok = took is not None and took <= GRACE_S + 2 and seen["code"] == code and seen["recorded"] == recorded
        what = "rank 0" if role == "rank0" else "another rank"
        kernel = "a minute-long CUDA kernel" if device != "cpu" else "a long CPU matrix product"
        result = (f"ended {took:.1f} s after it (grace {GRACE_S:g} s), exit {seen['code']}"
                  if took is not None else seen.get("error", "—"))
        rows.append(row(f"SIGTERM during {kernel}, {what}", result,
                        [] if ok else [f"exit {seen['code']} after {took} s, recorded {seen['recorded']!r}"]))
    return rows


def table(rows: list[dict]) -> list[str]:
    lines = ["| check | result | status |", "| --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['result']} | {'; '.join(r['problems']) or 'as it should'} |")
    return lines


def pair_ratios(paths: dict) -> list[float]:
    """Every Parallax-vs-hand pair's ratio, both data paths."""
    return [ratio for result in paths.values() for ratio in result.get("ratios", [])]


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def run_checks(run_one, home: Path, db_url: str, timeout_s: float, device: str) -> list[dict]:
    """Every check but the stop check's cost (which compares two of gpu_check's runs), in the order above."""
    rows = [stop_and_resume(run_one, db_url, timeout_s, device)]
    rows += nan_stops(run_one, db_url, timeout_s, device)
    rows.append(sdk_on_one_gpu(home, db_url))
    rows += sigterm_rows(home, device)
    for r in rows:
        print("\n".join(table([r])[2:]), flush=True)
    return rows
