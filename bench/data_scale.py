"""Data at scale: memory of a whole run over the decoded size, the mapped cache's speed, the cache's build cost.

A folder of RGB PNGs in 10 classes is generated (``--images`` at ``--size`` px, each with its own
noise, so nothing compresses away in memory), and a tiny folder of as many images at 16 px: the
same number of steps, so that a run's growth over time (allocator, copy-on-write in forked
helpers) falls on both and only the pixels differ.

- Memory: Parallax trains one epoch of test_resnet at 16 px from the folder stored at its
  own size (``--stored-size``), as ``single`` and as ``ddp`` on 1, 2 and 4 CPU processes, loading
  in the training process (the default; a forked loader worker's copy-on-write growth of the
  interpreter's own heap over a long epoch would be counted as data). Every 0.2 s the PSS (proportional set size: a page shared by k
  processes counts 1/k in each, so the mapped cache counts once) of the run's whole process tree
  is summed; the figure is the peak of the run on the folder minus the peak of the same run on
  the tiny folder, over the difference of their decoded sizes. Both caches are built before the runs.
- Speed, warm: images/s that a DataLoader (batch 128, shuffled, no workers) delivers from the
  training split over the mapped cache, against the same split copied into one in-memory tensor
  (how every process held its data before), alternating, each after one warm-up pass.
- Streaming decode: images/s delivered, normalised, by ``prepare_data(decode="workers")``, which
  decodes every file in 2 DataLoader workers each epoch (placed as a CPU run places it:
  ``place_decoding``, the workers normalise), against what a user would write instead:
  torchvision's ``ImageFolder`` with ``Resize``, ``ToTensor`` and ``Normalize`` in the same 2
  workers, batch 128, alternating, after a pass that puts the files in the page cache.
- Build: the first ``prepare_data`` on the folder (decode, write, fsync) against a later one
  (map the cache), in seconds.

    python bench/data_scale.py                          # 3,000 images at 128 px (147 MB decoded), 3 repeats
    python bench/data_scale.py --images 20000 --size 128   # the 983 MB folder of the original measurement
    python bench/data_scale.py --quick                  # 120 images at 32 px, single and ddp x2, one repeat
    python bench/data_scale.py --streaming-only --repeats 7   # only the decode in workers against ImageFolder
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from bench.common import ROOT, child_env, parallax_command, parallax_home, parse_args  # noqa: E402
from bench.report import Report  # noqa: E402
from bench.stats import at_least, at_most  # noqa: E402
from trainer_backend.datasets import ImageTensorDataset, collate_batch, prepare_data  # noqa: E402
from trainer_backend.datasets.streaming import place_decoding  # noqa: E402

METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
CLASSES = 10
TINY_SIZE = 16
SAMPLE_S = 0.2


def generate_folder(root: Path, count: int, size: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    for index in range(count):
        label = index % CLASSES
        folder = root / f"class{label}"
        folder.mkdir(parents=True, exist_ok=True)
        base = np.array([25 * label, 255 - 25 * label, 128], dtype=np.int16)
        pixels = np.clip(base + rng.integers(-60, 60, size=(size, size, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels, "RGB").save(folder / f"{index}.png", compress_level=1)
    return root


def tree_pss(root: psutil.Process) -> int:
    total = 0
    try:
        processes = [root, *root.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):  # the run just ended
        return 0
    for process in processes:
        try:
            total += process.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return total


def peak_pss_of_run(arguments: list[str], timeout_s: float = 1200) -> int:
    """Run Parallax with ``arguments`` and return the peak of its process tree's summed PSS."""
    child = subprocess.Popen(parallax_command("run", "--quiet", *arguments), cwd=ROOT, env=child_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, watched = 0, psutil.Process(child.pid)
    done = threading.Event()
    output: dict[str, str] = {}

    def collect() -> None:
        output["out"], output["err"] = child.communicate(timeout=timeout_s)
        done.set()

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    while not done.wait(SAMPLE_S):
        peak = max(peak, tree_pss(watched))
    reader.join()
    if child.returncode != 0 or "status=completed" not in output.get("out", ""):
        raise RuntimeError(f"run {' '.join(arguments)} failed:\n{output.get('out', '')[-2000:]}\n"
                           f"{output.get('err', '')[-2000:]}")
    return peak


def run_arguments(folder: Path, strategy: str, processes: int, size: int) -> list[str]:
    devices = ",".join(["cpu"] * processes)
    return ["--dataset", str(folder), "--model", "test_resnet", "--image-size", "16", "--stored-size", str(size),
            "--epochs", "1", "--batch-size", str(32 * processes), "--bn-stats-images", "0",
            "--strategy", strategy, "--devices", devices]


def images_per_s(dataset, batches: int | None = None) -> float:
    loader = DataLoader(dataset, batch_size=128, shuffle=True, collate_fn=collate_batch,
                        generator=torch.Generator().manual_seed(0))
    started, seen = time.perf_counter(), 0
    for index, (pixels, _) in enumerate(loader):
        dataset.normalise(pixels)
        seen += len(pixels)
        if batches is not None and index + 1 >= batches:
            break
    return seen / (time.perf_counter() - started)


WORKERS = 2


def image_folder_loader(root: Path, size: int, mean, std) -> DataLoader:
    """What a user writes instead of Parallax's streaming decode: torchvision's ImageFolder."""
    from torchvision import datasets, transforms

    transform = transforms.Compose([transforms.Resize((size, size)), transforms.ToTensor(),
                                    transforms.Normalize(mean.tolist(), std.tolist())])
    return DataLoader(datasets.ImageFolder(str(root), transform=transform), batch_size=128, shuffle=True,
                      num_workers=WORKERS, persistent_workers=True)


def deliver(loader: DataLoader, normalise, passes: int) -> float:
    """Images/s over ``passes`` epochs of ``loader``, normalised where the loader does not."""
    started, seen = time.perf_counter(), 0
    for _ in range(passes):
        for pixels, _ in loader:
            if normalise is not None:
                normalise(pixels)
            seen += len(pixels)
    return seen / (time.perf_counter() - started)


def in_memory_copy(split) -> ImageTensorDataset:
    """The split as every process held it before: its own tensor of its images."""
    return ImageTensorDataset(split.images.clone(), split.labels, split.mean, split.std, num_classes=split.num_classes)


def measure_streaming(report: Report, big: Path, args) -> None:
    """Decoding in the workers as a CPU run places it, against ImageFolder, alternating."""
    streamed, _ = place_decoding(prepare_data(str(big), image_size=args.size, decode="workers"),
                                 torch.device("cpu"), WORKERS)
    folder_loader = image_folder_loader(big, args.size, streamed.train.mean, streamed.train.std)
    stream_loader = DataLoader(streamed.train, batch_size=128, shuffle=True, num_workers=WORKERS,
                               collate_fn=collate_batch, persistent_workers=True)
    passes = 1 if args.quick else 2
    deliver(stream_loader, streamed.train.normalise, passes), deliver(folder_loader, None, passes)  # warm
    stream_speed, folder_speed = [], []
    for _ in range(args.repeats):
        stream_speed.append(deliver(stream_loader, streamed.train.normalise, passes))
        folder_speed.append(deliver(folder_loader, None, passes))
    report.ratio(f"images/s, decode in {WORKERS} workers / torchvision ImageFolder in {WORKERS} workers",
                 stream_speed, folder_speed, target=at_least(1.0))
    report.add("images/s decoding in the workers", stream_speed, unit=" img/s", headline=False)
    report.add("images/s with ImageFolder", folder_speed, unit=" img/s", headline=False)


def main() -> None:
    def extra(parser):
        parser.add_argument("--images", type=int, default=3000, help="images in the generated folder (default 3000)")
        parser.add_argument("--size", type=int, default=128, help="their size in px (default 128)")
        parser.add_argument("--streaming-only", action="store_true",
                            help="measure only the decode in the workers against ImageFolder")

    args = parse_args(__doc__, extra)
    if args.quick:
        args.images, args.size = 120, 32
    report = Report("data_scale", "Data at scale: one mapped cache", method=METHOD)
    modes = [("single", 1), ("ddp", 2)] if args.quick else [("single", 1), ("ddp", 1), ("ddp", 2), ("ddp", 4)]
    decoded = args.images * 3 * args.size * args.size
    report.settings = {"images": args.images, "size": args.size, "decoded_mb": decoded / 2**20,
                       "modes": [f"{s} x{n}" for s, n in modes], "repeats": args.repeats}
    with parallax_home("parallax-bench-data-"), tempfile.TemporaryDirectory(prefix="parallax-data-scale-") as scratch:
        big = generate_folder(Path(scratch) / "big", args.images, args.size)
        if args.streaming_only:
            report.settings["modes"] = []
            measure_streaming(report, big, args)
            report.note(f"folder: {args.images:,} RGB PNGs at {args.size} px; the streaming decode only")
            report.finish(args)
            return
        tiny = generate_folder(Path(scratch) / "tiny", args.images, TINY_SIZE, seed=1)
        build_s, load_s = [], []
        started = time.perf_counter()
        data = prepare_data(str(big), image_size=args.size)
        build_s.append(time.perf_counter() - started)
        tiny_decoded = prepare_data(str(tiny), image_size=TINY_SIZE).info.decoded_bytes
        for _ in range(args.repeats):
            started = time.perf_counter()
            data = prepare_data(str(big), image_size=args.size)
            load_s.append(time.perf_counter() - started)
        report.add("first prepare_data (decode, write, fsync)", build_s, unit=" s")
        report.add("later prepare_data (map the cache)", load_s, unit=" s")
        decoded = data.info.decoded_bytes - tiny_decoded

        ratios: dict[str, list[float]] = {}
        for _ in range(args.repeats):
            for strategy, processes in modes:
                label = f"{strategy} x{processes}"
                big_peak = peak_pss_of_run(run_arguments(big, strategy, processes, args.size))
                tiny_peak = peak_pss_of_run(run_arguments(tiny, strategy, processes, TINY_SIZE))
                ratios.setdefault(label, []).append((big_peak - tiny_peak) / decoded)
                report.details.setdefault(label, []).append({"peak_pss_mb": big_peak / 2**20,
                                                             "tiny_peak_pss_mb": tiny_peak / 2**20})
        for label, values in ratios.items():
            report.add(f"whole-run peak PSS over decoded size, {label}", values, unit="×", target=at_most(1.2))

        mapped_speed, memory_speed = [], []
        copy = in_memory_copy(data.train)
        images_per_s(data.train), images_per_s(copy)  # warm: every page mapped, every allocation made
        for _ in range(max(3, args.repeats)):
            mapped_speed.append(images_per_s(data.train))
            memory_speed.append(images_per_s(copy))
        report.ratio("batches/s, mapped cache / in-memory tensor (warm)", mapped_speed, memory_speed,
                     target=at_least(0.95))
        report.add("images/s from the mapped cache (warm)", mapped_speed, unit=" img/s", headline=False)

        measure_streaming(report, big, args)
    report.note(f"folder: {args.images:,} RGB PNGs at {args.size} px; {decoded / 2**20:.0f} MiB more decoded than "
                "the tiny folder's")
    report.finish(args)


if __name__ == "__main__":
    main()
