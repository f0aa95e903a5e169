"""Parallax overhead: ``python -m trainer_backend run`` against a hand-written PyTorch script.

Both processes do the same work (bench/plain_loop.py: digits at 32x32, stratified split, resnet18,
Adam, batch 128, torch's default threads, validation every epoch, 2 epochs) and are started in
turn, five times each (in make bench, in one rotation with the other benchmarks that share the
Parallax's runs: bench/shared_runs.py). Figures:

- whole process: wall-clock time from start to exit, imports, data and start-up included;
- training loop alone, in one process (bench/loop_in_process.py): Parallax's epoch (its loader,
  its loop, its progress writes and heartbeat) and the plain script's steps interleaved step by
  step on one model, eight epochs after two warm-up epochs; quoted per epoch as Parallax loop time
  over plain loop time for the same images. Separate processes, and even whole epochs in one
  process, differ by more than 3 % from one another on this machine whatever they run, so the loops
  are compared step against neighbouring step. The plain step leaves its gradients in place (it
  zeroes before its backward pass, Parallax after its optimizer step); they are dropped off both
  clocks, or Parallax's next backward pass would add into them;
- the same from the separate processes above (images/s of the epochs after the first, as the
  Parallax records them and as the plain script measures them), for reference.

    python bench/overhead.py            # full: 5 repeats
    python bench/overhead.py --quick    # one tiny repeat, to check the script runs
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import BENCH_DIR, PYTHON, epoch_field, run_timed  # noqa: E402
from bench.report import Report  # noqa: E402
from bench.stats import at_most  # noqa: E402

KEY, TITLE = "overhead", "Parallax overhead"
METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]


def run_plain(settings: dict) -> dict:
    done = run_timed([PYTHON, str(BENCH_DIR / "plain_loop.py"), "--model", settings["model"],
                      "--epochs", str(settings["epochs"]), "--batch-size", str(settings["batch_size"]),
                      "--image-size", str(settings["image_size"])])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"wall_s": done.seconds, "epochs": result["epochs"], "threads": result["threads"]}


def loop_in_process(settings: dict, quick: bool) -> dict:
    """bench/loop_in_process.py: Parallax's steps and the plain loop's, interleaved in one process."""
    done = run_timed([PYTHON, str(BENCH_DIR / "loop_in_process.py"), "--epochs", "1" if quick else "8",
                      "--model", settings["model"], "--batch-size", str(settings["batch_size"]),
                      "--image-size", str(settings["image_size"])])
    return json.loads(done.stdout.strip().splitlines()[-1])


def loop_ratios(loop: dict) -> list[float]:
    """Per measured epoch: Parallax's seconds per image over the plain loop's."""
    return [(e["parallax_s"] / e["parallax_images"]) / (e["plain_s"] / e["plain_images"]) for e in loop["epochs"]]


def step_pair_ratios(loop: dict) -> list[float]:
    """Each Parallax step over the plain step next to it (full batches only: the last is shorter)."""
    return [ours / plain for e in loop["epochs"]
            for ours, plain in zip(e["parallax_steps_s"][:-1], e["plain_steps_s"][:-1])]


def own_work_note(loop: dict) -> str:
    """Parallax's extra work per step, timed directly, next to how much whole epochs of one loop
    differ from each other on this machine."""
    extra = loop["extra"]
    parts = ", ".join(f"{name} {1000 * seconds:+.3f} ms" for name, seconds in extra["parts_s"].items())
    epoch_s = {side: [e[f"{side}_s"] for e in loop["epochs"]] for side in ("parallax", "plain")}
    spread = max(max(times) / min(times) - 1 for times in epoch_s.values())
    return (f"Parallax's own work in a step of {1000 * extra['step_s']:.0f} ms, timed piece by piece: {parts} "
            f"(a progress write takes {1000 * extra['progress_write_s']:.2f} ms and happens about once a second); "
            f"{100 * extra['share']:+.2f} % of the step in all. Whole epochs of one and the same loop took up to "
            f"{100 * spread:.0f} % longer than others in this measurement, which is why the loops are compared "
            f"step by step.")


def outside_epochs_s(run: dict) -> float:
    """Process time not spent in epochs: interpreter start, imports, data, model, teardown."""
    return run["wall_s"] - sum(e["epoch_time_s"] for e in run["epochs"])


def contenders(settings: dict, db_url: str) -> dict:
    return {"plain": lambda: run_plain(settings)}


def fill(report: Report, runs: dict, context) -> None:
    settings = context.settings
    loop = loop_in_process(settings, context.quick)
    plain, engine = runs["plain"], runs["parallax"]
    wall = {name: [r["wall_s"] for r in runs[name]] for name in ("parallax", "plain")}
    speed = {name: [epoch_field(r, "images_per_s") for r in runs[name]] for name in ("parallax", "plain")}
    report.ratio("whole process time, Parallax / plain", wall["parallax"], wall["plain"], target=at_most(1.10))
    report.add("training loop time, Parallax / plain (one process, steps interleaved)", loop_ratios(loop), unit="×",
               target=at_most(1.03))
    report.add("Parallax step / the plain step next to it (every full step of the epochs above)",
               step_pair_ratios(loop), unit="×", headline=False)
    extra = loop["extra"]
    report.add("Parallax's own work per step, share of a step (measured piece by piece)", [100 * extra["share"]],
               unit=" %", headline=False)
    report.note(own_work_note(loop))
    # Loop time is images / (images/s): Parallax time over plain time is plain images/s over engine's.
    report.ratio("training loop time, Parallax / plain (separate processes)", speed["plain"], speed["parallax"],
                 headline=False)
    report.add("Parallax process", wall["parallax"], unit=" s", headline=False)
    report.add("plain process", wall["plain"], unit=" s", headline=False)
    report.add("Parallax training images/s (epochs 2+)", speed["parallax"], headline=False)
    report.add("plain training images/s (epochs 2+)", speed["plain"], headline=False)
    report.add("Parallax time outside epochs", [outside_epochs_s(r) for r in engine], unit=" s", headline=False)
    report.add("plain time outside epochs", [outside_epochs_s(r) for r in plain], unit=" s", headline=False)
    report.add("Parallax epoch with validation (epochs 2+)", [epoch_field(r, "epoch_time_s") for r in engine],
               unit=" s", headline=False)
    report.add("plain epoch with validation (epochs 2+)", [epoch_field(r, "epoch_time_s") for r in plain],
               unit=" s", headline=False)
    report.settings["torch_threads"] = plain[0]["threads"]
    report.note(startup_note(engine, plain, settings["epochs"]))


def startup_note(engine: list[dict], plain: list[dict], epochs: int) -> str:
    """Where the whole-process difference lies, and how it shrinks with longer runs."""
    outside = {name: statistics.median(outside_epochs_s(r) for r in runs)
               for name, runs in (("parallax", engine), ("plain", plain))}
    per_epoch = {name: statistics.median(sum(e["epoch_time_s"] for e in r["epochs"]) / epochs for r in runs)
                 for name, runs in (("parallax", engine), ("plain", plain))}
    text = (f"Outside its epochs (interpreter, imports, data, model, checkpoints, teardown) the Parallax process "
            f"takes {outside['parallax']:.2f} s against the plain script's {outside['plain']:.2f} s; an epoch with "
            f"validation takes {per_epoch['parallax']:.2f} s against {per_epoch['plain']:.2f} s.")
    # Whole-process ratio for a run of n epochs: (outside + n * epoch) engine over plain.
    for n in range(1, 1001):
        ratio = (outside["parallax"] + n * per_epoch["parallax"]) / (outside["plain"] + n * per_epoch["plain"])
        if ratio <= 1.10:
            return text + f" From these, runs of {n} or more such epochs stay within 1.10 of the plain script."
    return text


if __name__ == "__main__":
    from bench import shared_runs

    shared_runs.run([sys.modules[__name__]], __doc__)
