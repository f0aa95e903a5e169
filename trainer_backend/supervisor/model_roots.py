"""Which of your own models the dashboard may check and train: a form runs no code but what the machine's owner
put in the model folders.

    roots = model_roots()                          # PARALLAX_MODEL_ROOTS (colon-separated), default $PARALLAX_HOME/models
    check_model_allowed("~/nets/mynet.py:Net")     # ModelError naming the file, the folders and how to allow it
    check_model_args_allowed("resnet18", {"checkpoint_path": "/x"})  # ModelError: timm would load that file

From the dashboard a model is a timm name, or ``path/to/file.py:Attr`` / ``pkg.module:Attr`` whose file resolves
(``..`` and links followed) inside a model folder, and whose ``Attr`` is a class or function that file itself
defines (``class Attr`` or ``def Attr`` at its top level, never bound otherwise): so a form cannot reach through
an allowed file to anything it imports (``mynet.py:os.system``). The file is read, never imported, here; so it
must be source (``.py``), never the bytecode Python leaves in ``__pycache__`` beside it, from which anything the
source imports could be reached. The
dashboard checks before its model check starts a process and before it launches, resumes or queues a sweep, and
the run's supervisor checks again; the command line, run by the machine's own user, takes any model.

A timm model's arguments from the dashboard name none of the keywords with which ``timm.create_model`` reads or
downloads files (a checkpoint, a pretrained weights override, a download folder): through them a form would read
any file the server can, or download a file of its choosing into a model folder and then run it as your own model.
"""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Mapping
from pathlib import Path

from contract.environment import parallax_home
from contract.model_source import ModelError, is_custom_model, is_file_path, source_file, split_model_spec
from trainer_backend.datasets.roots import is_under_roots

MODEL_ROOTS_ENV = "PARALLAX_MODEL_ROOTS"
# timm.create_model's (and build_model_with_cfg's) keywords that name a file, a folder or a URL to load or write.
TIMM_LOADING_ARGS = ("checkpoint_path", "cache_dir", "pretrained_cfg", "pretrained_cfg_overlay")


def model_roots() -> list[Path]:
    configured = [Path(p).expanduser() for p in os.environ.get(MODEL_ROOTS_ENV, "").split(os.pathsep) if p.strip()]
    return configured or [parallax_home() / "models"]


def check_model_allowed(name: str, roots: list[Path] | None = None) -> None:
    """A timm name passes; your own model must lie inside ``roots`` (default: ``model_roots()``) and name a
    class or function its file defines. ModelError, in one line that says how to allow it, otherwise."""
    if not is_custom_model(name):
        return
    roots = model_roots() if roots is None else roots
    shown_roots = ", ".join(str(root) for root in roots)
    how = (f"put the file in {roots[0]}, or add its folder to {MODEL_ROOTS_ENV} where the dashboard starts (the "
           "command line runs any model)")
    location = split_model_spec(name)[0]
    try:
        path = source_file(name)  # found, never imported
    except ModelError:
        if is_file_path(location):
            raise  # "… is not a file": the path the user typed, named
        raise ModelError(f"model {name!r} is not allowed from the dashboard: {location!r} is not a module file inside "
                         f"the model folders ({shown_roots}); {how}") from None
    if not is_under_roots(path, roots):
        real = os.path.realpath(path)
        resolved = f" (it resolves to {real})" if real != path else ""
        raise ModelError(f"model {name!r} is not allowed from the dashboard: {path}{resolved} is outside the model "
                         f"folders ({shown_roots}); {how}")
    if not path.endswith(".py"):  # bytecode (__pycache__/*.pyc) or a compiled extension runs, but cannot be read
        raise ModelError(f"model {name!r} is not allowed from the dashboard: {path} is not Python source (a .py "
                         "file), which the dashboard reads to see that it defines the class or function named")
    _check_defined_in_file(name, path)


def check_model_args_allowed(name: str, model_args: Mapping | str) -> None:
    """A timm model's arguments (a dict, or its JSON) name none of TIMM_LOADING_ARGS; your own model's go to
    the code in the model folders as they are. ModelError in one line naming the arguments otherwise."""
    if is_custom_model(name):
        return
    given = json.loads(model_args or "{}") if isinstance(model_args, str) else model_args
    named = sorted(set(given) & set(TIMM_LOADING_ARGS)) if isinstance(given, Mapping) else []
    if named:
        raise ModelError(f"model_args {', '.join(named)} of timm model {name!r} is not allowed from the dashboard: "
                         "it makes timm read a file or download into a folder; pretrained weights come with the "
                         "pretrained switch (from the local cache when offline); the command line takes it")


def _check_defined_in_file(name: str, path: str) -> None:
    attr = split_model_spec(name)[1]
    refused = (f"model {name!r} is not allowed from the dashboard: {attr} must be a class or function that "
               f"{os.path.basename(path)} defines itself (class {attr.split('.')[0]}: or def "
               f"{attr.split('.')[0]}(...) at its top level)")
    if "." in attr:
        raise ModelError(refused + ", not an attribute reached through it")
    try:
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read(), path)
    except SyntaxError:
        return  # a file Python cannot parse runs nothing: its import fails, and the check says where
    except (OSError, ValueError) as exc:
        raise ModelError(f"model {name!r}: {path} cannot be read: {exc}") from None
    definitions, other_bindings, star_lines = _top_level_bindings(tree)
    if attr in definitions and any(line > definitions[attr] for line in star_lines):
        raise ModelError(refused + f"; the file also binds names with an import of * after it (line {max(star_lines)})")
    if attr not in definitions or attr in other_bindings:
        raise ModelError(refused + (f"; the file also binds {attr} otherwise" if attr in definitions else ""))


def _top_level_bindings(tree: ast.Module) -> tuple[dict[str, int], set[str], list[int]]:
    """({name a top-level class or def statement binds: the line of its last}, {names anything else binds at
    module level: assignments, imports, loops, ``except … as``, walrus anywhere outside a function's body,
    ``global`` inside a function}, [lines of ``from … import *`` at module level], which may bind any name)."""
    definitions: dict[str, int] = {}
    others: set[str] = set()
    star_lines: list[int] = []
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            definitions[node.name] = max(node.lineno, definitions.get(node.name, 0))
            for child in ast.iter_child_nodes(node):  # its decorators, bases and defaults run at the top level
                if not isinstance(child, ast.stmt):
                    others.update(_bound_in(child))
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            others.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
            star_lines += [node.lineno] if any(alias.name == "*" for alias in node.names) else []
            continue
        for child in ast.iter_child_nodes(node):  # if/try/with/for/match blocks at the top level bind at the top level
            if isinstance(child, ast.stmt):
                pending.append(child)
            elif isinstance(child, (ast.ExceptHandler, ast.match_case)):  # so do an except's and a case's bodies
                pending.extend(child.body)
                others.update(_bound_in(child, shallow=True))
            else:
                others.update(_bound_in(child))
    for node in ast.walk(tree):  # a function may rebind a module name with ``global``
        if isinstance(node, ast.Global):
            others.update(node.names)
    return definitions, others, star_lines


def _bound_in(node: ast.AST, *, shallow: bool = False) -> set[str]:
    """Every name ``node`` binds: assigned or loop names, ``except … as``, ``with … as``, match captures. With
    ``shallow``, ``node`` itself and its parts that are not statements (the caller reads an except's or a
    case's body as statements of its own)."""
    if shallow:
        nodes = [node] + [each for child in ast.iter_child_nodes(node) if not isinstance(child, ast.stmt)
                          for each in ast.walk(child)]
    else:
        nodes = list(ast.walk(node))
    bound = set()
    for each in nodes:
        if isinstance(each, ast.Name) and isinstance(each.ctx, ast.Store):
            bound.add(each.id)
        elif isinstance(each, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and each.name:
            bound.add(each.name)
        elif isinstance(each, ast.MatchMapping) and each.rest:
            bound.add(each.rest)
    return bound
