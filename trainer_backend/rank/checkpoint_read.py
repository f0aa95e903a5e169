"""Read a checkpoint Parallax wrote (best.pt, resume.pt) back, or fail in one line naming the file.

    payload = read_checkpoint(folder / "best.pt", "run 7's checkpoint", "train the run again", needs=("model",))

torch.load on a file cut short raises ``OSError: [Errno 22] Invalid argument``; on random bytes an
UnpicklingError whose advice is to load it unsafely. Neither names the file. Here any failure to read
becomes a DamagedFileError (a ValueError: the CLI prints it as one line, a run records it as its reason
without a traceback) saying which file, what is wrong with its bytes (contract/checkpoint_file.py) and
what to do.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from contract.checkpoint_file import DamagedFileError, damaged


def read_checkpoint(path: Path, what: str, advice: str, *, needs: Iterable[str] = ()) -> dict[str, Any]:
    """The dict saved at ``path`` (on the CPU, plain types only); DamagedFileError naming ``what`` at ``path``
    where it cannot be read or is not a dict holding ``needs``."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises OSError, RuntimeError, EOFError, UnpicklingError ...
        raise damaged(path, what, advice, cause=exc) from None
    if not isinstance(payload, dict):
        raise DamagedFileError(f"{what} {path} holds a {type(payload).__name__}, not a checkpoint: {advice}")
    missing = [key for key in needs if key not in payload]
    if missing:
        raise DamagedFileError(f"{what} {path} lacks {', '.join(missing)}: {advice}")
    return payload
