"""The strategy protocol stays small and the loop never asks which strategy it runs: the base class has fewer
than ten methods (the rest is done by the helpers each strategy owns), every strategy is one class over the base
(FSDP and the pipeline share the process-group helper rather than DDP's class), and no branch of the training
loop tests the strategy. Read from the source.

    .venv/bin/python -m pytest tests/trainer_backend/rank/strategies/test_base.py -q
"""

from __future__ import annotations

import ast
import inspect

from contract.strategy_specs import STRATEGY_SPECS
from trainer_backend.rank import loop
from trainer_backend.rank.strategies.base import Strategy
from trainer_backend.rank.strategies.registry import strategy_class

PROTOCOL = {"setup", "wrap", "to_device", "train_step", "evaluate", "extra_metrics", "all_reduce", "barrier",
            "teardown"}


def methods_of(cls: type) -> set[str]:
    """The methods (properties too) a class body defines, public or meant to be overridden; not the constructor."""
    (body,) = ast.parse(inspect.getsource(cls)).body
    return {node.name for node in body.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and not (node.name.startswith("__") and node.name.endswith("__"))}


def test_the_strategy_base_is_nine_methods():
    assert methods_of(Strategy) == PROTOCOL and len(PROTOCOL) < 10


def test_every_strategy_is_one_class_over_the_base():
    for name in STRATEGY_SPECS:
        cls = strategy_class(name)
        assert cls is Strategy or cls.__bases__ == (Strategy,), f"{name}: {cls.__mro__}"
        assert {m for m in methods_of(cls) if not m.startswith("_")} <= PROTOCOL, f"{name} adds to the protocol"


def branches_on_the_strategy(source: str) -> list[str]:
    """``line: test`` for each if, conditional expression or loop condition that reads the strategy."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            names = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
            attributes = {n.attr for n in ast.walk(node.test) if isinstance(n, ast.Attribute)}
            if "strategy" in names or "runs_own_loop" in attributes:
                found.append(f"{node.lineno}: {ast.unparse(node.test)}")
    return found


def test_the_training_loop_never_branches_on_the_strategy():
    assert branches_on_the_strategy(inspect.getsource(loop)) == []


def test_the_branch_check_finds_one():
    source = ("def f(strategy, step):\n    if strategy.runs_own_loop:\n        return 1\n"
              "    return 2 if step > 1 else strategy.name\n")
    assert branches_on_the_strategy(source) == ["2: strategy.runs_own_loop"]
