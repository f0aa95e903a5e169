"""Test plugin (PARALLAX_PLUGINS=tests.plugins.steady_rapl): a CPU package whose RAPL counter (which this
machine lacks) counts one joule per second of the monotonic clock, so that a run meters its epochs' energy."""

from __future__ import annotations

import time

from trainer_backend.telemetry import energy

WRAP_UJ = 2**62


def _steady_package(self, root=None) -> None:
    self.domains, self.reason = [(None, WRAP_UJ)], None


energy.RaplPackages.__init__ = _steady_package
energy.RaplPackages.read_uj = lambda self: [int(time.monotonic() * 1e6)]
