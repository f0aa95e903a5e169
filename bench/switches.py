"""Speed switches on this CPU: what channels_last, torch.compile, augmentation and loader workers
do to training images/s.

Parallax trains resnet18 on the digits at 32x32, batch 128, 3 epochs, one process (as
bench/overhead.py), once with the defaults and once with each switch alone:
``--channels-last``; ``--compile`` (its compile warm-up, recorded by the run in
``measurements.compile_time_s``, is reported on its own and is outside every epoch); ``--augment
flip,crop`` (the cost of augmenting each training batch on the device); ``--num-workers 2`` (the
loader in two worker processes instead of the training process). Contenders run in turn (A B C …,
repeated); images/s is the median over the epochs after the first, and each switch is quoted as
its images/s over the default run's of the same round.

    python bench/switches.py            # full: 5 rounds
    python bench/switches.py --quick    # one round of timm's tiny test_resnet at 16 px: defaults and compile
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (  # noqa: E402
    digits_workload,
    epoch_field,
    parallax_home,
    parse_args,
    prime_dataset_cache,
    run_parallax,
)
from bench.report import Report  # noqa: E402
from bench.stats import alternate  # noqa: E402

KEY, TITLE = "switches", "Speed switches on this CPU"
METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
SWITCHES = {
    "defaults": (),
    "channels_last": ("--channels-last",),
    "compile": ("--compile",),
    "augment flip,crop": ("--augment", "flip,crop"),
    "2 loader workers": ("--num-workers", "2"),
}


# --quick: the defaults and the one switch with a figure of its own (compile's warm-up), which run
# every line of the report; the other switches differ from these only in their flags.
QUICK_SWITCHES = ("defaults", "compile")


def main() -> None:
    args = parse_args(__doc__)
    report = Report(KEY, TITLE, method=METHOD)
    settings = digits_workload(args.quick, epochs=3)
    report.settings = {**settings, "repeats": args.repeats}
    with parallax_home() as home:
        db_url = f"sqlite:///{home / 'parallax.db'}"
        prime_dataset_cache(settings, args.quick)
        switches = {name: flags for name, flags in SWITCHES.items() if not args.quick or name in QUICK_SWITCHES}
        runs = alternate({name: (lambda flags=flags: run_parallax(settings, db_url, *flags))
                          for name, flags in switches.items()}, args.repeats, label=f"{KEY} ")
    speeds = {name: [epoch_field(run, "images_per_s") for run in results] for name, results in runs.items()}
    report.add("defaults: training images/s", speeds["defaults"], unit=" images/s", headline=False)
    for name in switches:
        if name == "defaults":
            continue
        report.ratio(f"{name}: images/s over the defaults'", speeds[name], speeds["defaults"])
        report.add(f"{name}: training images/s", speeds[name], unit=" images/s", headline=False)
    report.add("compile: compile warm-up before epoch 1",
               [run["export"]["measurements"]["compile_time_s"] for run in runs["compile"]], unit=" s")
    report.note("On a CPU, channels_last and compile change which kernels oneDNN and TorchInductor pick; the GPU "
                "figures (tensor cores, fused kernels) are in bench/gpu.py and differ in kind.")
    report.note("The compile warm-up reuses TorchInductor's on-disk cache when an earlier run compiled the same "
                "graph; the first compile on a machine takes longer.")
    busy = report.cpu.others_cores()
    if busy > 0.25:
        report.note(f"Other processes kept {busy:.2f} of the cores busy while this ran: with few rounds the ratios "
                    "carry that load as much as the switches' effect (rerun on a quiet machine).")
    report.finish(args)


if __name__ == "__main__":
    main()
