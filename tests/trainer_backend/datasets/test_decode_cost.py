"""What decoding one image may cost (PARALLAX_MAX_IMAGE_MB) is the decode's whole peak, judged from
the header: a small PNG of 8000 x 8000 (183 MiB of pixels, 0.3 MB on disk) is shrunk in uint8
before anything is made float, and refused where its decode would go past the limit.

The peak is measured in a process of its own: its highest resident memory (ru_maxrss) after the
decode, less before it (the interpreter, numpy, torch and PIL loaded).

    .venv/bin/python -m pytest tests/trainer_backend/datasets/test_decode_cost.py -q
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tests.support import ROOT
from trainer_backend.datasets.limits import decode_peak_bytes

SIDE = 8000
PROBE = (
    "import resource, sys\n"
    "from pathlib import Path\n"
    "from trainer_backend.datasets import DatasetError\n"
    "from trainer_backend.datasets.image_files import decode_image_file\n"
    "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
    "try:\n"
    "    image = decode_image_file(Path(sys.argv[1]), int(sys.argv[2]), None, None)\n"
    "except DatasetError as exc:\n"
    "    print('refused', exc)\n"
    "    raise SystemExit(0)\n"
    "grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n"
    "print('decoded', grown_kb * 1024, *image.pixels.shape)\n"
)


@pytest.fixture(scope="module")
def big_png(tmp_path_factory):
    pixels = np.zeros((SIDE, SIDE, 3), np.uint8)
    pixels[::7] = 200
    pixels[:, ::13, 1] = 90
    path = tmp_path_factory.mktemp("decode") / "big.png"
    Image.fromarray(pixels).save(path)
    assert path.stat().st_size < 2 * 2**20  # small on disk, 183 MiB of pixels
    return path


def decode_in_a_process(path, image_size: int, limit_mb: int) -> str:
    """The probe's line: "decoded <bytes grown> C S S" or "refused <the one line>"."""
    env = {**os.environ, "PARALLAX_MAX_IMAGE_MB": str(limit_mb), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", PROBE, str(path), str(image_size)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_large_png_passing_the_limit_decodes_within_it(big_png):
    limit_mb = 400  # over the 244 MiB PIL holds it in, under the 936 MiB its float copy took
    kind, grown, *shape = decode_in_a_process(big_png, 64, limit_mb).split(" ")
    assert kind == "decoded" and shape == ["3", "64", "64"]
    assert int(grown) <= limit_mb * 2**20, f"the decode took {int(grown) / 2**20:.0f} MiB, over {limit_mb} MiB"


def test_a_png_whose_decode_would_pass_the_limit_is_refused_from_its_header(big_png):
    # Resized to 2500 px it is not shrunk first: the float copy of the whole image counts.
    line = decode_in_a_process(big_png, 2500, 1024)
    assert line == (f"refused image {big_png} declares 8000 x 8000 x 3 pixels (0.2 GiB decoded, 1,303 MiB at the "
                    "decode's peak), more than the 1024 MiB one image may take (PARALLAX_MAX_IMAGE_MB): it is not "
                    "decoded; remove it from the folder, or raise PARALLAX_MAX_IMAGE_MB if it is genuine")


def test_the_estimated_peak_bounds_the_measured_one(big_png):
    kind, grown, *_ = decode_in_a_process(big_png, 2500, 4000).split(" ")
    assert kind == "decoded"
    assert int(grown) <= decode_peak_bytes((SIDE, SIDE, 3), 1, 2500, SIDE * SIDE * 4)
