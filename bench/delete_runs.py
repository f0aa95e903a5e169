"""Deleting runs: 10,000 finished runs deleted at once, as the Runs page's "Yes, delete" does it
(``trainer_backend.control.housekeeping.delete_runs_and_files``, in batches, each its own transaction), while a
running run goes on writing its step points beside it.

The history is written through Parallax's own write paths (``bench/history_build.py``: each run as a rank records
it, three epochs, 36 step points, ten system samples; one run in ten a script's through the SDK, fifty ``log``
calls), on SQLite, each run with a folder holding its log. Then one running run's writer adds a step point every
20 ms (``db.series.add_steps``, as the recorder does) while every finished run is deleted. Measured: the whole
deletion, the longest transaction of it (each batch's ``store.delete_runs``, which holds the write lock), and the
longest a running run's write waited meanwhile.

    python bench/delete_runs.py            # 10,000 runs
    python bench/delete_runs.py --quick    # 300 runs
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import parallax_home, parse_args  # noqa: E402
from bench.report import Report  # noqa: E402
from bench.stats import at_most  # noqa: E402

METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
RUNS, QUICK_RUNS = 10_000, 300
WRITE_EVERY_S = 0.02


def running_run_writes(engine, run_id: int, stop: threading.Event, waits_s: list[float]) -> None:
    """A running run's step points, one every WRITE_EVERY_S, each write's seconds kept."""
    from db import series

    step = 0
    while not stop.is_set():
        step += 1
        started = time.perf_counter()
        series.add_steps(engine, run_id, [{"epoch": 1, "step": step, "t_s": 0.02 * step, "train_loss": 1.0,
                                           "images_per_s": 100.0, "lr": 0.1}])
        waits_s.append(time.perf_counter() - started)
        stop.wait(WRITE_EVERY_S)


def main() -> None:
    args = parse_args(__doc__)
    runs = QUICK_RUNS if args.quick else RUNS
    report = Report("delete_runs", "Deleting runs", method=METHOD)
    report.settings = {"runs": runs, "write_every_s": WRITE_EVERY_S}
    with parallax_home("parallax-bench-delete-") as home:
        import os
        import socket

        from bench.history_build import add_runs
        from db import make_engine, store
        from db.folders import run_folder
        from trainer_backend.control import housekeeping

        url = f"sqlite:///{home / 'parallax.db'}"
        engine = make_engine(url)
        started = time.perf_counter()
        add_runs(engine, runs, first_index=0)
        finished = [run.id for run in store.list_runs(engine)]
        for run_id in finished:
            run_folder(engine, run_id, create=True).joinpath("run.log").write_text("epoch 3/3\n" * 20)
        print(f"  built {len(finished):,} runs in {time.perf_counter() - started:.0f} s", flush=True)
        running = store.create_run(engine, {"dataset": "digits", "model": "resnet18", "strategy": "single",
                                            "devices": ["cpu"]}, status="running")
        store.set_process(engine, running, pid=os.getpid(), host=socket.gethostname())  # alive: not deleted

        transactions_s: list[float] = []
        original = store.delete_runs

        def timed_delete(*delete_args, **delete_kwargs):
            begun = time.perf_counter()
            try:
                return original(*delete_args, **delete_kwargs)
            finally:
                transactions_s.append(time.perf_counter() - begun)

        waits_s: list[float] = []
        stop = threading.Event()
        writer = threading.Thread(target=running_run_writes, args=(engine, running, stop, waits_s))
        store.delete_runs = timed_delete
        writer.start()
        time.sleep(0.2)  # the writer under way
        try:
            started = time.perf_counter()
            deleted, refused = housekeeping.delete_runs_and_files(finished, db_url=url)
            delete_s = time.perf_counter() - started
        finally:
            stop.set()
            writer.join()
            store.delete_runs = original
        if deleted != finished or refused or [run.id for run in store.list_runs(engine)] != [running]:
            raise RuntimeError(f"the deletion left runs behind: {refused[:3]}")
        if any(run_folder(engine, run_id).exists() for run_id in finished):
            raise RuntimeError("the deletion left run folders behind")
    print(f"  deleted {len(deleted):,} runs in {delete_s:.1f} s, {len(transactions_s)} transactions, longest "
          f"{max(transactions_s):.3f} s; the running run's longest write {max(waits_s):.3f} s", flush=True)
    report.add(f"deleting {runs:,} runs with their metrics and folders", [delete_s], unit=" s")
    report.add("its longest transaction (a batch of runs, holding the write lock)", [max(transactions_s)], unit=" s",
               target=at_most(1.0))
    report.add("a running run's longest step-point write meanwhile", [max(waits_s)], unit=" s", target=at_most(1.0))
    report.add("transactions", [float(len(transactions_s))], headline=False)
    report.details = {"transactions_s": transactions_s, "running_writes": len(waits_s)}
    report.finish(args)


if __name__ == "__main__":
    main()
