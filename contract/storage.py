"""Write a run's files so that a full disk ends the run with a reason and leaves no half file.

    with writing(run_dir / "best.pt", "checkpoint") as handle:
        torch.save(state, handle)      # DiskFullError("disk full while writing checkpoint ...")

The file is written under ``<name>.part`` and renamed into place only when complete, so a reader
sees the previous file or the new one, never a truncated one; on any failure the part is removed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

# The newest resume point in a run's folder (rank/resume.py writes it; control/lifecycle.py looks for it).
RESUME_FILE = "resume.pt"
OLDER_RESUME_FILE = "resume-epoch{epoch}.pt"  # an earlier epoch's point, kept under --keep-checkpoints N > 1
OFFLINE_FORMAT_VERSION = 1  # an offline script run's file: parallax/offline.py writes it, ``parallax sync`` reads it
MAX_LOGGED_STEP = 2**63 - 1  # the highest step a script may log: the step column is a signed 64-bit integer

NO_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
# Writers in C++ (torch.save to a path, the profiler's trace export) drop the errno; after their
# failure, this little room left on the file system (or a file size limit) is read as the disk being full.
NEARLY_FULL_BYTES = 16 * 2**20


class DiskFullError(OSError):
    """No space (or quota, or file size limit) left while writing a run's file."""

    def __init__(self, message: str):
        super().__init__(errno.ENOSPC, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def no_space_reason(exc: BaseException, folder: Path) -> str | None:
    """Why ``exc`` means the disk is full ("No space left on device"), or None if it does not."""
    seen = 0
    cause: BaseException | None = exc
    while cause is not None and seen < 10:  # torch wraps the OSError of a file object in a RuntimeError
        if isinstance(cause, OSError) and cause.errno in NO_SPACE_ERRNOS:
            return os.strerror(cause.errno)
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    with contextlib.suppress(OSError):
        free = shutil.disk_usage(folder).free
        if free < NEARLY_FULL_BYTES:
            return f"{free // 1024} KiB left on the file system"
    limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if limit != resource.RLIM_INFINITY:
        return f"or over this process's file size limit of {limit} bytes (ulimit -f)"
    return None


RUN_ADVICE = "the metrics recorded so far are kept; free some space (or use a PARALLAX_HOME with room) and run again"
EXPORT_ADVICE = "no half-written file is left; free some space (or give a folder with room) and export again"


def disk_full_error(what: str, path: Path, reason: str, advice: str = RUN_ADVICE) -> DiskFullError:
    return DiskFullError(f"disk full while writing {what} {path} ({reason}): {advice}")


class UnwritableError(ValueError):
    """A file or folder Parallax must write cannot be written for a reason other than space (a
    read-only file system, no permission): one line naming it."""


class FolderGoneError(UnwritableError):
    """The folder a file was being written into was deleted (the run's folder, removed while the run
    trained): one line naming it, not a bare "[Errno 2] No such file or directory"."""


def write_problem(exc: OSError, what: str, path: Path, advice: str = RUN_ADVICE) -> OSError | ValueError:
    """The one-line error for ``exc``, raised while writing ``what`` at ``path``: DiskFullError when
    the disk is full, else UnwritableError naming the path and the reason."""
    reason = no_space_reason(exc, path.parent if path.parent.exists() else Path("/"))
    if isinstance(exc, DiskFullError) or reason is not None:
        return exc if isinstance(exc, DiskFullError) else disk_full_error(what, path, reason, advice)
    return UnwritableError(f"cannot write {what} {path}: {exc.strerror or exc}: give PARALLAX_HOME a folder this "
                           "user can write")


def write_export(path: Path, data: bytes, what: str) -> None:
    """Write an exported file whole or not at all: DiskFullError on a full disk, a ValueError naming
    the file for any other failure (a read-only folder, no permission), never half a file."""
    try:
        with writing(path, what, advice=EXPORT_ADVICE) as handle:
            handle.write(data)
    except DiskFullError:
        raise
    except OSError as exc:
        raise ValueError(f"cannot write {what} {path}: {exc.strerror or exc}") from None


def check_export_dir(directory: Path, flag: str) -> None:
    """ValueError naming ``flag`` and ``directory`` when an export cannot go there: it, or a folder above it, is a
    file (then nothing is written, and no existing file is replaced by a folder)."""
    for path in (directory, *directory.parents):
        if path.exists() and not path.is_dir():
            what = "is an existing file" if path == directory else f"is inside {path}, which is a file"
            raise ValueError(f"{flag} {directory} {what}, not a folder: give a folder (it is created if missing)")
        if path.exists():
            return


def write_remaking_folder(path: Path, what: str, write: Callable[[BinaryIO], None]) -> None:
    """``write`` into ``path`` through ``writing``; should its folder be deleted before or during the
    write (the run's folder, removed while the run trains), make the folder again and write once more.
    For the files a run rewrites as it goes (its best checkpoint, its resume point): the run notes
    the folder's loss itself, once an epoch (rank/trainer.keep_run_folder)."""
    try:
        with writing(path, what) as handle:
            write(handle)
    except FolderGoneError:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise write_problem(exc, what, path) from None
        with writing(path, what) as handle:
            write(handle)


@contextlib.contextmanager
def writing(path: Path, what: str, *, advice: str = RUN_ADVICE) -> Iterator[BinaryIO]:
    """A binary file to write ``path`` through; renamed into place only if the block succeeds."""
    part = path.with_name(path.name + ".part")
    try:
        with open(part, "wb") as handle:
            yield handle
        os.replace(part, path)
    except Exception as exc:
        with contextlib.suppress(OSError):
            part.unlink()
        if isinstance(exc, FileNotFoundError) and not path.parent.is_dir():
            raise FolderGoneError(f"cannot write {what} {path}: its folder {path.parent} was deleted while it was "
                                  "in use; what was recorded in the database is kept") from None
        reason = no_space_reason(exc, path.parent)
        if reason is not None:
            raise disk_full_error(what, path, reason, advice) from exc
        raise
    except BaseException:  # a cancel mid-write leaves no part behind either
        with contextlib.suppress(OSError):
            part.unlink()
        raise
