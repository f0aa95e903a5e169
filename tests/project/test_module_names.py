"""A module's name says one thing: no two modules of the product share a name (a reader who meets
``lifecycle`` or ``fields`` in a traceback, an import or a sentence knows which file it is).

A package counts by its folder's name (``forecast/`` beside ``forecast.py`` is a name used twice). Left out:
``__main__`` (named by Python), the migrations' versions (named by number), bench/ (each benchmark is named after
what it measures) and tests/ (named after what they test).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from tests.project.test_layers import LAYERS
from tests.support import ROOT

SKIPPED = ("bench",)


def product_modules(root: Path) -> list[Path]:
    paths = []
    for package in LAYERS:
        if package in SKIPPED:
            continue
        if (root / f"{package}.py").exists():
            paths.append(root / f"{package}.py")
        paths += [p for p in (root / package).rglob("*.py") if "versions" not in p.relative_to(root).parts]
    return [p for p in paths if p.stem != "__main__"]


def names_used_twice(paths: list[Path], root: Path) -> dict[str, list[str]]:
    where = defaultdict(list)
    for path in paths:
        named = path.parent if path.stem == "__init__" else path  # a package: its folder
        where[named.stem].append(str(named.relative_to(root)))
    return {name: sorted(found) for name, found in sorted(where.items()) if len(found) > 1}


def test_no_module_name_appears_twice_in_the_product():
    twice = names_used_twice(product_modules(ROOT), ROOT)
    assert not twice, f"module names used twice: {twice}"


def test_the_check_finds_a_name_used_twice(tmp_path):
    for name in ("db/state.py", "trainer_backend/control/state.py", "db/__init__.py", "ui/__init__.py",
                 "db/migrations/versions/0001_initial.py", "contract/0001_initial.py", "bench/draw.py",
                 "reports/draw.py", "trainer_backend/rank/estimate/__init__.py", "reports/estimate.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert names_used_twice(product_modules(tmp_path), tmp_path) == {
        "estimate": ["reports/estimate.py", "trainer_backend/rank/estimate"],
        "state": ["db/state.py", "trainer_backend/control/state.py"]}
