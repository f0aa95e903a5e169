"""The suite is laid out as the product is (tests/__init__.py): a test file sits in a folder that mirrors a
product package (``tests/db/``, ``tests/trainer_backend/rank/strategies/`` ...) or in one of the folders for
what crosses them, and every folder is a package, so that two folders may hold the same file name and a
spawned rank can import its target's module by name."""

from __future__ import annotations

from pathlib import Path

from tests.project.test_layers import PACKAGES
from tests.support import ROOT

TESTS = ROOT / "tests"
# What crosses modules and processes: a real browser and whole runs, faults and checks at every edge, the
# project itself.
CROSS_CUTTING = ("e2e", "system", "project")
# Not tests: data the tests read, fakes a subprocess imports by path, plugins a run imports by name.
NOT_TESTS = ("fixtures", "fake_nvml", "plugins", "__pycache__")


def layout_files() -> list[Path]:
    """Every test file, as a path under tests/."""
    return sorted(p.relative_to(TESTS) for p in TESTS.rglob("test_*.py") if not set(p.relative_to(TESTS).parts) & set(NOT_TESTS))


def mirrors_a_package(folder: Path) -> bool:
    """tests/x/ for a folder x/ of product modules (pages/ is one without an __init__.py)."""
    return bool(folder.parts) and folder.parts[0] in PACKAGES and any((ROOT / folder).glob("*.py"))


def test_every_test_file_is_in_a_folder_mirroring_a_product_package_or_a_cross_cutting_one():
    misplaced = [f"tests/{path}" for path in layout_files()
                 if not (mirrors_a_package(path.parent) or path.parent.parts in [(name,) for name in CROSS_CUTTING])]
    assert len(layout_files()) > 50
    assert not misplaced, (f"test files outside a folder that mirrors one of the product's (tests/x/ for the modules "
                           f"in x/) or one of tests/{{{','.join(CROSS_CUTTING)}}}/: {misplaced}")


def test_every_folder_of_tests_is_a_package():
    folders = {folder for path in layout_files() for folder in path.parents if folder.parts}
    missing = sorted(f"tests/{folder}" for folder in folders if not (TESTS / folder / "__init__.py").is_file())
    assert (TESTS / "__init__.py").is_file()
    assert not missing, f"folders of tests without __init__.py (two test files of one name would clash): {missing}"
