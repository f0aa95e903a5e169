"""What the Launch form offers: datasets (built-ins and folders under the data roots), timm
models with sensible defaults first, and a model's parameter count, all cached.

The full answers need torch and timm, which take 5–10 s to import on a small machine: they come from
the backend's inspector, a child process (trainer_backend/control/inspect.py), so that this server
process never imports them. Until the inspector has imported them (``training_stack_loaded``), the form
is drawn from what needs neither: the built-in datasets' names and the default models.

Data roots come from ``PARALLAX_DATA_ROOTS`` (colon-separated folders), default
``$PARALLAX_HOME/datasets``; each immediate sub-folder of a root is offered as a dataset, and each
``.csv``/``.txt`` list file in a root or one of those sub-folders (``datasets.roots.offered_lists``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import streamlit as st

from contract.config import RunConfig
from contract.fields import BUILTIN_DATASETS  # the torch-free names; a test keeps them equal
from trainer_backend.control import inspect as ask
from trainer_backend.control.inspect import data_roots, is_under_roots, offered_lists

# The default run's model first, so the form opens on it.
DEFAULT_MODELS = (RunConfig.model, "resnet50", "mobilenetv3_small_100", "efficientnet_b0", "convnext_tiny",
                  "test_resnet")


def training_stack_loaded() -> bool:
    """Whether the inspector has imported torch, timm and the training code's datasets and models.

    One inspector serves every session of the server, so this is the one truth they share."""
    return ask.ready()


def load_training_stack() -> None:
    """Have the inspector import what the full form needs (5–10 s on a small machine, once per server)."""
    ask.warm_up()


def dataset_folders() -> list[str]:
    """Immediate, visible sub-folders of every data root, as absolute paths; a link that leads
    out of the roots is not offered."""
    roots = data_roots()
    folders = []
    for root in roots:
        try:
            if root.is_dir():
                folders += sorted(str(p.resolve()) for p in root.iterdir()
                                  if p.is_dir() and not p.name.startswith(".") and is_under_roots(p, roots))
        except (OSError, RuntimeError):  # an unreadable root, or a link loop resolve() gives up on
            continue
    return folders


def dataset_lists() -> list[str]:
    """List files (path,label lines) in every data root and its immediate sub-folders, as absolute
    paths; one that leads out of the roots is not offered."""
    roots = data_roots()
    found = []
    for root in roots:
        try:
            if not root.is_dir():
                continue
            folders = [root, *sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))]
            for folder in folders:
                found += [str(p.resolve()) for p in offered_lists(folder) if is_under_roots(p, roots)]
        except (OSError, RuntimeError):  # an unreadable root or folder, or a link loop resolve() gives up on
            continue
    return found


def outside_roots(choice: str) -> str | None:
    """Why the dashboard may not use ``choice`` (a folder outside the data roots), or None."""
    from contract.config import ConfigError
    from trainer_backend.control.inspect import check_under_roots

    if choice in BUILTIN_DATASETS:  # decided here: the check would import torch to learn these names
        return None
    try:
        check_under_roots(choice, data_roots())
    except ConfigError as exc:
        return str(exc)
    return None


def dataset_choices() -> list[str]:
    return [*BUILTIN_DATASETS, *dataset_folders(), *dataset_lists()]


def dataset_label(choice: str) -> str:
    """Built-ins by name; folders as 'name (path)'."""
    path = Path(choice)
    return f"{path.name}  ({path.parent})" if path.is_absolute() else choice


@st.cache_data(ttl=60, show_spinner=False)
def describe_dataset(choice: str) -> dict[str, Any]:
    """``inspect_dataset`` (no decoding), or {"problems": [message]} when the folder is unusable.
    Only what lies inside the data roots is read, links included."""
    return ask.describe_dataset(choice, data_roots())


def dataset_summary(info: dict[str, Any]) -> str:
    """'1,797 images · 10 classes · 8×8 px · 1 band' from ``inspect_dataset``."""
    parts = []
    if info.get("num_images") is not None:
        parts.append(f"{info['num_images']:,} images")
    if info.get("num_classes") is not None:
        parts.append(f"{info['num_classes']} classes")
    if info.get("image_shape"):
        height, width = info["image_shape"][:2]
        parts.append(f"{height}×{width} px")
    if info.get("bands"):
        parts.append(f"{info['bands']} band{'s' if info['bands'] != 1 else ''}")
    if info.get("val_source"):
        parts.append(f"validates on {info['val_source']} ({info.get('num_val_images', 0):,} images)")
    return " · ".join(parts)


def memory_problem(info: dict[str, Any], image_size: Any, bands: tuple[int, ...] | None) -> str | None:
    """Why a folder would not fit the decode limit at ``image_size`` (the check the run makes), or None."""
    from trainer_backend.control.inspect import too_large_decoded

    if info.get("kind") != "folder" or not isinstance(image_size, int) or not info.get("num_images"):
        return None
    eight_bit = info.get("dtype") == "uint8" and info.get("default_scale") == 255.0
    return too_large_decoded(info["path"], info["num_images"], input_channels(info, bands), image_size,
                             1 if eight_bit else 2)


def data_on_device_problem(config: RunConfig) -> str | None:
    """Why ``--data-on-device on`` could not keep the dataset on the run's GPUs now (the check the run
    makes before it trains, from the dataset's size and NVML's free memory), or None."""
    if config.data_on_device != "on" or not config.uses_cuda:
        return None
    from contract.config import data_on_device_problem as problem
    from contract.devices import gpu_free_bytes
    from trainer_backend.control.inspect import stored_split_size

    try:
        stored, _ = stored_split_size(config.dataset, config.stored_size or config.image_size, config.bands,
                                      config.band_scale, config.val_from)
    except (OSError, ValueError):  # the dataset's own problem is shown beside it
        return None
    return problem(config, stored, gpu_free_bytes())


def input_channels(info: dict[str, Any], bands: tuple[int, ...] | None) -> int:
    """Channels the model will see: the chosen bands, else the folder's default bands, else the file's."""
    if bands:
        return len(bands)
    if info.get("default_bands"):
        return len(info["default_bands"])
    return int(info.get("bands") or 3)


@st.cache_data(show_spinner=False)
def model_choices() -> list[str]:
    """Every timm architecture, the defaults first."""
    names = ask.model_names()
    defaults = [name for name in DEFAULT_MODELS if name in names]
    return defaults + sorted(set(names) - set(defaults))


@st.cache_data(show_spinner=False, max_entries=256)
def parameter_count(model: str, num_classes: int, in_chans: int) -> int | None:
    """Parameters of ``model`` sized for the dataset, built on the meta device (no memory, no
    weights, instant even for large models). None if the model cannot be built that way."""
    return ask.parameter_count(model, num_classes, in_chans)


def model_problem(model: str) -> str | None:
    """Why timm cannot build ``model`` (with close names), or None."""
    return ask.model_problem(model)


def format_count(count: int) -> str:
    """11689512 -> '11.7 M'."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return str(count)
