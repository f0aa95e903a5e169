"""Optional plugin modules, named in PARALLAX_PLUGINS (comma-separated import paths).

Each is imported in every training process before the model is built, e.g. to register a
custom timm architecture with ``timm.models.register_model`` so ``--model`` can name it.
"""

from __future__ import annotations

import importlib
import os


def load_plugins() -> list[str]:
    names = [n.strip() for n in os.environ.get("PARALLAX_PLUGINS", "").split(",") if n.strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ValueError(f"PARALLAX_PLUGINS names {name!r}, which cannot be imported: {exc}") from None
    return names
