"""Series cost: what the per-step points, the system sampler and the energy meter cost training.

A real foreground run (resnet18 on digits, 3 epochs, in this process, the ``single`` strategy, so
the sampler thread shares the training process and its cores) with the recorder's and the energy
meter's methods wrapped to time every call the training thread makes into them (the device
buffer copy, the points, the batched writes of step rows), and the sampler thread's own CPU time
(its samples and batched writes of system samples, ``db.system_metrics``). The share is those seconds over the
run's training time (the sum of its epochs' ``train_time_s``). Two cadences take turns: the
defaults (a point at most every 0.5 s, a sample every second) and the densest (a point every step,
a sample every 0.2 s), five runs each.

    python bench/series_cost.py            # full
    python bench/series_cost.py --quick    # one tiny one-epoch run at the default cadence
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import digits_workload, parallax_home, parse_args, prime_dataset_cache  # noqa: E402
from bench.report import Report  # noqa: E402
from bench.stats import alternate, at_most, timed_calls  # noqa: E402

METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
CADENCES = {"defaults": {}, "densest": {"PARALLAX_STEP_POINT_S": "0.000001", "PARALLAX_SAMPLE_S": "0.2"}}


def instrumented_run(settings: dict, environment: dict[str, str]) -> dict:
    """Train in this process with the series' calls timed; their seconds and the training time."""
    from db import make_engine, store
    from contract.config import RunConfig
    from trainer_backend.telemetry.energy import EnergyMeter
    from trainer_backend.supervisor.runner import execute_run
    from trainer_backend.telemetry.sampler import SystemSampler
    from trainer_backend.telemetry.steps import StepRecorder

    spent = {"recorder_s": 0.0, "energy_s": 0.0, "sampler_cpu_s": 0.0, "samples": 0, "step_rows": 0}
    wrapped = [(StepRecorder, name, "recorder_s") for name in ("start_epoch", "loss", "step", "end_epoch")]
    wrapped += [(EnergyMeter, name, "energy_s") for name in ("start", "tick", "stop")]
    originals = [(cls, name, getattr(cls, name)) for cls, name, _ in wrapped]

    def timed(function, key):
        return timed_calls(function, lambda seconds: spent.__setitem__(key, spent[key] + seconds))

    sampler_stop = SystemSampler.stop

    def stop(self):
        sampler_stop(self)
        spent["sampler_cpu_s"] += self.cost_s
        spent["samples"] += self.written

    saved_env = {key: os.environ.get(key) for key in environment}
    for cls, name, key in wrapped:
        setattr(cls, name, timed(getattr(cls, name), key))
    SystemSampler.stop = stop
    os.environ.update(environment)
    try:
        config = RunConfig(dataset=settings["dataset"], model=settings["model"], epochs=settings["epochs"],
                           batch_size=settings["batch_size"], image_size=settings["image_size"], bn_stats_images=0)
        run_id, status = execute_run(config, echo=False)
    finally:
        for cls, name, function in originals:
            setattr(cls, name, function)
        SystemSampler.stop = sampler_stop
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    if status != "completed":
        raise RuntimeError(f"the instrumented run ended {status}")
    engine = make_engine()
    epochs = store.export_run(engine, run_id)["epochs"]
    spent["step_rows"] = len(series_rows(engine, run_id))
    spent["train_s"] = sum(e["train_time_s"] for e in epochs)
    spent["share_pct"] = 100 * (spent["recorder_s"] + spent["energy_s"] + spent["sampler_cpu_s"]) / spent["train_s"]
    return spent


def series_rows(engine, run_id: int) -> list:
    from sqlalchemy import select

    from db.connection import session_scope
    from db.tables import StepMetric

    with session_scope(engine) as session:
        return list(session.scalars(select(StepMetric.step).where(StepMetric.run_id == run_id)))


def main() -> None:
    args = parse_args(__doc__)
    settings = digits_workload(args.quick, epochs=3)
    report = Report("series_cost", "Series cost (step points, system samples, energy)", method=METHOD)
    report.settings = {"training": f"{settings['model']} on digits, {settings['epochs']} epochs, single, CPU",
                       "cadences": CADENCES, "repeats": args.repeats}
    with parallax_home():
        prime_dataset_cache(settings, args.quick)
        cadences = {"defaults": CADENCES["defaults"]} if args.quick else CADENCES  # quick: checks that it runs
        runs = alternate({name: functools.partial(instrumented_run, settings, env) for name, env in cadences.items()},
                         args.repeats)
    for name, results in runs.items():
        report.add(f"series' share of training time ({name})", [r["share_pct"] for r in results], unit=" %",
                   target=at_most(1.0), headline=name == "defaults")
        report.add(f"recorder and energy meter, training thread ({name})",
                   [1000 * (r["recorder_s"] + r["energy_s"]) for r in results], unit=" ms", headline=False)
        report.add(f"sampler thread CPU ({name})", [1000 * r["sampler_cpu_s"] for r in results], unit=" ms",
                   headline=False)
        report.add(f"step points written ({name})", [r["step_rows"] for r in results], headline=False)
        report.add(f"system samples written ({name})", [r["samples"] for r in results], headline=False)
        report.add(f"training time ({name})", [r["train_s"] for r in results], unit=" s", headline=False)
    report.details["runs"] = runs
    report.note("The sampler's share is its thread's CPU time: on a machine whose cores training keeps busy, "
                "that is the time it can take from training. Writes are batched (every 5 s and at each epoch's "
                "end), so the share does not grow with the step rate beyond the points themselves.")
    report.finish(args)


if __name__ == "__main__":
    main()
