"""Every path a dataset folder is read through: classified without a traceback, kept inside the
data roots when a run is confined to them, and opened as it was checked.

    kind = entry_kind(path, roots)        # "dir" or "file"; DatasetError naming a broken link,
                                          # a link loop, an unreadable or an outside path
    with open_checked(path, roots) as f:  # the file opened is the file checked (no swap between)
        ...

``roots`` is None for the CLI, which reads any folder its user can read; a run launched from the
dashboard passes its data roots, and then every class folder and file read, links included,
must resolve inside them.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from contract.printable import shown_name
from trainer_backend.datasets.roots import is_under_roots
from trainer_backend.datasets.errors import DatasetError


def os_reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


_KINDS = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a link"),
          (stat.S_ISREG, "a regular file"))


def file_kind(mode: int) -> str:
    """What ``mode`` (a stat's st_mode) says the file is, in words: "a named pipe", "a folder", ..."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def broken_path_error(path: Path, exc: OSError) -> DatasetError:
    """One line for a path that cannot be followed: a dangling link, a link loop, no permission."""
    if exc.errno == errno.ELOOP:
        return DatasetError(f"dataset path {path} is a link loop (it leads back to itself): remove or fix the link")
    if exc.errno == errno.ENOENT and os.path.islink(path):
        return DatasetError(f"dataset path {path} is a broken link (it points to {os.readlink(path)}, which does "
                            "not exist): remove or fix the link")
    if exc.errno == errno.ENOENT:
        return DatasetError(f"dataset path {shown_name(path)} is missing: it was there when the folder was listed "
                            "and has been removed or moved since; put it back, or start the run again so that the "
                            "folder is listed anew")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return DatasetError(f"dataset path {path} cannot be read (permission denied): make it readable to this "
                            "user, or move it out of the dataset folder")
    return DatasetError(f"dataset path {path} cannot be read ({os_reason(exc)})")


def outside_roots_error(path: Path, real: str, roots: list[Path]) -> DatasetError:
    return DatasetError(
        f"dataset path {path} leads outside the data roots (to {real}): the dashboard reads only files inside "
        f"{', '.join(str(r) for r in roots)}; copy the data into the folder instead of linking to it")


def check_inside(path: Path, roots: list[Path] | None) -> None:
    if roots is not None and not is_under_roots(path, roots):
        raise outside_roots_error(path, os.path.realpath(path), roots)


def entry_stat(path: Path, roots: list[Path] | None) -> os.stat_result:
    """``path``'s stat, links followed; a path that cannot be followed or lies outside ``roots``
    raises DatasetError naming it."""
    try:
        result = os.stat(path)
    except OSError as exc:
        raise broken_path_error(path, exc) from None
    check_inside(path, roots)
    if not (stat.S_ISDIR(result.st_mode) or stat.S_ISREG(result.st_mode)):
        raise DatasetError(f"dataset path {path} is neither a folder nor a regular file (a pipe, socket or "
                           "device): remove it from the dataset folder")
    return result


def folder_entries(folder: Path) -> list[Path]:
    """The entries of ``folder``, sorted; an unreadable folder raises DatasetError naming it."""
    try:
        return sorted(Path(entry.path) for entry in os.scandir(folder))
    except OSError as exc:
        raise broken_path_error(folder, exc) from None


def open_checked(path: Path, roots: list[Path] | None) -> BinaryIO:
    """``path`` opened for reading, refused unless it is a regular file and, with ``roots``, the
    file actually opened lies inside them. The check reads the opened descriptor, so a link
    swapped in after the folder was listed is caught too."""
    try:
        # O_NONBLOCK: a pipe planted under an image's name must not hang the open.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise broken_path_error(path, exc) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DatasetError(f"dataset path {path} is not a regular file")
        if roots is not None:
            real = opened_path(fd, path)
            if not is_under_roots(real, roots):
                raise outside_roots_error(path, real, roots)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def opened_path(fd: int, path: Path) -> str:
    """The real path of the file open on ``fd``: Linux names it in /proc; elsewhere the path's
    resolution, accepted only if it is the same file as the one open."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        real = os.path.realpath(path)
        opened, resolved = os.fstat(fd), os.stat(real)
        if (opened.st_dev, opened.st_ino) != (resolved.st_dev, resolved.st_ino):
            raise DatasetError(f"dataset path {path} changed while it was being opened: try again") from None
        return real
