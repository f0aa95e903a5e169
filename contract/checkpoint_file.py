"""Whether a checkpoint file (best.pt, resume.pt) is whole, judged from its bytes without torch.

    problem = checkpoint_problem(Path("runs/.../resume.pt"))    # None, or "is cut short (…)"
    raise DamagedFileError(f"resume point {path} {problem}: …")   # one line, shown without a traceback

``torch.save`` writes a zip archive: its members, then a central directory at the end that lists them.
A file cut short (a copy that stopped, a disk that filled before Parallax wrote through part files)
has lost that directory; random bytes, or another kind of file under the name, do not begin as a zip
archive does. torch's own errors for both say nothing of the file (``OSError: [Errno 22] Invalid
argument``, ``UnpicklingError``), so the readers of checkpoints name the file and this problem instead.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

ZIP_MAGIC = b"PK\x03\x04"
DAMAGED_POINT_ADVICE = ("the run cannot continue from it; put back a whole copy of the file, or launch the run "
                        "again from its first epoch")


class DamagedFileError(ValueError):
    """A file Parallax wrote (a checkpoint, a resume point) that cannot be read back: one line naming it."""


def checkpoint_problem(path: Path) -> str | None:
    """What is wrong with the checkpoint at ``path``, as the rest of a sentence that names it; None where its
    bytes are a whole zip archive (torch may still refuse what it holds)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            start = handle.read(len(ZIP_MAGIC))
    except OSError as exc:
        return f"cannot be read ({exc.strerror or type(exc).__name__})"
    if size == 0:
        return "is empty (0 bytes)"
    if start != ZIP_MAGIC:
        return (f"is not a checkpoint: its {size:,} bytes do not begin as the zip archive torch.save writes "
                "(random bytes, or another kind of file under that name)")
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return (f"is cut short: its {size:,} bytes end before the archive's closing directory (the file was not "
                "copied or written whole)")
    beyond = [member.filename for member in members if member.header_offset + member.compress_size > size]
    if beyond or not members:
        return f"is damaged: its archive lists {'no part' if not members else beyond[0]} it holds whole"
    return None


def damaged(path: Path, what: str, advice: str, *, cause: BaseException | None = None) -> DamagedFileError:
    """The one-line error for ``what`` at ``path`` that could not be read back: the problem its bytes show, else
    the reader's own exception, in one line."""
    problem = checkpoint_problem(path)
    if problem is None and type(cause).__name__ == "UnpicklingError":  # torch's advice (weights_only=False) runs code
        problem = "holds Python objects that torch will not load without running their code: it is not a checkpoint"
    if problem is None:
        said = " ".join(str(cause).split())[:200] if cause is not None else ""
        problem = f"cannot be read ({type(cause).__name__}{': ' + said if said else ''})" if cause else "is damaged"
    return DamagedFileError(f"{what} {path} {problem}: {advice}")
