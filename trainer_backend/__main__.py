"""``python -m trainer_backend``: see trainer_backend/control/cli.py."""

import gc
import signal
import sys

# `python -m trainer_backend list | head` ends quietly, like any command-line tool.
signal.signal(signal.SIGPIPE, signal.SIG_DFL)

# Before torch is imported: CUDA reads the order once, when it starts. Every process Parallax
# starts (the CLI, a launched run's supervisor, its spawned ranks, torchrun's ranks) comes through here.
from contract.devices import pin_cuda_device_order  # noqa: E402

pin_cuda_device_order()

from trainer_backend.control.cli import main  # noqa: E402

if __name__ == "__main__":
    from contract.environment import keep_files_private

    try:  # before anything is written: what this process and the ones it starts write is private
        keep_files_private()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    status = main()
    # Shutting the interpreter down would garbage-collect torch's and timm's objects one by one
    # (over a second after every run); the OS frees that memory at once. Files are still flushed
    # and closed, and atexit handlers still run.
    gc.freeze()
    sys.exit(status)
