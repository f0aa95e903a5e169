"""Engine overhead: ``python -m trainer_backend run`` against a hand-written PyTorch script.

Both processes do the same work (bench/plain_loop.py: digits at 32x32, stratified split, resnet18,
Adam, batch 128, torch's default threads, validation every epoch, 2 epochs) and are started in
turn, plain then engine, five times each. Two figures:

- whole process: wall-clock time from start to exit, imports, data and start-up included;
- training loop alone, in one process (bench/loop_in_process.py): the engine's epoch (its loader,
  its loop, its progress writes and heartbeat) and the plain script's epoch alternate five times on
  one model, after a warm-up epoch of each; quoted as engine loop time over plain loop time, pair
  by pair. Separate processes differ by more than 3 % from run to run on this machine whatever
  they run, so the loop is compared where nothing else differs;
- the same from the separate processes above (images/s of the epochs after the first, as the
  engine records them and as the plain script measures them), for reference.

    python bench/engine_overhead.py            # full: 5 repeats
    python bench/engine_overhead.py --quick    # one tiny repeat, to check the script runs
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (  # noqa: E402
    BENCH_DIR,
    PYTHON,
    Report,
    alternate,
    at_most,
    digits_workload,
    epoch_field,
    parallax_home,
    parse_args,
    prime_dataset_cache,
    run_engine,
    run_timed,
)

METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]


def run_plain(settings: dict) -> dict:
    done = run_timed([PYTHON, str(BENCH_DIR / "plain_loop.py"), "--model", settings["model"],
                      "--epochs", str(settings["epochs"]), "--batch-size", str(settings["batch_size"]),
                      "--image-size", str(settings["image_size"])])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"wall_s": done.seconds, "epochs": result["epochs"], "threads": result["threads"]}


def loop_in_process(settings: dict, quick: bool) -> dict:
    """bench/loop_in_process.py: the engine's epoch and the plain loop's, alternating in one process."""
    done = run_timed([PYTHON, str(BENCH_DIR / "loop_in_process.py"), "--pairs", "1" if quick else "5",
                      "--model", settings["model"], "--batch-size", str(settings["batch_size"]),
                      "--image-size", str(settings["image_size"])])
    return json.loads(done.stdout.strip().splitlines()[-1])


def own_work_note(loop: dict) -> str:
    """Where any loop difference could come from: the engine's extra work per step, timed directly,
    next to how much epochs of the same loop differ from each other on this machine."""
    extra = loop["extra"]
    parts = ", ".join(f"{name} {1000 * seconds:+.3f} ms" for name, seconds in extra["parts_s"].items())
    spread = [max(loop[side]) / min(loop[side]) - 1 for side in ("engine", "plain")]
    means = statistics.mean(loop["plain"]) / statistics.mean(loop["engine"])
    return (f"The engine's own work in a step of {1000 * extra['step_s']:.0f} ms, timed piece by piece: {parts} "
            f"(a progress write takes {1000 * extra['progress_write_s']:.2f} ms and happens about once a second); "
            f"{100 * extra['share']:+.2f} % of the step in all. In the same process, epochs of one and the same "
            f"loop differ by up to {100 * max(spread):.0f} % from one another (interference from the machine), "
            f"and the ratio of the mean epoch speeds is {means:.3f}: the loop comparison above can resolve a few "
            f"per cent at best on this machine, and the pieces above bound what the engine adds.")


def outside_epochs_s(run: dict) -> float:
    """Process time not spent in epochs: interpreter start, imports, data, model, teardown."""
    return run["wall_s"] - sum(e["epoch_time_s"] for e in run["epochs"])


def main() -> None:
    args = parse_args(__doc__)
    settings = digits_workload(args.quick, epochs=2)
    report = Report("engine_overhead", "Engine overhead", method=METHOD)
    report.settings = {**settings, "repeats": args.repeats}
    with parallax_home() as home:
        db_url = f"sqlite:///{home / 'parallax.db'}"
        prime_dataset_cache(settings, args.quick)
        runs = alternate({"plain": lambda: run_plain(settings), "engine": lambda: run_engine(settings, db_url)},
                         args.repeats)
        loop = loop_in_process(settings, args.quick)
    plain, engine = runs["plain"], runs["engine"]
    wall = {name: [r["wall_s"] for r in group] for name, group in runs.items()}
    speed = {name: [epoch_field(r, "images_per_s") for r in group] for name, group in runs.items()}
    report.ratio("whole process time, engine / plain", wall["engine"], wall["plain"], target=at_most(1.10))
    # Loop time is images / (images/s): engine time over plain time is plain images/s over engine's.
    report.ratio("training loop time, engine / plain (one process, alternating epochs)", loop["plain"],
                 loop["engine"], target=at_most(1.03))
    extra = loop["extra"]
    report.add("engine's own work per step, share of a step (measured piece by piece)", [100 * extra["share"]],
               unit=" %", headline=False)
    report.note(own_work_note(loop))
    report.ratio("training loop time, engine / plain (separate processes)", speed["plain"], speed["engine"],
                 headline=False)
    report.add("engine process", wall["engine"], unit=" s", headline=False)
    report.add("plain process", wall["plain"], unit=" s", headline=False)
    report.add("engine training images/s (epochs 2+)", speed["engine"], headline=False)
    report.add("plain training images/s (epochs 2+)", speed["plain"], headline=False)
    report.add("engine time outside epochs", [outside_epochs_s(r) for r in engine], unit=" s", headline=False)
    report.add("plain time outside epochs", [outside_epochs_s(r) for r in plain], unit=" s", headline=False)
    report.add("engine epoch with validation (epochs 2+)", [epoch_field(r, "epoch_time_s") for r in engine],
               unit=" s", headline=False)
    report.add("plain epoch with validation (epochs 2+)", [epoch_field(r, "epoch_time_s") for r in plain],
               unit=" s", headline=False)
    report.settings["torch_threads"] = plain[0]["threads"]
    report.note(startup_note(engine, plain, settings["epochs"]))
    report.finish(args)


def startup_note(engine: list[dict], plain: list[dict], epochs: int) -> str:
    """Where the whole-process difference lies, and how it shrinks with longer runs."""
    outside = {name: statistics.median(outside_epochs_s(r) for r in runs)
               for name, runs in (("engine", engine), ("plain", plain))}
    per_epoch = {name: statistics.median(sum(e["epoch_time_s"] for e in r["epochs"]) / epochs for r in runs)
                 for name, runs in (("engine", engine), ("plain", plain))}
    text = (f"Outside its epochs (interpreter, imports, data, model, checkpoints, teardown) the engine process "
            f"takes {outside['engine']:.2f} s against the plain script's {outside['plain']:.2f} s; an epoch with "
            f"validation takes {per_epoch['engine']:.2f} s against {per_epoch['plain']:.2f} s.")
    # Whole-process ratio for a run of n epochs: (outside + n * epoch) engine over plain.
    for n in range(1, 1001):
        ratio = (outside["engine"] + n * per_epoch["engine"]) / (outside["plain"] + n * per_epoch["plain"])
        if ratio <= 1.10:
            return text + f" From these, runs of {n} or more such epochs stay within 1.10 of the plain script."
    return text


if __name__ == "__main__":
    main()
