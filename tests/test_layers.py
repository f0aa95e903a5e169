"""The project's imports run one way: no circles, no private names across modules, and the
layers keep to themselves (the engine never imports the dashboard, the pages never join a
process group). Read from the source with ``ast``, imports inside functions included, since a
circle hidden inside a function is still a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGES = ("trainer_backend", "db", "ui", "pages", "bench", "reports")
TOP_FILES = ("app.py",)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    paths = [ROOT / name for name in TOP_FILES]
    for package in PACKAGES:
        paths += sorted((ROOT / package).rglob("*.py"))
    return {module_name(p): p for p in paths if p.exists() and "migrations" not in p.parts}


MODULES = project_modules()


def is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def resolve_from(module: str, node: ast.ImportFrom) -> str:
    """The absolute name of what ``from <node.module> import ...`` reads, inside ``module``."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package(module) else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str) -> list[tuple[str, str, int]]:
    """(imported module, imported name or "", line) for every import in the file, at any depth."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, "", node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = resolve_from(module, node)
            found += [(source, alias.name, node.lineno) for alias in node.names]
    return found


def project_target(source: str, name: str) -> str | None:
    """The project module an import loads: the submodule where ``from package import submodule``."""
    if name and f"{source}.{name}" in MODULES:
        return f"{source}.{name}"
    while source and source not in MODULES:
        source = source.rpartition(".")[0]
    return source or None


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for module in MODULES:
        for source, name, _ in imports_of(module):
            target = project_target(source, name)
            if target is not None and target != module:
                graph[module].add(target)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected group of modules (Tarjan), shown as a path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_the_import_graph_has_no_circles():
    cycles = find_cycles(import_graph())
    assert not cycles, "import circles (imports inside functions count): " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_checker_finds_a_circle_hidden_in_a_function():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []
    # A function-level import is read like any other.
    tree = ast.parse("def f():\n    from .loop import train_one_epoch\n")
    assert [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] == ["loop"]


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_private_name_is_imported_from_another_module():
    crossings = []
    for module in MODULES:
        tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
        aliases: dict[str, str] = {}  # local name -> project module it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = resolve_from(module, node)
                for alias in node.names:
                    target = project_target(source, alias.name)
                    if target is None:
                        continue
                    if is_private(alias.name):
                        crossings.append(f"{module}:{node.lineno} imports {alias.name} from {source}")
                    elif target == f"{source}.{alias.name}":
                        aliases[alias.asname or alias.name] = target
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if project_target(alias.name, "") is not None and alias.asname:
                        aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and is_private(node.attr) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases):
                crossings.append(f"{module}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    assert not crossings, "private names used across modules: " + "; ".join(crossings)


def imported_modules(module: str) -> set[str]:
    names = set()
    for source, name, _ in imports_of(module):
        names.add(source)
        if name:
            names.add(f"{source}.{name}")
    return names


def test_the_engine_never_imports_the_dashboard():
    offending = {
        f"{module} imports {name}"
        for module in MODULES if module.startswith("trainer_backend")
        for name in imported_modules(module)
        if name.split(".")[0] in ("streamlit", "ui", "pages")
    }
    assert not offending, sorted(offending)


def test_pages_and_ui_never_import_torch_distributed():
    offending = {
        f"{module} imports {name}"
        for module in MODULES if module.split(".")[0] in ("ui", "pages", "app", "reports")
        for name in imported_modules(module)
        if name == "torch.distributed" or name.startswith("torch.distributed.")
    }
    assert not offending, sorted(offending)
