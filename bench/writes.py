"""Writes: what recording a run costs the training, and whether SQLite keeps up with readers.

1. Cost per call of the three writes a run makes, on a fresh SQLite database (WAL): the epoch's
   metrics (``db.store.log_epoch``, once per epoch), progress (``db.run_state.set_progress``, at
   most about once a second) and the heartbeat (``db.run_state.heartbeat``, every 5 s), 200 calls
   per repeat, the three taken in turn, five repeats.
2. Share of epoch time: a real foreground run (resnet18 on digits, 5 epochs, in this process) with
   the three functions wrapped to time every call; each epoch's write time over its recorded
   epoch time (the epoch's metrics are written after that time is taken, so this errs high).
3. Concurrency: one writer process (log_epoch, set_progress and heartbeat as fast as it can, a new
   run every 50 epochs) and five reader processes (the dashboard's queries: run list, run table,
   one run with its epochs, metrics of the newest runs) for 60 s. Counted: "database is locked"
   errors on either side, and rows the writer committed that are not in the database afterwards.

    python bench/writes.py            # full
    python bench/writes.py --quick    # few calls, a 2 s soak, a one-epoch run of a tiny model
"""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import digits_workload, parallax_home, parse_args  # noqa: E402
from bench.report import Report  # noqa: E402
from bench.stats import alternate, at_most, timed_calls  # noqa: E402

METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
READERS = 5
EPOCHS_PER_RUN = 50


def metrics(epoch: int) -> dict:
    return {"epoch": epoch, "train_loss": 0.5, "train_acc": 0.9, "val_loss": 0.6, "val_acc": 0.88,
            "epoch_time_s": 3.0, "train_time_s": 2.7, "images_per_s": 520.0, "lr": 1e-3,
            "peak_memory_mb": {"cpu": 1200.0}}


def new_run(engine) -> int:
    from db import store
    from contract.config import RunConfig

    return store.create_run(engine, RunConfig().to_dict(), status="running")


# --- 1. cost per call -----------------------------------------------------------------------


class CallCosts:
    """Seconds per call of each write, ``calls`` calls per measurement, against one run."""

    def __init__(self, url: str, calls: int):
        from db import make_engine

        self.engine, self.calls = make_engine(url), calls
        self.run_id = new_run(self.engine)
        self.epoch = 0

    def _per_call(self, write) -> float:
        start = time.perf_counter()
        for step in range(self.calls):
            write(step)
        return (time.perf_counter() - start) / self.calls

    def log_epoch(self) -> float:
        from db import store

        def write(_):
            self.epoch += 1
            store.log_epoch(self.engine, self.run_id, metrics(self.epoch))

        return self._per_call(write)

    def set_progress(self) -> float:
        from db import run_state as lifecycle

        return self._per_call(lambda step: lifecycle.set_progress(self.engine, self.run_id, epoch=1, step=step,
                                                                  total_steps=self.calls))

    def heartbeat(self) -> float:
        from db import run_state as lifecycle

        return self._per_call(lambda _: lifecycle.heartbeat(self.engine, self.run_id))


# --- 2. share of a real run's epoch time ----------------------------------------------------


def instrumented_run(settings: dict) -> dict:
    """Train in this process with the three writes wrapped.

    Returns, per epoch, the seconds spent in writes and the epoch's recorded time. A write
    belongs to the epoch whose ``log_epoch`` closes it (the heartbeat before training, and the
    queue claim, fall into epoch 1: a little pessimistic)."""
    from db import run_state as lifecycle, make_engine, store
    from contract.config import RunConfig
    from trainer_backend.supervisor.runner import execute_run

    calls: list[tuple[str, float]] = []
    originals = {"log_epoch": (store, store.log_epoch), "set_progress": (lifecycle, lifecycle.set_progress),
                 "heartbeat": (lifecycle, lifecycle.heartbeat)}

    for name, (module, function) in originals.items():
        setattr(module, name, timed_calls(function, lambda seconds, name=name: calls.append((name, seconds))))
    try:
        config = RunConfig(dataset=settings["dataset"], model=settings["model"], epochs=settings["epochs"],
                           batch_size=settings["batch_size"], image_size=settings["image_size"])
        run_id, status = execute_run(config, echo=False)
    finally:
        for name, (module, function) in originals.items():
            setattr(module, name, function)
    if status != "completed":
        raise RuntimeError(f"the instrumented run ended {status}")
    epochs = store.export_run(make_engine(), run_id)["epochs"]
    per_epoch: list[dict[str, float]] = [{name: 0.0 for name in originals}]
    counts = {name: 0 for name in originals}
    for name, seconds in calls:
        if len(per_epoch) > len(epochs):
            break  # writes after the last epoch (none today) do not slow training
        per_epoch[-1][name] += seconds
        counts[name] += 1
        if name == "log_epoch":
            per_epoch.append({key: 0.0 for key in originals})
    return {"write_s": [sum(p.values()) for p in per_epoch[:len(epochs)]],
            "epoch_time_s": [e["epoch_time_s"] for e in epochs], "calls": counts, "epochs": len(epochs)}


# --- 3. one writer, five readers ------------------------------------------------------------


def is_locked(exc: Exception) -> bool:
    return "database is locked" in str(exc).lower()


def writer(url: str, seconds: float, start, results) -> None:
    from db import run_state as lifecycle, make_engine, store

    engine = make_engine(url)
    committed, locked, errors, latencies = 0, 0, 0, []
    run_id, epoch = new_run(engine), 0
    start.wait()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if epoch == EPOCHS_PER_RUN:
            lifecycle.finish(engine, run_id, "completed")
            run_id, epoch = new_run(engine), 0
        began = time.perf_counter()
        try:
            store.log_epoch(engine, run_id, metrics(epoch + 1))
            epoch += 1
            committed += 1
            lifecycle.set_progress(engine, run_id, epoch=epoch, step=1, total_steps=1)
            lifecycle.heartbeat(engine, run_id)
        except Exception as exc:  # counted, never fatal: the test is whether any happen
            locked += is_locked(exc)
            errors += not is_locked(exc)
        latencies.append(time.perf_counter() - began)
    results.put({"role": "writer", "committed": committed, "locked": locked, "errors": errors,
                 "iterations": len(latencies), "latencies": latencies})


def reader(url: str, seconds: float, start, results) -> None:
    from db import make_engine, store

    try:
        from db import dashboard
    except ImportError:  # the dashboard's own queries, where they exist
        dashboard = None
    engine = make_engine(url)
    queries, locked, errors = 0, 0, 0
    start.wait()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            newest = store.list_runs(engine, limit=5)
            if dashboard is not None:
                dashboard.run_table(engine)
            if newest:
                store.export_run(engine, newest[0].id)
                store.read_epoch_metrics(engine, [run.id for run in newest])
            queries += 1
        except Exception as exc:
            locked += is_locked(exc)
            errors += not is_locked(exc)
    results.put({"role": "reader", "queries": queries, "locked": locked, "errors": errors})


def soak(url: str, seconds: float) -> dict:
    from sqlalchemy import func, select

    from db import make_engine
    from db.connection import session_scope
    from db.tables import EpochMetric

    make_engine(url)  # create and migrate before the processes open it
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(READERS + 2), context.Queue()
    processes = [context.Process(target=writer, args=(url, seconds, start, results))]
    processes += [context.Process(target=reader, args=(url, seconds, start, results)) for _ in range(READERS)]
    for process in processes:
        process.start()
    start.wait()
    reports = [results.get(timeout=seconds + 120) for _ in processes]
    for process in processes:
        process.join(timeout=30)
    written = next(r for r in reports if r["role"] == "writer")
    readers = [r for r in reports if r["role"] == "reader"]
    with session_scope(make_engine(url)) as session:
        stored = session.scalar(select(func.count()).select_from(EpochMetric))
    latencies = sorted(written["latencies"])
    return {
        "seconds": seconds,
        "committed": written["committed"],
        "stored": stored,
        "lost": written["committed"] - stored,
        "locked": written["locked"] + sum(r["locked"] for r in readers),
        "other_errors": written["errors"] + sum(r["errors"] for r in readers),
        "writes_per_s": written["iterations"] / seconds,
        "reads_per_s": sum(r["queries"] for r in readers) / seconds,
        "write_p99_s": latencies[int(0.99 * (len(latencies) - 1))] if latencies else float("nan"),
        "write_max_s": latencies[-1] if latencies else float("nan"),
    }


def main() -> None:
    args = parse_args(__doc__)
    calls, soak_s = (20, 2.0) if args.quick else (200, 60.0)
    settings = digits_workload(args.quick, epochs=5)
    report = Report("writes", "Writes", method=METHOD)
    report.settings = {"calls_per_repeat": calls, "soak_s": soak_s, "readers": READERS,
                       "training": f"{settings['model']} on digits, {settings['epochs']} epochs",
                       "repeats": args.repeats}
    with parallax_home() as home:
        costs = CallCosts(f"sqlite:///{home / 'costs.db'}", calls)
        per_call = alternate({"log_epoch": costs.log_epoch, "set_progress": costs.set_progress,
                              "heartbeat": costs.heartbeat}, args.repeats)
        run = instrumented_run(settings)
        soaked = soak(f"sqlite:///{home / 'soak.db'}", soak_s)

    shares = [100 * w / e for w, e in zip(run["write_s"], run["epoch_time_s"])]
    report.add("writes' share of epoch time (per epoch of a real run)", shares, unit=" %", target=at_most(1.0))
    report.add("database is locked (1 writer, 5 readers)", [soaked["locked"]], target=at_most(0))
    report.add("rows lost", [soaked["lost"]], target=at_most(0))
    for name, values in per_call.items():
        report.add(f"{name}: cost per call, back to back", [1000 * v for v in values], unit=" ms", headline=False)
    report.add("writer: iterations/s (3 writes each)", [soaked["writes_per_s"]], headline=False)
    report.add("readers: query rounds/s (all 5)", [soaked["reads_per_s"]], headline=False)
    report.add("writer: p99 iteration time", [1000 * soaked["write_p99_s"]], unit=" ms", headline=False)
    report.add("writer: slowest iteration", [1000 * soaked["write_max_s"]], unit=" ms", headline=False)
    report.details.update({"run": run, "soak": soaked})
    calls_text = ", ".join(f"{name} {count / run['epochs']:.1f}" for name, count in run["calls"].items())
    report.note(f"Calls per epoch in the real run: {calls_text}; median epoch time "
                f"{statistics.median(run['epoch_time_s']):.2f} s. Progress is written at most about once a "
                "second, so the share does not grow with more steps per epoch. Inside a run the calls cost more "
                "than back to back (caches are cold after training steps), which is why the headline is "
                "measured in the run.")
    report.note(f"Soak: {soaked['committed']} epoch rows committed, {soaked['stored']} found afterwards; "
                f"{soaked['other_errors']} errors other than 'database is locked'.")
    report.finish(args)


if __name__ == "__main__":
    main()
