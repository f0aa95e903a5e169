"""Test plugin (PARALLAX_PLUGINS=tests.plugins.slow_cache_build): decoding the digits into the
dataset cache takes BUILD_S seconds longer, as a large image folder's first decode does. It stands
for a folder too large to build here in a test's time; the cache, its lock and every process around
it are the real ones. Each build prints one line to stderr, so a test can tell that it ran."""

from __future__ import annotations

import sys
import time

from trainer_backend.datasets import builtin

BUILD_S = 20.0

_decode_digits = builtin.decode_digits


def slow_decode_digits(image_size: int):
    started = time.monotonic()
    time.sleep(BUILD_S)
    pool = _decode_digits(image_size)
    print(f"slow cache build: {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    return pool


builtin.decode_digits = slow_decode_digits
