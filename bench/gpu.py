"""GPU throughput: ``python -m trainer_backend run`` on one GPU against a hand-written GPU loop.

Both train timm resnet50 from scratch on the digits upsampled to 224x224 (1 band), batch 64, Adam
(lr 1e-3), under AMP (bf16 on compute capability 8.0 and later, else fp16 with a gradient scaler,
as Parallax's ``--amp auto``), with cudnn.benchmark on, 3 epochs, on each of two data paths: the
dataset kept on the GPU as uint8 (the hand-written loop gathers each batch there by a permutation
drawn there), and the host path (uint8 batches from 2 loader workers, pinned, copied with
``non_blocking``; Parallax with ``--data-on-device off``, where it has that switch). Both normalise
on the GPU. The hand-written loop times each epoch between two ``torch.cuda.synchronize()`` calls;
Parallax records its own synchronised epoch times. Each side's synchronising calls per training
step are counted over one epoch under ``torch.cuda.set_sync_debug_mode("warn")`` (Parallax's
``train_one_epoch`` in a process of its own). Figures are
training images/s over the epochs after the first (the first carries cuDNN's algorithm search and
the allocator's growth), each contender started in turn, and Parallax's images/s over the
hand-written loop's, pair by pair. The speed switches get the same comparison: Parallax with
``--channels-last`` and with ``--channels-last --compile`` against the hand-written loop with the
same switches (model and batches in channels_last; ``torch.compile`` on the model, whose
compilation falls in the first epoch and so outside the figures); Parallax's target there is 0.98
of the hand loop. Where CUDA is absent the benchmark is skipped.

    python bench/gpu.py              # full: 5 repeats of each
    python bench/gpu.py --quick      # one tiny repeat (test_resnet at 32 px), to check the script runs
    python bench/gpu.py --plain      # the hand-written loop alone; prints one JSON line
    python bench/gpu.py --plain --device cpu --data-path host --workers 2   # the same on a CPU
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import BENCH_DIR, PYTHON, later_epochs, parallax_home, parse_args, run_parallax, run_timed  # noqa: E402
from bench.report import Report  # noqa: E402
from bench.stats import alternate, at_least, pair_ratios  # noqa: E402

KEY, TITLE = "gpu", "GPU throughput (Parallax vs hand-written loop)"
METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
NO_CUDA = "no CUDA device on this machine (torch.cuda.is_available() is False)"
# Engine flags of each speed-switch comparison; the hand loop applies the same switches.
SWITCH_SETS = {"channels_last": ("--channels-last",), "channels_last + compile": ("--channels-last", "--compile")}


def workload(quick: bool) -> dict:
    if quick:
        return {"dataset": "digits", "model": "test_resnet", "epochs": 1, "batch_size": 64, "image_size": 32}
    return {"dataset": "digits", "model": "resnet50", "epochs": 3, "batch_size": 64, "image_size": 224}


# The two data paths, each compared Parallax against hand loop: the dataset kept whole on the GPU
# (batches gathered there by a permutation drawn there), and the host path (uint8 batches from
# loader workers, pinned, copied with non_blocking, normalised on the GPU).
DATA_PATHS = {"device": "dataset kept on the GPU", "host": "host path: loader workers, pinned non-blocking copies"}
HOST_WORKERS = 2
SYNC_WARNING = "synchroniz"  # in the text of the warning torch.cuda.set_sync_debug_mode("warn") gives


def digits_uint8(image_size: int):
    """The training split as Parallax's cache holds it: uint8 pixels (1 x S x S, the digits
    upsampled as bench/plain_loop.py does), labels, and the mean and std of its pixels in [0, 1]."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    pixels = torch.from_numpy(digits.images).float().div(16.0).unsqueeze(1)  # 0..16 intensities
    pixels = F.interpolate(pixels, size=(image_size, image_size), mode="bilinear", antialias=True,
                           align_corners=False).clamp(0.0, 1.0)
    stored = pixels.mul(255).round().to(torch.uint8)
    train_idx, _ = train_test_split(np.arange(len(digits.target)), test_size=0.2, random_state=0,
                                    stratify=digits.target)
    train = stored[torch.from_numpy(train_idx)]
    unit = train.float().div(255)
    return train, torch.from_numpy(digits.target[train_idx]).long(), unit.mean().item(), unit.std().item()


class SyncCounter:
    """Counts the synchronising CUDA calls made while it is open (torch.cuda.set_sync_debug_mode
    "warn", one warning per call); on a CPU there is nothing to count and it stays None."""

    def __init__(self, device):
        self.device, self.count, self._caught = device, None, None

    def __enter__(self):
        import warnings

        import torch

        if self.device.type == "cuda":
            self._catcher = warnings.catch_warnings(record=True)
            self._caught = self._catcher.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        import torch

        if self._caught is not None:
            torch.cuda.set_sync_debug_mode("default")
            self._catcher.__exit__(*exc)
            self.count = sum(SYNC_WARNING in str(w.message) for w in self._caught)
        return False


def plain_gpu_loop(model_name: str, epochs: int, batch_size: int, image_size: int, *, channels_last: bool = False,
                   compile_model: bool = False, device: str = "cuda:0", data_path: str = "host",
                   num_workers: int = 0) -> dict:
    """Train as a user would by hand; returns each epoch's training images/s and the synchronising
    calls per step of the last epoch (None on a CPU). ``data_path`` "device" keeps the split on
    ``device`` and gathers each batch there; "host" feeds uint8 batches from ``num_workers`` loader
    workers, pinned and copied with ``non_blocking``. On a CPU both run, without AMP (as Parallax's
    ``--amp auto`` there), so that the loop and its figures are exercised without a GPU."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

    from bench.plain_loop import build_model

    device = torch.device(device)
    cuda = device.type == "cuda"
    torch.backends.cudnn.benchmark = True
    amp_dtype = None
    if cuda:
        amp_dtype = torch.bfloat16 if torch.cuda.get_device_capability(device) >= (8, 0) else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=amp_dtype == torch.float16)
    stored, labels, mean, std = digits_uint8(image_size)
    count = len(labels)
    model = build_model(model_name).to(device)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if compile_model:
        model.compile()
    scale, shift = 1.0 / (255 * std), -mean / std

    if data_path == "device":
        stored_on, labels_on = stored.to(device), labels.to(device)

        def batches():
            order = torch.randperm(count, device=device)  # drawn where it is used: no copy, no sync
            for first in range(0, count, batch_size):
                rows = order[first:first + batch_size]
                yield stored_on[rows], labels_on[rows]
    else:
        dataset = TensorDataset(stored, labels)  # indexed by a whole batch's rows at once
        loader = DataLoader(dataset, sampler=BatchSampler(RandomSampler(dataset), batch_size, drop_last=False),
                            batch_size=None, num_workers=num_workers, pin_memory=cuda,
                            persistent_workers=num_workers > 0)

        def batches():
            for images, targets in loader:
                yield images.to(device, non_blocking=True), targets.to(device, non_blocking=True)

    def synchronize():
        if cuda:
            torch.cuda.synchronize(device)  # the epoch ends when its kernels do, not when they are queued

    speeds, syncs, steps = [], None, -(-count // batch_size)
    for epoch in range(epochs):
        model.train()
        synchronize()
        start = time.perf_counter()
        with SyncCounter(device) if epoch == epochs - 1 else contextlib.nullcontext() as counter:
            for pixels, targets in batches():
                images = pixels.float().mul_(scale).add_(shift).contiguous(memory_format=memory_format)
                with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                    loss = F.cross_entropy(model(images), targets)
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
        synchronize()
        speeds.append(count / (time.perf_counter() - start))
        if counter is not None and counter.count is not None:
            syncs = counter.count / steps
    return {"images_per_s": speeds, "syncs_per_step": syncs}


class StepExtras:
    """What a run's epoch adds to each training step beyond the step itself, as the trainer wires it: the NaN
    guard (``--on-nonfinite stop``, the default), the step hooks (progress and step points, written to a run in
    the SQLite file ``folder/audit.db``) and the stop check of a torchrun job (``folder`` is its run folder).
    ``for_epoch(epoch, loader, optimizer)``: ``train_one_epoch``'s keyword arguments for that epoch; ``close()``
    writes what the step points hold."""

    def __init__(self, strategy, folder):
        from db import make_engine, store
        from trainer_backend.rank.divergence import NonfiniteGuard
        from trainer_backend.rank.stopping import StopRequest
        from trainer_backend.telemetry.recorder import Recorder
        from trainer_backend.telemetry.steps import StepHooks, StepRecorder

        engine = make_engine(f"sqlite:///{Path(folder) / 'audit.db'}")
        self.run_id = store.create_run(engine, strategy.config.to_dict(), status="running")
        writer = Recorder(engine, self.run_id)
        started_at_s = writer.started_at_s()
        points = StepRecorder(writer, started_at_s, device=strategy.output_device, min_interval_s=0.0)
        self.hooks = StepHooks(progress=writer.progress, recorder=points, started_at_s=started_at_s,
                               devices=strategy.devices)
        self.guard = NonfiniteGuard("stop", strategy)
        self.stop = StopRequest(Path(folder), strategy, every_s=0.0)  # a look after every optimizer step

    def for_epoch(self, epoch: int, loader, optimizer) -> dict:
        self.guard.start_epoch(epoch, len(loader), optimizer)
        self.hooks.start_epoch(epoch, loader, optimizer)
        return {"guard": self.guard, "on_step": self.hooks, "on_loss": self.hooks.loss,
                "on_start": self.hooks.begin_training, "stop": self.stop}

    def close(self) -> None:
        self.hooks.end_epoch(images=0)
        self.hooks.close()

    def counts(self) -> dict:
        """What the extras did, that an audit shows they ran: step points written, looks of the stop check."""
        return {"step_points": self.hooks.recorder.written, "stop_checks": self.stop._calls}


def parallax_sync_audit(model_name: str, batch_size: int, image_size: int, *, device: str, data_path: str,
                      num_workers: int = HOST_WORKERS) -> dict:
    """Parallax's own training epoch (``train_one_epoch`` with the run's loaders, device inputs,
    model, AMP and gradient scaler, as ``trainer.build_on`` makes them, and the NaN guard, the step hooks and
    the stop check, as ``StepExtras`` wires them) on one device: synchronising calls per step of its second
    epoch (None on a CPU), and the steps it took."""
    import torch

    from contract.config import RunConfig
    from trainer_backend.rank.inputs import DeviceInputs
    from trainer_backend.rank.loop import make_grad_scaler, rank_amp_dtype, train_one_epoch
    from trainer_backend.rank.models import create_model
    from trainer_backend.rank.strategies import Strategy
    from trainer_backend.rank.trainer import build_loaders, keep_on_device, load_data

    config = RunConfig(dataset="digits", model=model_name, batch_size=batch_size, image_size=image_size,
                       devices=(device,), num_workers=num_workers if data_path == "host" else 0, bn_stats_images=0)
    strategy = Strategy(config)
    data = load_data(config)
    strategy.inputs = DeviceInputs.for_run(config, data.train.normalise, strategy.input_device)
    if data_path == "device" and strategy.input_device.type == "cuda":
        data = keep_on_device(data, strategy.input_device) or data
    train_loader, _ = build_loaders(data, config, strategy)
    model = strategy.wrap(create_model(config.model, num_classes=data.info.num_classes, in_chans=data.info.in_chans))
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    amp_dtype = rank_amp_dtype(config, strategy.input_device)
    scaler = make_grad_scaler(amp_dtype)
    with tempfile.TemporaryDirectory(prefix="parallax-sync-audit-") as folder:
        extras = StepExtras(strategy, folder)
        train_one_epoch(model, train_loader, optimizer, strategy, amp_dtype=amp_dtype, scaler=scaler,
                        **extras.for_epoch(1, train_loader, optimizer))  # warm-up
        with SyncCounter(strategy.input_device) as counter:
            train_one_epoch(model, train_loader, optimizer, strategy, amp_dtype=amp_dtype, scaler=scaler,
                            **extras.for_epoch(2, train_loader, optimizer))
        extras.close()
    steps = len(train_loader)
    return {"syncs_per_step": None if counter.count is None else counter.count / steps, "steps": steps,
            "on_device": bool(data.train.on_device), **extras.counts()}


def run_plain(settings: dict, switches: tuple[str, ...] = (), *, device: str = "cuda:0", data_path: str = "device",
              num_workers: int = 0) -> dict:
    """The hand-written loop in a process of its own: {"images_per_s": [...], "syncs_per_step": x}."""
    done = run_timed([PYTHON, str(BENCH_DIR / "gpu.py"), "--plain", "--model", settings["model"],
                      "--epochs", str(settings["epochs"]), "--batch-size", str(settings["batch_size"]),
                      "--image-size", str(settings["image_size"]), "--device", device, "--data-path", data_path,
                      "--workers", str(num_workers), *switches])
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_parallax_syncs(settings: dict, *, device: str, data_path: str) -> dict:
    """``parallax_sync_audit`` in a process of its own (sync debug mode is process-wide)."""
    done = run_timed([PYTHON, str(BENCH_DIR / "gpu.py"), "--parallax-syncs", "--model", settings["model"],
                      "--batch-size", str(settings["batch_size"]), "--image-size", str(settings["image_size"]),
                      "--device", device, "--data-path", data_path])
    return json.loads(done.stdout.strip().splitlines()[-1])


def parallax_path_flags(data_path: str, device: str) -> tuple[str, ...]:
    """Parallax's flags for ``data_path``: on a GPU ``--data-on-device on`` or ``off`` (a dataset that
    fits is kept on the GPU otherwise); on a CPU the data is always in host memory."""
    if data_path == "device":
        return ("--data-on-device", "on") if device != "cpu" else ()
    workers = ("--num-workers", str(HOST_WORKERS))
    return workers if device == "cpu" else ("--data-on-device", "off", *workers)


def compare_paths(settings: dict, db_url: str, repeats: int, *, device: str = "cuda:0",
                  label: str = KEY) -> dict[str, dict]:
    """Parallax against the hand-written loop on each data path: same model, data, batch and
    switches, started in turn; images/s (median of the epochs after the first) of each run, the
    ratio of each pair, and each side's synchronising calls per training step."""
    devices = "cpu" if device == "cpu" else device.split(":")[-1]
    results: dict[str, dict] = {}
    for path in DATA_PATHS:
        flags = parallax_path_flags(path, device)
        workers = HOST_WORKERS if path == "host" else 0
        plain_syncs: list = []

        def engine(flags=flags) -> float:
            run = run_parallax(settings, db_url, "--amp", "auto", *flags, devices=devices)
            return statistics.median(later_epochs([e["images_per_s"] for e in run["epochs"]]))

        def plain(path=path, workers=workers, plain_syncs=plain_syncs) -> float:
            result = run_plain(settings, device=device, data_path=path, num_workers=workers)
            plain_syncs.append(result["syncs_per_step"])
            return statistics.median(later_epochs(result["images_per_s"]))

        pair = alternate({"parallax": engine, "plain": plain}, repeats, label=f"{label} {path} ")
        results[path] = {"parallax": pair["parallax"], "plain": pair["plain"],
                         "ratios": pair_ratios(pair["parallax"], pair["plain"]),
                         "parallax_syncs_per_step": run_parallax_syncs(settings, device=device,
                                                                   data_path=path)["syncs_per_step"],
                         "plain_syncs_per_step": plain_syncs[-1]}
    return results


def main() -> int:
    def flags(parser):
        parser.add_argument("--plain", action="store_true", help="run the hand-written loop alone")
        parser.add_argument("--model", default="resnet50")
        parser.add_argument("--epochs", type=int, default=3)
        parser.add_argument("--batch-size", type=int, default=64)
        parser.add_argument("--image-size", type=int, default=224)
        parser.add_argument("--channels-last", action="store_true", help="with --plain: channels_last")
        parser.add_argument("--compile", action="store_true", help="with --plain: torch.compile the model")
        parser.add_argument("--parallax-syncs", action="store_true",
                            help="count Parallax's synchronising calls per training step alone; prints one JSON line")
        parser.add_argument("--device", default="cuda:0", help="with --plain or --parallax-syncs")
        parser.add_argument("--data-path", choices=sorted(DATA_PATHS), default="device",
                            help="with --plain or --parallax-syncs: the dataset kept on the device, or the host path")
        parser.add_argument("--workers", type=int, default=0, help="with --plain: loader workers of the host path")

    args = parse_args(__doc__, flags)
    if args.plain:
        print(json.dumps(plain_gpu_loop(args.model, args.epochs, args.batch_size, args.image_size,
                                        channels_last=args.channels_last, compile_model=args.compile,
                                        device=args.device, data_path=args.data_path, num_workers=args.workers)))
        return 0
    if args.parallax_syncs:
        print(json.dumps(parallax_sync_audit(args.model, args.batch_size, args.image_size, device=args.device,
                                           data_path=args.data_path)))
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
        paths = compare_paths(settings, f"sqlite:///{home / 'parallax.db'}", args.repeats)
    for path, result in paths.items():
        report.add(f"{DATA_PATHS[path]}: Parallax, images/s", result["parallax"], unit="images/s")
        report.add(f"{DATA_PATHS[path]}: hand-written loop, images/s", result["plain"], unit="images/s")
        report.ratio(f"{DATA_PATHS[path]}: Parallax / hand-written, images/s", result["parallax"], result["plain"],
                     target=at_least(0.98))
        report.note(f"{DATA_PATHS[path]}: synchronising calls per training step: Parallax "
                    f"{result['parallax_syncs_per_step']}, hand-written {result['plain_syncs_per_step']}")
    with parallax_home() as home:
        db_url = f"sqlite:///{home / 'parallax.db'}"
        for name, switches in SWITCH_SETS.items():
            def parallax_with(switches=switches) -> float:
                run = run_parallax(settings, db_url, "--amp", "auto", *switches, devices="0")
                return statistics.median(later_epochs([e["images_per_s"] for e in run["epochs"]]))

            def plain_with(switches=switches) -> float:
                return statistics.median(later_epochs(run_plain(settings, switches)["images_per_s"]))

            pair = alternate({"parallax": parallax_with, "plain": plain_with}, args.repeats, label=f"{KEY} {name} ")
            report.add(f"{name}: Parallax, images/s", pair["parallax"], unit="images/s", headline=False)
            report.add(f"{name}: hand-written loop, images/s", pair["plain"], unit="images/s", headline=False)
            report.ratio(f"{name}: Parallax / hand-written, images/s", pair["parallax"], pair["plain"],
                         target=at_least(0.98))
    report.finish(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
