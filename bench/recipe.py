"""The training recipe's value: validation accuracy with and without it, at equal epochs.

A EuroSAT-layout folder is generated (10 class folders of 13-band 64x64 uint16 TIFFs, as
bench/data_pipeline.py writes them), made harder than that benchmark's so that the two runs can
differ: every class shares the same band levels and is told apart only by a texture (stripes of
its own orientation and frequency, at a random phase) under noise. Parallax trains resnet18 on
it at 32x32 (bands 3,2,1), batch 128, Adam 1e-3, the same epochs and seed, twice: with the bare
defaults and with the recipe ``--augment flip,crop --lr-schedule cosine --warmup-epochs 1``.
Figures are the validation accuracy of each at the last epoch and at its best, over rounds with
different seeds, and the recipe's minus the defaults' accuracy, pair by pair. Synthetic textures
are not satellite images: the difference says whether the recipe works, not what it is worth on
EuroSAT.

    python bench/recipe.py            # full: 2,000 images, 8 epochs, 3 seeds
    python bench/recipe.py --quick    # 200 images of test_resnet at 16 px, 2 epochs, one seed
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import tifffile  # noqa: E402

from bench.common import parallax_home, parse_args, run_parallax  # noqa: E402
from bench.data_pipeline import BANDS, CLASSES, SIZE  # noqa: E402
from bench.report import Report  # noqa: E402
from bench.stats import alternate  # noqa: E402

KEY, TITLE = "recipe", "The training recipe's value (augmentation, cosine schedule, warmup)"
METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
RECIPE = ("--augment", "flip,crop", "--lr-schedule", "cosine", "--warmup-epochs", "1")


def generate_texture_folder(root: Path, images_per_class: int, seed: int = 0) -> None:
    """A EuroSAT-layout folder whose classes differ by texture only (see the module docstring)."""
    rng = np.random.default_rng(seed)
    level = rng.integers(1500, 2500, size=BANDS)
    y, x = np.mgrid[0:SIZE, 0:SIZE]
    for label, name in enumerate(CLASSES):
        folder = root / name
        folder.mkdir(parents=True)
        angle, frequency = np.pi * label / len(CLASSES), 0.15 + 0.03 * (label % 3)
        for index in range(1, images_per_class + 1):
            phase = rng.uniform(0, 2 * np.pi)
            stripes = np.sin(frequency * (x * np.cos(angle) + y * np.sin(angle)) + phase)
            pixels = level + 400 * stripes[..., None] + rng.normal(0, 600, size=(SIZE, SIZE, BANDS))
            tifffile.imwrite(folder / f"{name}_{index}.tif", pixels.clip(0, 10_000).astype(np.uint16),
                             photometric="minisblack", planarconfig="contig")


def main() -> None:
    def flags(parser):
        parser.add_argument("--recipe", default=" ".join(RECIPE), help=f"the recipe's flags (default: {' '.join(RECIPE)})")

    args = parse_args(__doc__, flags)
    recipe = tuple(args.recipe.split())
    report = Report(KEY, TITLE, method=METHOD)
    per_class, epochs = (20, 2) if args.quick else (200, 8)
    model, image_size = ("test_resnet", 16) if args.quick else ("resnet18", 32)
    seeds = list(range(args.repeats))
    report.settings = {"images": per_class * len(CLASSES), "model": model, "image_size": image_size,
                       "epochs": epochs, "seeds": seeds, "recipe": " ".join(recipe)}
    work = Path(tempfile.mkdtemp(prefix="parallax-bench-recipe-"))
    try:
        generate_texture_folder(work / "EuroSAT_MS", per_class)
        settings = {"dataset": str(work / "EuroSAT_MS"), "model": model, "epochs": epochs, "batch_size": 128,
                    "image_size": image_size}
        rounds = iter([seed for seed in seeds for _ in ('defaults', 'recipe')])
        with parallax_home() as home:
            db_url = f"sqlite:///{home / 'parallax.db'}"
            # Each round's two runs share a seed (weights, split, shuffle); run_parallax validates on
            # running averages, so both use Parallax's default BatchNorm re-estimation here.
            runs = alternate({
                "defaults": lambda: run_parallax(settings, db_url, "--seed", str(next(rounds)), "--bn-stats-images", "512"),
                "recipe": lambda: run_parallax(settings, db_url, "--seed", str(next(rounds)), "--bn-stats-images", "512",
                                             *recipe),
            }, args.repeats, label=f"{KEY} ")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    last = {name: [100 * run["epochs"][-1]["val_acc"] for run in results] for name, results in runs.items()}
    best = {name: [100 * max(e["val_acc"] for e in run["epochs"]) for run in results] for name, results in runs.items()}
    report.add("defaults: validation accuracy at the last epoch", last["defaults"], unit=" %")
    report.add("recipe: validation accuracy at the last epoch", last["recipe"], unit=" %")
    report.add("recipe minus defaults, last epoch", [r - d for r, d in zip(last["recipe"], last["defaults"])],
               unit=" points")
    report.add("defaults: best validation accuracy", best["defaults"], unit=" %", headline=False)
    report.add("recipe: best validation accuracy", best["recipe"], unit=" %", headline=False)
    report.add("recipe: training images/s over the defaults'",
               [r["epochs"][-1]["images_per_s"] / d["epochs"][-1]["images_per_s"]
                for r, d in zip(runs["recipe"], runs["defaults"])], unit="×", headline=False)
    report.finish(args)


if __name__ == "__main__":
    main()
