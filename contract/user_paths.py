"""Every path a user gives, made absolute against the folder they stand in, where they give it.

    user_path("../data/flowers")                       # '/home/ana/data/flowers' when run from /home/ana/work
    with_absolute_paths(RunConfig(dataset="../data/flowers", model="my_net.py:Net"))

A run is trained by other processes in other folders (a launched supervisor and the model's check run in
Parallax's own folder, a Slurm job in the run's folder, a sweep's runs later): a relative path means what
the user meant only where they typed it. So the command line and the dashboard make each path absolute as
they first read it, before any check, and the run stores it so: ``--dataset ../data/x`` and
``--dataset /home/ana/data/x`` are one dataset on Compare. A built-in dataset's name, a timm model's name and
a module path (``pkg.module:Attr``, found on the import path) are names, not paths, and stay as given.

Torch-free: the command line calls it before anything heavy is imported.
"""

from __future__ import annotations

import os

from contract.fields import BUILTIN_DATASETS
from contract.model_source import SEPARATOR, is_custom_model, is_file_path


def user_path(text: str, cwd: str | None = None) -> str:
    """``text`` (relative, ``~``, with ``..``) as an absolute, normalised path against ``cwd`` (default: this
    process's working folder), naming what the system would open. Symbolic links are kept as typed, except
    those a ``..`` leaves: ``link/..`` is the parent of where the link points, as the system reads it, not the
    folder that holds the link, so the part up to the last ``..`` is resolved."""
    path = os.path.join(cwd or os.getcwd(), os.path.expanduser(text))
    parts = path.split(os.sep)
    if os.pardir in parts:
        last = len(parts) - 1 - parts[::-1].index(os.pardir)
        path = os.path.join(os.path.realpath(os.sep.join(parts[:last + 1]) or os.sep), *parts[last + 1:])
    return os.path.normpath(path)


def absolute_dataset(dataset: str, cwd: str | None = None) -> str:
    """A dataset folder or list file made absolute; a built-in dataset's name as it is."""
    return dataset if dataset in BUILTIN_DATASETS else user_path(dataset, cwd)


def absolute_model(model: str, cwd: str | None = None) -> str:
    """``path/to/file.py:Attr`` with its file made absolute; a timm name or a module path as it is."""
    if not is_custom_model(model):
        return model
    location, _, attr = model.rpartition(SEPARATOR)
    return f"{user_path(location, cwd)}{SEPARATOR}{attr}" if location and is_file_path(location) else model


def with_absolute_paths(config, cwd: str | None = None):
    """``config`` (a RunConfig) with its dataset and its model's file made absolute against ``cwd``."""
    dataset, model = absolute_dataset(config.dataset, cwd), absolute_model(config.model, cwd)
    if (dataset, model) == (config.dataset, config.model):
        return config
    return config.replace(dataset=dataset, model=model)
