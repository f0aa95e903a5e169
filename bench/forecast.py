"""Scaling forecast against measurement: how far the sweep report's forecast lands from what a
larger run then measures.

Each repeat is one sweep through the CLI, ``sweep --strategies single,ddp --device-counts 2,4``
(resnet18 on digits at 32x32, global batch 128, 2 epochs, throughput from the second): a single
run, DDP on 2 CPU processes and DDP on 4. The forecast is fitted on the run on 2 processes alone
(as the report does) and its images/s, speedup and memory per device at 4 processes are compared
with the run on 4: error = forecast / measured - 1. On 2 cores, 4 processes share the cores the
model takes as 4 independent devices, so the error here says how far that assumption is from a
CPU, not how good the forecast is on GPUs.

    python bench/forecast.py            # full: 3 sweeps (--sweeps N)
    python bench/forecast.py --quick    # one sweep of a tiny model, checked at 3 processes
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import parallax_command, parallax_home, parse_args, prime_dataset_cache, run_timed  # noqa: E402
from bench.report import Report  # noqa: E402

KEY, TITLE = "forecast", "Scaling forecast"
METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
FULL_SWEEPS = 3
CALIBRATION, TARGET = 2, 4  # processes the forecast is fitted on, and the count it is checked at
QUICK_TARGET = 3  # --quick: a process fewer, and no more processes than cores plus one


def settings(quick: bool) -> dict:
    if quick:
        return {"model": "test_resnet", "image_size": 16, "epochs": 1, "batch_size": 96}  # divides over 2 and 3
    return {"model": "resnet18", "image_size": 32, "epochs": 2, "batch_size": 128}


def one_sweep(db_url: str, workload: dict, target: int) -> dict:
    """Run the sweep; return the forecast's row at ``target`` processes and the sweep's wall time."""
    from db import make_engine
    from reports.scaling_forecast import sweep_forecast

    done = run_timed(parallax_command(
        "sweep", "--strategies", "single,ddp", "--device-counts", f"{CALIBRATION},{target}", "--dataset", "digits",
        "--model", workload["model"], "--image-size", str(workload["image_size"]), "--epochs", str(workload["epochs"]),
        "--batch-size", str(workload["batch_size"]), "--bn-stats-images", "0", "--target-acc", "0.5",
        db_url=db_url), timeout=1200)
    sweep_id = int(done.stdout.split()[0].split("=")[1])
    forecast = sweep_forecast(make_engine(db_url), sweep_id)
    rows = forecast.table[(forecast.table["strategy"] == "ddp") & (forecast.table["devices"] == target)]
    if rows.empty or rows.iloc[0]["kind"] != "predicted vs measured":
        raise RuntimeError(f"sweep {sweep_id} gave no forecast checked at {target}:\n{done.stdout[-3000:]}")
    fitted = next((line for line in forecast.assumptions if line.startswith("DDP fitted")), "")
    return {"row": rows.iloc[0].to_dict(), "wall_s": done.seconds, "fitted": fitted}


def main() -> None:
    args = parse_args(__doc__, lambda parser: parser.add_argument(
        "--sweeps", type=int, default=None, help=f"sweeps to run (default {FULL_SWEEPS}; 1 with --quick); "
        "each is three training runs, so it stands in for --repeats"))
    repeats = args.sweeps or (1 if args.quick else FULL_SWEEPS)
    workload = settings(args.quick)
    target = QUICK_TARGET if args.quick else TARGET
    report = Report(KEY, TITLE, method=METHOD)
    report.settings = {**workload, "sweeps": repeats, "strategies": "single,ddp", "device counts": f"{CALIBRATION},{target}"}
    with parallax_home() as home:
        db_url = f"sqlite:///{home / 'parallax.db'}"
        prime_dataset_cache({"dataset": "digits", "image_size": workload["image_size"]}, args.quick)
        sweeps = [one_sweep(db_url, workload, target) for _ in range(repeats)]
    rows = [s["row"] for s in sweeps]
    report.add(f"DDP on {target} CPU processes: forecast images/s error (fitted on {CALIBRATION})",
               [100 * r["error"] for r in rows], unit=" %")
    report.add(f"forecast images/s at {target}", [r["images_per_s_predicted"] for r in rows], headline=False)
    report.add(f"measured images/s at {target}", [r["images_per_s_measured"] for r in rows], headline=False)
    report.add(f"forecast speedup over single at {target}", [r["speedup_predicted"] for r in rows], unit="×",
               headline=False)
    report.add(f"measured speedup over single at {target}", [r["speedup_measured"] for r in rows], unit="×",
               headline=False)
    memory = [r["memory_error"] for r in rows if r["memory_error"] == r["memory_error"] and r["memory_error"] is not None]
    if memory:
        report.add(f"forecast memory per device error at {target}", [100 * e for e in memory], unit=" %")
    else:
        report.note("Memory per device is not forecast here: these runs recorded no memory breakdown.")
    report.add("one sweep (3 runs), start to finish", [s["wall_s"] for s in sweeps], unit=" s", headline=False)
    report.note(f"Fit of the last sweep: {sweeps[-1]['fitted'].removeprefix('DDP fitted on ')}")
    report.finish(args)


if __name__ == "__main__":
    main()
