"""Test plugin (PARALLAX_PLUGINS=tests.plugins.abort_at_exit), for torchrun's processes only: one that
loads it aborts if its interpreter shuts down, as a process of a gloo world with FSDP sometimes does
at exit ("terminate called without an active exception"). A process that has recorded its part of the
run leaves without that shutdown (contract/python_process.leave_without_shutdown), so it exits with
its own code, not SIGABRT."""

from __future__ import annotations

import atexit
import os

if "TORCHELASTIC_RUN_ID" in os.environ:  # a process torchrun started; any other leaves as usual
    atexit.register(os.abort)
