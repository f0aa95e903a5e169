"""``python -m trainer_backend``: see trainer_backend/cli.py."""

import signal
import sys

# `python -m trainer_backend list | head` ends quietly, like any command-line tool.
signal.signal(signal.SIGPIPE, signal.SIG_DFL)

from .cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
