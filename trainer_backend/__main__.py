"""``python -m trainer_backend``: see trainer_backend/cli.py."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
