"""Your own model: ``--model pkg.module:Attr`` or ``--model path/to/file.py:Attr`` instead of a timm name,
and the source file a run trained, with its SHA-256, so a past run says which code it was.

    is_custom_model("mynet.py:Net")        # True; "resnet18" -> False
    split_model_spec("pkg.nets:Net")       # ("pkg.nets", "Net")
    model_source("mynet.py:Net")           # "/abs/mynet.py sha256=9f2c…"

Torch-free: the command line and the dashboard call it before anything heavy is imported.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os

# The form the entry points of Python packages use (``pkg.mod:attr``); a timm name never holds a colon.
SEPARATOR = ":"


class ModelError(ValueError):
    """A model name, path, weight source or split that cannot work; the message names the model. Here,
    below the training code, so that the command line raises the same error without importing torch."""


def is_custom_model(name: str) -> bool:
    return isinstance(name, str) and SEPARATOR in name


def is_file_path(location: str) -> bool:
    return location.endswith(".py") or os.sep in location or "/" in location


def split_model_spec(name: str) -> tuple[str, str]:
    """('pkg.mod' or 'path/file.py', 'Attr'), or ModelError naming what is missing."""
    location, _, attr = name.rpartition(SEPARATOR)
    if not location or not attr or not attr.replace(".", "_").isidentifier():
        raise ModelError(f"model {name!r} is not allowed: give a timm name (e.g. resnet18), "
                               "pkg.module:Attr or path/to/file.py:Attr, where Attr is an nn.Module class or a "
                               "function returning one")
    return location, attr


def source_file(name: str) -> str:
    """The absolute path of the file a custom model's code is in (its module's file, for a module path)."""
    location, _ = split_model_spec(name)
    if is_file_path(location):
        path = os.path.abspath(os.path.expanduser(location))
        if not os.path.isfile(path):
            raise ModelError(f"model {name!r}: not importable: {path} is not a file")
        return path
    found = _find_without_importing(location, name)
    if found is None or not found.origin or not os.path.isfile(found.origin):
        raise ModelError(f"model {name!r}: not importable: no module named {location!r} on the path a run's "
                         "supervisor imports from (Parallax's folder, PYTHONPATH and installed packages)")
    return os.path.abspath(found.origin)


def module_file_in(name: str, folder: str) -> str | None:
    """The file in ``folder`` that module path ``name`` (``pkg.mod:Attr``) names, where there is one: what a
    user standing in ``folder`` means, which a launched supervisor, running elsewhere, does not import."""
    location, _, attr = name.rpartition(SEPARATOR)
    if not location or is_file_path(location) or not all(p.isidentifier() for p in location.split(".")):
        return None
    base = os.path.join(folder, *location.split("."))
    return next((f for f in (base + ".py", os.path.join(base, "__init__.py")) if os.path.isfile(f)), None)


def _find_without_importing(location: str, name: str):
    """The spec of module ``location`` found by walking its packages' folders, so that no package's
    ``__init__`` runs in this process (the dashboard's): importing is the child check's job."""
    from importlib.machinery import PathFinder

    parts = location.split(".")
    if not all(part.isidentifier() for part in parts):
        raise ModelError(f"model {name!r} is not allowed: {location!r} is neither a dotted module path nor a .py file")
    found, search = None, None
    for part in parts:
        try:
            found = importlib.util.find_spec(part) if search is None else PathFinder.find_spec(part, search)
        except (ImportError, ValueError):
            return None
        if found is None:
            return None
        search = list(found.submodule_search_locations or [])
    return found


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_source(name: str) -> str:
    """'<absolute file> sha256=<hex>' for a custom model, '' for a timm name."""
    if not is_custom_model(name):
        return ""
    path = source_file(name)
    return f"{path} sha256={sha256_of(path)}"


def with_model_source(config):
    """``config`` (a RunConfig) for your own model with its path made absolute (the supervisor runs in the
    project's folder) and its source file's SHA-256 recorded, so the run says which code it trained; a
    timm model's config as given."""
    if not is_custom_model(config.model):
        return config
    location, attr = split_model_spec(config.model)
    if is_file_path(location):
        config = config.replace(model=f"{os.path.abspath(os.path.expanduser(location))}:{attr}")
    return config.replace(model_source=model_source(config.model))
