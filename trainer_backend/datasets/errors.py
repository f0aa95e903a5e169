"""The error every dataset check raises; torch-free, so that checks run before training (limits,
paths) import no torch."""

from __future__ import annotations

import re

# How torch's DataLoader re-raises, in the training process, an error a loader worker raised: the
# same type, made from one text holding the supervisor's whole traceback (torch/utils/data/_utils).
_FROM_LOADER_WORKER = re.compile(r"Caught (\w+) (in DataLoader worker process \d+)\.\nOriginal Traceback")


class DatasetError(ValueError):
    """A dataset problem the user can fix; the message names the value or file and what is allowed.

    Raised in a loader worker (a streamed decode), it reaches the training process with the same
    one line, followed by which supervisor raised it, not the supervisor's traceback."""

    def __init__(self, message: object = "", *args: object):
        super().__init__(from_loader_worker(message) if isinstance(message, str) else message, *args)


def from_loader_worker(text: str) -> str:
    """The error's own message out of a DataLoader's re-raised text, with the worker that raised it;
    any other text as it is."""
    match = _FROM_LOADER_WORKER.match(text)
    if match is None:
        return text
    lines = text.rstrip("\n").split("\n")
    for index in range(len(lines) - 1, 1, -1):  # the raised error is the traceback's last entry
        head, sep, message = lines[index].partition(": ")
        if sep and head.rsplit(".", 1)[-1] == match.group(1) and not head.startswith(" "):
            own = "\n".join([message, *lines[index + 1:]])
            return f"{own} ({match.group(2)})"
    return text
