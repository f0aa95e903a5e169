"""The error every dataset check raises; torch-free, so that checks run before training (limits,
paths) import no torch."""


class DatasetError(ValueError):
    """A dataset problem the user can fix; the message names the value or file and what is allowed."""
