"""GPU throughput: ``python -m trainer_backend run`` on one GPU against a hand-written GPU loop.

Both train timm resnet50 from scratch on the digits upsampled to 224x224 (1 band), batch 64, Adam
(lr 1e-3), under AMP (bf16 on compute capability 8.0 and later, else fp16 with a gradient scaler,
as the engine's ``--amp auto``), with cudnn.benchmark on, 3 epochs. The hand-written loop keeps the
data in pinned host memory, copies each batch with ``non_blocking`` and times each epoch between two
``torch.cuda.synchronize()`` calls; the engine records its own synchronised epoch times. Figures are
training images/s over the epochs after the first (the first carries cuDNN's algorithm search and
the allocator's growth), each contender started in turn, and the engine's images/s over the
hand-written loop's, pair by pair. The speed switches get the same comparison: the engine with
``--channels-last`` and with ``--channels-last --compile`` against the hand-written loop with the
same switches (model and batches in channels_last; ``torch.compile`` on the model, whose
compilation falls in the first epoch and so outside the figures); the engine's target there is 0.98
of the hand loop. Where CUDA is absent the benchmark is skipped.

    python bench/gpu.py              # full: 5 repeats of each
    python bench/gpu.py --quick      # one tiny repeat (test_resnet at 32 px), to check the script runs
    python bench/gpu.py --plain      # the hand-written loop alone; prints one JSON line
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import BENCH_DIR, PYTHON, later_epochs, parallax_home, parse_args, run_engine, run_timed  # noqa: E402
from bench.report import Report  # noqa: E402
from bench.stats import alternate, at_least  # noqa: E402

KEY, TITLE = "gpu", "GPU throughput (engine vs hand-written loop)"
METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
NO_CUDA = "no CUDA device on this machine (torch.cuda.is_available() is False)"
# Engine flags of each speed-switch comparison; the hand loop applies the same switches.
SWITCH_SETS = {"channels_last": ("--channels-last",), "channels_last + compile": ("--channels-last", "--compile")}


def workload(quick: bool) -> dict:
    if quick:
        return {"dataset": "digits", "model": "test_resnet", "epochs": 1, "batch_size": 64, "image_size": 32}
    return {"dataset": "digits", "model": "resnet50", "epochs": 3, "batch_size": 64, "image_size": 224}


def plain_gpu_loop(model_name: str, epochs: int, batch_size: int, image_size: int, *, channels_last: bool = False,
                   compile_model: bool = False) -> list[float]:
    """Train as a user would by hand on cuda:0; returns each epoch's training images/s."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    from bench.plain_loop import build_model, load_digits_split

    torch.backends.cudnn.benchmark = True
    device = torch.device("cuda:0")
    amp_dtype = torch.bfloat16 if torch.cuda.get_device_capability(device) >= (8, 0) else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=amp_dtype == torch.float16)
    train, _ = load_digits_split(image_size)
    loader = DataLoader(train, batch_size=batch_size, shuffle=True, pin_memory=True, drop_last=False)
    model = build_model(model_name).to(device)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if compile_model:
        model.compile()
    speeds = []
    for _ in range(epochs):
        model.train()
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for images, labels in loader:
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            images = images.contiguous(memory_format=memory_format)
            with torch.autocast("cuda", dtype=amp_dtype):
                loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        torch.cuda.synchronize(device)  # the epoch ends when its kernels do, not when they are queued
        speeds.append(len(train) / (time.perf_counter() - start))
    return speeds


def run_plain(settings: dict, switches: tuple[str, ...] = ()) -> list[float]:
    done = run_timed([PYTHON, str(BENCH_DIR / "gpu.py"), "--plain", "--model", settings["model"],
                      "--epochs", str(settings["epochs"]), "--batch-size", str(settings["batch_size"]),
                      "--image-size", str(settings["image_size"]), *switches])
    return json.loads(done.stdout.strip().splitlines()[-1])["images_per_s"]


def main() -> int:
    def flags(parser):
        parser.add_argument("--plain", action="store_true", help="run the hand-written loop alone")
        parser.add_argument("--model", default="resnet50")
        parser.add_argument("--epochs", type=int, default=3)
        parser.add_argument("--batch-size", type=int, default=64)
        parser.add_argument("--image-size", type=int, default=224)
        parser.add_argument("--channels-last", action="store_true", help="with --plain: channels_last")
        parser.add_argument("--compile", action="store_true", help="with --plain: torch.compile the model")

    args = parse_args(__doc__, flags)
    if args.plain:
        print(json.dumps({"images_per_s": plain_gpu_loop(args.model, args.epochs, args.batch_size, args.image_size,
                                                         channels_last=args.channels_last,
                                                         compile_model=args.compile)}))
        return 0

    import torch

    report = Report(KEY, TITLE, method=METHOD)
    if not torch.cuda.is_available():
        print(f"gpu: skipped: {NO_CUDA}", flush=True)
        report.skip(NO_CUDA)
        report.finish(args)
        return 0
    settings = workload(args.quick)
    report.settings = {**settings, "gpu": torch.cuda.get_device_name(0), "amp": "auto"}
    with parallax_home() as home:
        db_url = f"sqlite:///{home / 'parallax.db'}"

        def engine() -> float:
            run = run_engine(settings, db_url, "--amp", "auto", devices="0")
            return statistics.median(later_epochs([e["images_per_s"] for e in run["epochs"]]))

        def plain() -> float:
            return statistics.median(later_epochs(run_plain(settings)))

        speeds = alternate({"engine": engine, "plain": plain}, args.repeats, label=KEY)
    report.add("engine, images/s", speeds["engine"], unit="images/s")
    report.add("hand-written loop, images/s", speeds["plain"], unit="images/s")
    report.ratio("engine / hand-written, images/s", speeds["engine"], speeds["plain"], target=at_least(0.90))
    with parallax_home() as home:
        db_url = f"sqlite:///{home / 'parallax.db'}"
        for name, switches in SWITCH_SETS.items():
            def engine_with(switches=switches) -> float:
                run = run_engine(settings, db_url, "--amp", "auto", *switches, devices="0")
                return statistics.median(later_epochs([e["images_per_s"] for e in run["epochs"]]))

            def plain_with(switches=switches) -> float:
                return statistics.median(later_epochs(run_plain(settings, switches)))

            pair = alternate({"engine": engine_with, "plain": plain_with}, args.repeats, label=f"{KEY} {name} ")
            report.add(f"{name}: engine, images/s", pair["engine"], unit="images/s", headline=False)
            report.add(f"{name}: hand-written loop, images/s", pair["plain"], unit="images/s", headline=False)
            report.ratio(f"{name}: engine / hand-written, images/s", pair["engine"], pair["plain"],
                         target=at_least(0.98))
    report.finish(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
