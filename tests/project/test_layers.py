"""The project's imports run one way: no circles, no private names across modules, and the
layers keep to themselves (the backend never imports the dashboard, the pages never join a
process group). Read from the source with ``ast``, imports inside functions included, since a
circle hidden inside a function is still a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import ROOT

PACKAGES = ("trainer_backend", "db", "ui", "pages", "bench", "reports", "parallax", "contract")
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


def test_the_backend_never_imports_the_dashboard():
    offending = {
        f"{module} imports {name}"
        for module in MODULES if module.startswith("trainer_backend")
        for name in imported_modules(module)
        if name.split(".")[0] in ("streamlit", "ui", "pages")
    }
    assert not offending, sorted(offending)


def dashboard_backend_imports(sources: dict[str, str]) -> list[str]:
    """``module:line imports name`` for each import, at any depth, by the dashboard (app.py, pages/, ui/) of a
    backend module outside trainer_backend.control, its one door: a change inside a rank's code cannot break a
    page, and the server never loads the training stack."""
    found = []
    for module, source in sources.items():
        if module.split(".")[0] not in ("app", "pages", "ui"):
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [f"{node.module}.{alias.name}" if node.module == "trainer_backend" else node.module or ""
                         for alias in node.names]
            else:
                continue
            found += [f"{module}:{node.lineno} imports {name}" for name in dict.fromkeys(names)
                      if name.split(".")[0] == "trainer_backend" and name.split(".")[:2] != ["trainer_backend", "control"]]
    return found


def test_the_dashboard_asks_the_backend_through_control_only():
    found = dashboard_backend_imports(package_sources())
    assert not found, "the dashboard imports the backend beside trainer_backend.control: " + "; ".join(found)


def test_the_door_check_finds_a_page_reaching_past_control_inside_a_function():
    sources = {"ui.options": "from trainer_backend.control.inspect import data_roots\n"
                             "def f():\n    from trainer_backend.rank.models import count_parameters\n",
               "pages.launch": "from trainer_backend import control, datasets\nimport trainer_backend.supervisor.runner\n",
               "reports.scaling": "from trainer_backend.rank.models import count_parameters\n"}
    assert dashboard_backend_imports(sources) == [
        "ui.options:3 imports trainer_backend.rank.models", "pages.launch:1 imports trainer_backend.datasets",
        "pages.launch:2 imports trainer_backend.supervisor.runner"]


def test_pages_and_ui_never_import_torch_distributed():
    offending = {
        f"{module} imports {name}"
        for module in MODULES if module.split(".")[0] in ("ui", "pages", "app", "reports")
        for name in imported_modules(module)
        if name == "torch.distributed" or name.startswith("torch.distributed.")
    }
    assert not offending, sorted(offending)


# The backend's rooms by process role, highest first (trainer_backend/__init__.py draws them; the contract they all
# read is the package at the bottom of LAYERS): a module imports
# from its own room or a lower one, never a higher one.
ROOMS = ("control", "supervisor", "rank", "telemetry", "datasets")


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "trainer_backend" and len(parts) > 1 and parts[1] in ROOMS else None


def upward_imports(modules) -> list[str]:
    found = []
    for module in modules:
        room = room_of(module)
        for source, _name, line in imports_of(module) if room else ():
            target = room_of(source)
            if target and ROOMS.index(target) < ROOMS.index(room):
                found.append(f"{module}:{line} ({room}) imports {source} ({target})")
    return found


def test_the_backends_rooms_import_only_downward():
    assert not upward_imports(MODULES), upward_imports(MODULES)


def test_every_backend_module_lives_in_a_room_and_no_room_holds_more_than_15():
    loose = [m for m in MODULES if m.startswith("trainer_backend.") and room_of(m) is None
             and m not in ("trainer_backend.__main__",)]
    assert not loose, f"modules outside the rooms: {loose}"
    for folder in [p for p in (ROOT / "trainer_backend").rglob("*") if p.is_dir() and p.name != "__pycache__"]:
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        assert len(modules) <= 15, f"{folder.relative_to(ROOT)} holds {len(modules)} modules"
        assert (folder / "__init__.py").read_text(encoding="utf-8").startswith('"""'), f"{folder} has no docstring"


def test_the_contract_imports_no_torch():
    """The dashboard and the launcher read the contract without loading torch (a subprocess: this one has it)."""
    import subprocess
    import sys

    contract = sorted(m for m in MODULES if m.split(".")[0] == "contract")
    code = "import sys\n" + "".join(f"import {m}\n" for m in contract) + "print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stdout + done.stderr


# The top-level packages, highest first (docs/HOW_IT_IS_BUILT.md draws them): a package imports from itself or a
# lower one, never a higher one. The contract (RunConfig, the field catalogue, strategy specs, where Parallax keeps
# its state) is at the bottom, so that the database, the reports and the backend all read it without reading each
# other upward.
LAYERS = ("app", "bench", "pages", "ui", "parallax", "trainer_backend", "reports", "db", "contract")
NOT_PRODUCT = ("tests", "docs", "scripts")


def top_level_packages() -> set[str]:
    found = {p.parent.name for p in ROOT.glob("*/__init__.py")} | {p.stem for p in ROOT.glob("*.py")}
    return {name for name in found if name not in NOT_PRODUCT and not name.startswith(".") and name != "setup"}


def package_sources() -> dict[str, str]:
    """{module: source} for every module of every top-level package, migrations included."""
    sources = {}
    for package in LAYERS:
        paths = [ROOT / f"{package}.py"] if (ROOT / f"{package}.py").exists() else sorted((ROOT / package).rglob("*.py"))
        for path in paths:
            sources[".".join(path.relative_to(ROOT).with_suffix("").parts)] = path.read_text(encoding="utf-8")
    return sources


def upward_package_imports(sources: dict[str, str], layers=LAYERS) -> list[str]:
    """``module:line imports name (package above)`` for each import, at any depth, of a higher package."""
    found = []
    for module, source in sources.items():
        here = module.split(".")[0]
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                there = name.split(".")[0]
                if there != here and there in layers and layers.index(there) < layers.index(here):
                    found.append(f"{module}:{node.lineno} ({here}) imports {name} ({there}, above it)")
    return found


def test_every_top_level_package_has_its_place_in_the_layers():
    unplaced = top_level_packages() - set(LAYERS)
    assert not unplaced, f"top-level packages missing from LAYERS (tests/project/test_layers.py): {sorted(unplaced)}"


def test_the_top_level_packages_import_only_downward():
    found = upward_package_imports(package_sources())
    assert not found, "imports of a higher package: " + "; ".join(found)


def test_the_package_checker_finds_an_arrow_up_inside_a_function():
    sources = {"db.store": "import os\nfrom contract.config import RunConfig\n",
               "db.tags": "def f():\n    from trainer_backend.supervisor.tags import parse_tags\n",
               "reports.sweep_report": "import db\nimport ui.views\n"}
    assert upward_package_imports(sources) == [
        "db.tags:2 (db) imports trainer_backend.supervisor.tags (trainer_backend, above it)",
        "reports.sweep_report:2 (reports) imports ui.views (ui, above it)"]
