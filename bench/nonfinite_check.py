"""What watching the training loss for NaN and infinity costs a step (``--on-nonfinite stop``, the default).

One process, one model, one optimizer: Parallax's ``train_one_epoch`` on digits, fed by Parallax's own
dataset and loader, epochs with the guard (``rank/divergence.py``) and without it in turn (A B A B, every
other round B first), on the same weights. Figures: the step time with the guard over the step time
without it, pair by pair, and the guard's own time on the training thread per step (its ``observe`` and
``check`` timed around each call). On a CPU the check reads its flag every step, which costs nothing to
wait for; on a GPU it reads a copy started a check point earlier, so it adds no host-device
synchronisation (tests/system/test_gpu.py runs it under ``torch.cuda.set_sync_debug_mode("error")``).

    python bench/nonfinite_check.py            # resnet18 at 32 px, batch 128, 6 rounds of one epoch each
    python bench/nonfinite_check.py --quick    # test_resnet at 16 px, one round
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.common import parse_args  # noqa: E402
from bench.report import Report  # noqa: E402
from bench.stats import at_most  # noqa: E402
from contract.config import RunConfig  # noqa: E402
from trainer_backend.rank.divergence import NonfiniteGuard  # noqa: E402
from trainer_backend.rank.inputs import DeviceInputs  # noqa: E402
from trainer_backend.rank.loop import train_one_epoch  # noqa: E402
from trainer_backend.rank.models import create_model  # noqa: E402
from trainer_backend.rank.strategies import Strategy  # noqa: E402
from trainer_backend.rank.trainer import build_loaders, load_data  # noqa: E402

KEY, TITLE = "nonfinite_check", "The NaN check's cost per step (--on-nonfinite stop)"
METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]


class TimedGuard(NonfiniteGuard):
    """The guard, with the time the training thread spends in it added up."""

    spent_s = 0.0

    def observe(self, *args, **kwargs):
        started = time.perf_counter()
        super().observe(*args, **kwargs)
        self.spent_s += time.perf_counter() - started

    def check(self, step):
        started = time.perf_counter()
        try:
            super().check(step)
        finally:
            self.spent_s += time.perf_counter() - started


def main() -> None:
    args = parse_args(__doc__)
    model_name, image_size = ("test_resnet", 16) if args.quick else ("resnet18", 32)
    rounds = args.repeats if args.quick else max(args.repeats, 6)
    config = RunConfig(dataset="digits", model=model_name, image_size=image_size, batch_size=128, bn_stats_images=0)
    report = Report(KEY, TITLE, method=METHOD)
    report.settings = {"model": model_name, "image_size": image_size, "batch_size": 128, "rounds": rounds,
                       "threads": torch.get_num_threads()}
    torch.manual_seed(0)
    data = load_data(config)
    strategy = Strategy(config)
    strategy.inputs = DeviceInputs.for_run(config, data.train.normalise, strategy.input_device, 0)
    model = create_model(model_name, num_classes=data.info.num_classes, in_chans=data.info.in_chans)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader, _ = build_loaders(data, config, strategy)
    guard = TimedGuard("stop", strategy)
    step_s = {"without": [], "with": []}
    guard_per_step_s = []
    for index in range(rounds):
        order = ("without", "with") if index % 2 == 0 else ("with", "without")
        for side in order:
            watch = guard if side == "with" else None
            if watch is not None:
                watch.start_epoch(index + 1, len(loader), optimizer)
                watch.spent_s = 0.0
            _, seconds = train_one_epoch(model, loader, optimizer, strategy, guard=watch)
            step_s[side].append(seconds / len(loader))
            if watch is not None:
                guard_per_step_s.append(watch.spent_s / len(loader))
            print(f"{KEY} round {index + 1}/{rounds} {side}: {1000 * seconds / len(loader):.1f} ms/step", flush=True)
    # Epochs on this 2-core machine drift by more than the check's cost, so the pairs' ratio cannot tell 1 %
    # (6 pairs: 0.96-1.21); the target is checked on the check's own time, taken around its calls.
    report.ratio("step time with the check over without", step_s["with"], step_s["without"])
    report.add("the check's time on the training thread per step", [1e6 * s for s in guard_per_step_s], unit=" µs")
    report.add("its share of a step", [100 * g / s for g, s in zip(guard_per_step_s, step_s["with"])], unit=" %",
               target=at_most(1.0, " %"))
    report.add("step time without the check", [1000 * s for s in step_s["without"]], unit=" ms", headline=False)
    report.finish(args)


if __name__ == "__main__":
    main()
