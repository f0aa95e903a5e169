"""``python -m trainer_backend``: see trainer_backend/cli.py."""

import gc
import signal
import sys

# `python -m trainer_backend list | head` ends quietly, like any command-line tool.
signal.signal(signal.SIGPIPE, signal.SIG_DFL)

from .cli import main  # noqa: E402

if __name__ == "__main__":
    status = main()
    # Shutting the interpreter down would garbage-collect torch's and timm's objects one by one
    # (over a second after every run); the OS frees that memory at once. Files are still flushed
    # and closed, and atexit handlers still run.
    gc.freeze()
    sys.exit(status)
