"""Memory estimate speed: how long "will it fit?" takes for every strategy.

Each repeat is a fresh process (the traces are cached within one) that estimates resnet50 at
224x224, global batch 256, 1,000 classes, under single, dp, ddp, fsdp, mp and pp on two CPU
devices, as ``estimate --strategies`` builds them: the time from the first estimate to the last,
after the imports (torch, timm), is the figure held to the target; the command line's whole run,
interpreter start and imports included, is shown beside it. Nothing is trained and no weights
are read: the model is built and stepped under fake tensors.

    python bench/memory_estimate.py            # full: 5 repeats
    python bench/memory_estimate.py --quick    # one repeat of a tiny model
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import PYTHON, ROOT, child_env, parallax_command, parse_args, run_timed  # noqa: E402
from bench.report import Report  # noqa: E402
from bench.stats import at_most  # noqa: E402

KEY, TITLE = "memory_estimate", "Memory estimate"
METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
STRATEGIES = ("single", "dp", "ddp", "fsdp", "mp", "pp")
TARGET_S = 5.0


def settings(quick: bool) -> dict:
    if quick:
        return {"model": "test_resnet", "image_size": 16, "batch_size": 8, "num_classes": 10}
    return {"model": "resnet50", "image_size": 224, "batch_size": 256, "num_classes": 1000}


def estimate_all(workload: dict) -> dict:
    """In this process: every strategy's estimate, timed after the imports."""
    import timm  # noqa: F401  the imports an estimate needs, outside the timing
    import torch.distributed.pipelining  # noqa: F401

    import trainer_backend.rank.trainer  # noqa: F401
    from contract.config import RunConfig
    from trainer_backend.control.lifecycle import sweep_configs
    from trainer_backend.rank.forecast.memory_estimate import estimate_memory

    base = RunConfig(model=workload["model"], image_size=workload["image_size"], batch_size=workload["batch_size"],
                     strategy="mp", devices=("cpu", "cpu"))
    configs = sweep_configs(base, list(STRATEGIES))
    started = time.perf_counter()
    largest = {}
    for config in configs:
        estimate = estimate_memory(config, num_classes=workload["num_classes"], in_chans=3)
        largest[config.strategy] = round(estimate.largest.total_mb, 1)
    return {"seconds": time.perf_counter() - started, "largest_mb": largest}


def one_process(workload: dict) -> dict:
    done = subprocess.run([PYTHON, __file__, "--child", json.dumps(workload)], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(estimate_all(json.loads(sys.argv[2]))))
        return
    args = parse_args(__doc__)
    workload = settings(args.quick)
    report = Report(KEY, TITLE, method=METHOD)
    report.settings = {**workload, "strategies": ",".join(STRATEGIES), "devices": "cpu,cpu"}
    inside, whole, largest = [], [], {}
    for _ in range(args.repeats):
        result = one_process(workload)
        inside.append(result["seconds"])
        largest = result["largest_mb"]
        done = run_timed(parallax_command(
            "estimate", "--model", workload["model"], "--image-size", str(workload["image_size"]),
            "--batch-size", str(workload["batch_size"]), "--devices", "cpu,cpu", "--dataset", "cifar10",
            "--strategies", ",".join(STRATEGIES), "--json"), timeout=600)
        whole.append(done.seconds)
    report.add(f"{workload['model']} at {workload['image_size']} px, batch {workload['batch_size']}: all "
               f"{len(STRATEGIES)} strategies, after imports", inside, unit=" s",
               target=None if args.quick else at_most(TARGET_S, " s"))
    report.add("the estimate command, start to finish (10 classes: cifar10)", whole, unit=" s", headline=False)
    report.details["largest device per strategy (MB)"] = largest
    report.note("Estimated peak of the fullest device, fp32 on CPU devices: "
                + ", ".join(f"{name} {mb / 1024:.1f} GB" for name, mb in largest.items()) + ".")
    report.finish(args)


if __name__ == "__main__":
    main()
