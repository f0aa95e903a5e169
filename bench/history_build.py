"""Histories for bench/history.py, written through Parallax's own write paths: runs the way a rank records
them (``store.create_run``, the ``Recorder``'s epochs and step points, system samples, ``run_state.finish``),
script runs through the SDK (``parallax.init``, ``log``, ``finish``), and a script logging a million steps
in a separate process, as a user's script does. No hand-written SQL, no copied rows.

    engine = make_engine(url)
    add_runs(engine, 10_000, first_index=0)      # engine runs, and one script run in ten
    run_id = log_steps_script(db_url, steps=1_000_000, names=4)   # a real process; returns its run and timings
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

from bench.common import ROOT, child_env

STRATEGIES = (("single", ("cpu",)), ("ddp", ("cpu", "cpu")), ("dp", ("cpu",)), ("mp", ("cpu", "cpu")))
MODELS = ("resnet18", "mobilenetv3_small_100", "efficientnet_b0", "test_resnet")
LEARNING_RATES = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2)
EPOCHS, STEPS_PER_EPOCH, SAMPLES = 3, 12, 10
SCRIPT_EVERY = 10  # one run in ten is a script's (parallax.init)
SCRIPT_STEPS = 50


def add_runs(engine, count: int, *, first_index: int) -> dict[str, float]:
    """``count`` finished runs, numbered from ``first_index`` (their settings vary with it); returns the
    seconds spent on each kind."""
    spent = {"parallax_s": 0.0, "script_s": 0.0}
    for index in range(first_index, first_index + count):
        started = time.perf_counter()
        if index % SCRIPT_EVERY == SCRIPT_EVERY - 1:
            _script_run(engine, index)
            spent["script_s"] += time.perf_counter() - started
        else:
            _engine_run(engine, index)
            spent["parallax_s"] += time.perf_counter() - started
    return spent


def _engine_run(engine, index: int) -> int:
    from contract.config import RunConfig
    from db import run_state, store, system_metrics
    from trainer_backend.telemetry.recorder import Recorder

    strategy, devices = STRATEGIES[index % len(STRATEGIES)]
    lr = LEARNING_RATES[index % len(LEARNING_RATES)]
    config = RunConfig(strategy=strategy, devices=devices, model=MODELS[index % len(MODELS)], epochs=EPOCHS,
                       batch_size=(64, 128, 256)[index % 3], lr=lr,
                       tags=("sweep", f"week-{index % 52}") if index % 5 == 0 else ()).to_dict()
    run_id = store.create_run(engine, config, status="running", world_size=len(devices) if strategy == "ddp" else 1)
    recorder = Recorder(engine, run_id)
    speed = 400.0 * (1.6 if strategy == "ddp" else 1.0) + index % 97
    quality = 0.5 + 0.45 * ((index * 7919) % 1000) / 1000
    steps, step = [], 0
    for epoch in range(1, EPOCHS + 1):
        for _ in range(STEPS_PER_EPOCH):
            step += 1
            steps.append({"epoch": epoch, "step": step, "t_s": 0.25 * step, "train_loss": 2.3 / step,
                          "images_per_s": speed, "lr": lr})
        recorder.epoch(epoch, {"epoch": epoch, "train_loss": 2.3 / epoch, "train_acc": quality * epoch / EPOCHS,
                               "val_loss": 2.4 / epoch, "val_acc": quality * epoch / EPOCHS, "epoch_time_s": 3.2,
                               "train_time_s": 3.0, "images_per_s": speed + epoch, "lr": lr,
                               "peak_memory_mb": {"cpu": 900.0 + epoch}})
    recorder.step_points(steps, window_s=None)
    system_metrics.add_samples(engine, run_id, [
        {"t_s": float(t), "node": 0, "host_cpu_pct": 95.0, "host_memory_mb": 4000.0 + t,
         "processes": [{"rank": rank, "cpu_pct": 98.0, "rss_mb": 800.0 + t} for rank in range(len(devices))],
         "gpus": []} for t in range(SAMPLES)])
    run_state.finish(engine, run_id, "completed" if index % 13 else "failed",
                     None if index % 13 else "RuntimeError: the loss went NaN at step 17")
    return run_id


def _script_run(engine, index: int) -> None:
    import parallax

    # The SDK finds its database as a user's script does, in the environment: the history's, for this run.
    saved = os.environ.get("PARALLAX_DB_URL")
    os.environ["PARALLAX_DB_URL"] = engine.url.render_as_string(hide_password=False)
    try:
        _log_trial(parallax, index)
    finally:
        if saved is None:
            os.environ.pop("PARALLAX_DB_URL", None)
        else:
            os.environ["PARALLAX_DB_URL"] = saved


def _log_trial(parallax, index: int) -> None:
    with parallax.init(project="history", name=f"trial-{index}",
                       config={"lr": LEARNING_RATES[index % len(LEARNING_RATES)], "optimizer": "adam",
                               "batch_size": (64, 128, 256)[index % 3]},
                       tags=["script"]) as run:
        for step in range(SCRIPT_STEPS):
            run.log({"train/loss": 2.3 / (step + 1), "val/acc": 0.5 + step / 200}, step=step)
        run.summary["val/acc"] = 0.5 + SCRIPT_STEPS / 200


STEPS_SCRIPT = """
import json, math, sys, time
import parallax

steps, names, spike_at = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
metrics = [f"metric/{i}" for i in range(names)]
run = parallax.init(project="history", name=f"{steps}-steps", config={"steps": steps, "names": names})
started = time.perf_counter()
for step in range(steps):
    value = 100.0 if step == spike_at else 1.0 + 0.01 * (step % 7)
    parallax.log({name: value for name in metrics}, step=step)
logged = time.perf_counter()
parallax.finish()
done = time.perf_counter()
print(json.dumps({"run_id": run.run_id, "loop_s": logged - started, "total_s": done - started}), flush=True)
"""


def log_steps_script(db_url: str, *, steps: int, names: int, spike_at: int, timeout_s: float = 3600) -> dict:
    """A script (a process of its own, ``import parallax``) logging ``names`` values at each of ``steps``
    steps in a tight loop, a spike of 100 at ``spike_at``; returns its run id, the loop's and the whole
    run's seconds (until ``finish`` returned: every value written), and what it said on stderr."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(STEPS_SCRIPT), str(steps), str(names), str(spike_at)],
                          cwd=ROOT, env=child_env(PARALLAX_DB_URL=db_url), capture_output=True, text=True,
                          timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"the logging script failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}


SYSTEM_SPIKE_PCT = 150.0  # one second of GPU 1, halfway: above any other reading (90 to 99 %)


def add_system_day(engine, run_id: int, *, ranks: int, seconds: int) -> None:
    """A day (``seconds``) of one-second samples of a machine running ``ranks`` ranks on as many GPUs, written
    as the sampler writes them (``system_metrics.add_samples``), an hour of samples at a time (the sampler's
    batches are seconds long; larger ones only shorten the build). GPU 1 reads ``SYSTEM_SPIKE_PCT`` for one
    second halfway through."""
    from db import system_metrics

    batch = 3600
    for start in range(0, seconds, batch):
        samples = [
            {"t_s": float(t), "node": 0, "host_cpu_pct": 50.0 + t % 40, "host_memory_mb": 60_000.0 + t % 500,
             "processes": [{"rank": rank, "cpu_pct": 90.0 + (t + rank) % 10, "rss_mb": 3000.0 + rank}
                           for rank in range(ranks)],
             "gpus": [{"index": rank, "util_pct": 90.0 + (t * rank) % 10, "memory_used_mb": 40_000.0 + rank,
                       "power_w": 300.0 + rank, "temperature_c": 60.0, "sm_clock_mhz": 1980.0}
                      for rank in range(ranks)]}
            for t in range(start, min(seconds, start + batch))]
        for sample in samples:
            if sample["t_s"] == seconds // 2 and ranks > 1:
                sample["gpus"][1]["util_pct"] = SYSTEM_SPIKE_PCT
        system_metrics.add_samples(engine, run_id, samples)


def database_bytes(engine) -> int:
    """The database's size on disk: SQLite's file and its write-ahead log, checkpointed first; PostgreSQL's
    ``pg_database_size``."""
    from sqlalchemy import text

    from db.connection import sqlite_file

    path = sqlite_file(engine.url)
    with engine.connect() as connection:
        if path is None:
            return int(connection.scalar(text("SELECT pg_database_size(current_database())")))
        connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    return sum(os.path.getsize(f"{path}{suffix}") for suffix in ("", "-wal") if os.path.exists(f"{path}{suffix}"))
