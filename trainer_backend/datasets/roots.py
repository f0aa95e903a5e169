"""The folders the dashboard may train on: only those inside the data roots.

    roots = data_roots()                       # PARALLAX_DATA_ROOTS (colon-separated), default $PARALLAX_HOME/datasets
    check_under_roots("/data/EuroSAT", roots)  # ConfigError naming the folder and the roots if outside
    offered_lists(Path("/data/photos"))        # the list files in a folder the dashboard offers as datasets

Paths are compared after resolving them (``..`` and symlinks), so a link inside a root that
points elsewhere is refused like the folder it points to. The dashboard checks before it
launches and its supervisor checks again; the CLI on its own trains on any folder its user can read.
"""

from __future__ import annotations

import os
from pathlib import Path

from contract.environment import parallax_home

from contract.config import ConfigError

# A dataset path with one of these suffixes is a list file of path,label lines (layouts.py); a list
# or a folder named one of VAL_NAMES validates the train list or train/ folder beside it.
LIST_SUFFIXES = (".csv", ".txt")
VAL_NAMES = ("val", "validation")


def data_roots() -> list[Path]:
    configured = os.environ.get("PARALLAX_DATA_ROOTS")
    if configured:
        return [Path(p).expanduser() for p in configured.split(os.pathsep) if p.strip()]
    return [parallax_home() / "datasets"]


def is_under_roots(folder: str | Path, roots: list[Path]) -> bool:
    real = os.path.realpath(os.path.expanduser(folder))
    for root in roots:
        real_root = os.path.realpath(os.path.expanduser(root))
        if real != real_root and os.path.commonpath([real, real_root]) == real_root:
            return True
    return False


def check_under_roots(dataset: str, roots: list[Path]) -> None:
    """Built-in names pass; a folder must resolve to a place inside one of ``roots``."""
    from trainer_backend.datasets.builtin import BUILTIN_DATASETS  # imports torch: the Launch form imports this module

    if dataset in BUILTIN_DATASETS or is_under_roots(dataset, roots):
        return
    real = os.path.realpath(os.path.expanduser(dataset))
    resolved = f" (it resolves to {real})" if real != os.path.abspath(os.path.expanduser(dataset)) else ""
    what = "list file" if Path(dataset).suffix.lower() in LIST_SUFFIXES else "folder"
    raise ConfigError(
        "dataset",
        f"dataset {what} {dataset}{resolved} is outside the data roots ({', '.join(str(r) for r in roots)}): "
        f"the dashboard trains only on {what}s inside them; move or copy the data into a root, "
        "or add its parent folder to PARALLAX_DATA_ROOTS",
    )


def offered_lists(folder: Path) -> list[Path]:
    """The list files directly in ``folder`` that the dashboard offers as datasets, sorted: every
    visible ``.csv``/``.txt`` but validation lists, which come with the train list beside them."""
    return sorted(path for path in folder.iterdir()
                  if path.suffix.lower() in LIST_SUFFIXES and not path.name.startswith(".")
                  and path.stem.lower() not in VAL_NAMES and path.is_file())
