"""A strategy's name is spelt out only by its spec (contract/strategy_specs.py) and the class that
runs it (trainer_backend/rank/strategies/): everywhere else code asks the spec (``spec(name).staged``,
``baseline()``, ``sweep_base_for(n)``) instead of testing or choosing a name by its string, so that a new strategy,
or a renamed one, changes one place.

    .venv/bin/python -m pytest tests/project/test_strategy_names.py -q
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import ROOT
from contract.strategy_specs import STRATEGY_SPECS

PRODUCT = ("app.py", "pages", "ui", "db", "reports", "trainer_backend", "parallax")
# Where strategy names may be written: their specs, and the classes that run them.
OWNERS = ("trainer_backend/rank/strategies/", "contract/strategy_specs.py")


def docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants of the module, its classes and functions: prose may name a strategy."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def named_strategies(source: str) -> list[tuple[int, str]]:
    """(line, name) of every string literal that is a whole strategy name: ``x == "pp"``, ``x in ("ddp", "fsdp")``,
    ``.isin(["mp"])``, ``{"dp": ...}``, ``strategy="single"``, ``CHOICES = ("single", "ddp")``; never a name inside
    a longer text or a docstring."""
    tree = ast.parse(source)
    prose = docstrings(tree)
    return sorted((node.lineno, node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in STRATEGY_SPECS
                  and id(node) not in prose)


def product_files() -> list[Path]:
    paths = []
    for part in PRODUCT:
        path = ROOT / part
        paths += [path] if path.is_file() else sorted(path.rglob("*.py")) if path.is_dir() else []
    return [p for p in paths if "migrations" not in p.parts
            and not any(p.relative_to(ROOT).as_posix().startswith(owner) for owner in OWNERS)]


def test_the_scan_finds_a_name_in_every_form_and_not_in_prose():
    source = ('"""Train with ddp or "pp"."""\n'
              'if config.strategy == "pp":\n    pass\nok = strategy in ("ddp", "fsdp")\nx = df["s"].isin(["mp"])\n'
              'why = {"dp": "a"}[strategy]\nfine = strategy == other\nnote = "pp in words"\nd = {"lr": 1}\n'
              'c = config.replace(strategy="single")\nlabel = f"{n} single"\n')
    assert named_strategies(source) == [(2, "pp"), (4, "ddp"), (4, "fsdp"), (5, "mp"), (6, "dp"), (10, "single")]


def test_no_strategy_name_is_written_outside_its_spec_and_its_class():
    found = {}
    for path in product_files():
        names = named_strategies(path.read_text(encoding="utf-8"))
        if names:
            found[path.relative_to(ROOT).as_posix()] = names
    assert not found, f"strategy names written outside their specs (ask the spec instead): {found}"
