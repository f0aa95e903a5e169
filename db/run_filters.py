"""The Runs page's filter language, as W&B and MLflow users write it, turned into SQL conditions on ``runs``.

    lr > 0.01 and strategy = ddp and best_val_acc >= 0.9
    config.optimizer = adam, summary.val/acc > 0.5, tag = baseline, note ~ "lr sweep"

A filter is clauses joined by ``and`` (or commas); a clause is ``NAME OP VALUE`` with OP one of ``=`` (or
``==``), ``!=``, ``>``, ``>=``, ``<``, ``<=`` and ``~`` (contains, any case). A VALUE is a number, a word, or
text in quotes. NAME is a column of the run (``FIELDS``: status, strategy, model, dataset, kind, host, id,
tag, note), one of its figures (``FIGURES``: best_val_acc, images_per_s, training_time_s, epochs_time_s,
epochs_done; ``metrics.``/``summary.`` before one is allowed), ``summary.KEY`` (a script's run.summary), or
else a config field (``config.KEY`` or ``params.KEY``, or the bare KEY: ``lr``; dots reach into nested
fields). Numbers compare as numbers; a field holding text, or none, never matches a number.

``conditions(text, dialect)`` returns the SQLAlchemy conditions (all must hold), or raises ValueError with one
line naming the bad part and what is allowed. Everything runs in the database: 100,000 runs are filtered
without a row read into Python.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sqlalchemy import Float, Text, case, cast, func, literal, not_, or_
from sqlalchemy.sql.elements import ColumnElement

from db.tables import Run

OPERATORS = ("=", "==", "!=", ">", ">=", "<", "<=", "~")
ORDERING = (">", ">=", "<", "<=")
# Columns of the run by the names a filter uses.
FIELDS = {"status": Run.status, "strategy": Run.strategy, "model": Run.model, "dataset": Run.dataset,
          "kind": Run.kind, "host": Run.host, "note": Run.user_note}
NUMBER_FIELDS = {"id": Run.id, "world_size": Run.world_size}
FIGURES = {"best_val_acc": Run.best_val_acc, "images_per_s": Run.images_per_s, "throughput": Run.images_per_s,
           "training_time_s": Run.training_time_s, "train_time_s": Run.training_time_s,
           "epochs_time_s": Run.epochs_time_s, "epochs_done": Run.epochs_done}
CONFIG_PREFIXES = ("config.", "params.")
SUMMARY_PREFIXES = ("summary.", "metrics.")
_CLAUSE = re.compile(r"""\s*(?P<name>[A-Za-z_][\w./\-]*)\s*(?P<op>==|!=|>=|<=|=|>|<|~)\s*"""
                     r"""(?P<value>'[^']*'|"[^"]*"|[^\s,'"<>=!~]+)\s*""")
_JOINER = re.compile(r"\s*(,|&&|\band\b)\s*", re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")
MAX_LENGTH = 2000


def conditions(text: str, dialect: str) -> list[ColumnElement[bool]]:
    """The conditions ``text`` stands for (all must hold); [] for an empty filter. ValueError, in one line,
    for a malformed one."""
    text = (text or "").strip()
    if len(text) > MAX_LENGTH:
        raise ValueError(f"the filter is {len(text):,} characters long; at most {MAX_LENGTH:,} are read")
    found, at = [], 0
    while at < len(text):
        clause = _CLAUSE.match(text, at)
        if clause is None:
            raise ValueError(f"filter: cannot read {_excerpt(text, at)}: write NAME OP VALUE (lr > 0.01, strategy = ddp, "
                             f"best_val_acc >= 0.9), OP one of {' '.join(OPERATORS)}, joined by 'and'")
        found.append(_condition(clause["name"], clause["op"], clause["value"], dialect))
        at = clause.end()
        if at < len(text):
            joiner = _JOINER.match(text, at)
            if joiner is None or joiner.end() == len(text):
                raise ValueError(f"filter: expected 'and' (or a comma) before {_excerpt(text, at)}")
            at = joiner.end()
    return found


def _excerpt(text: str, at: int) -> str:
    rest = text[at:].strip()
    return repr(rest[:40] + ("…" if len(rest) > 40 else ""))


def _condition(name: str, op: str, raw: str, dialect: str) -> ColumnElement[bool]:
    quoted = raw[:1] in "'\"" and raw[-1:] == raw[:1] and len(raw) >= 2
    value: Any = raw[1:-1] if quoted else raw
    number = None if quoted or not _NUMBER.match(value) else float(value)
    op = "=" if op == "==" else op
    key = name.lower()
    if key in ("tag", "tags"):
        return _tag(name, op, value)
    for prefix in SUMMARY_PREFIXES:
        if key.startswith(prefix) and key[len(prefix):] in FIGURES:
            key = key[len(prefix):]
    if key in FIGURES or key in NUMBER_FIELDS:
        column = FIGURES.get(key, NUMBER_FIELDS.get(key))
        if number is None:
            raise ValueError(f"filter: {name} is a number; {raw!r} is not one (write {name} {op} 0.9)")
        return _compare(column, op, number, name)
    if key in FIELDS:
        if op in ORDERING:
            raise ValueError(f"filter: {name} is text: compare it with =, != or ~ (contains), not {op}")
        return _compare(FIELDS[key], op, value, name)
    if any(key.startswith(prefix) for prefix in SUMMARY_PREFIXES):
        column, path = Run.summary, name.split(".", 1)[1]
    elif any(key.startswith(prefix) for prefix in CONFIG_PREFIXES):
        column, path = Run.config, name.split(".", 1)[1]
    else:
        column, path = Run.config, name
    keys = [part for part in path.split(".") if part] if column is Run.config else [path]
    if not keys:
        raise ValueError(f"filter: {name!r} names no field; write config.KEY or summary.KEY")
    as_number, as_text = _json_values(column, keys, dialect)
    if number is not None and op != "~":
        return _compare(as_number, op, number, name)
    if op in ORDERING:
        raise ValueError(f"filter: {raw!r} is not a number: compare text with =, != or ~ (contains), not {op}")
    return _compare(as_text, op, value, name)


def _compare(column, op: str, value: Any, name: str) -> ColumnElement[bool]:
    if op == "~":
        return cast(column, Text).ilike(f"%{_like_escaped(str(value))}%", escape="\\")
    if op == "!=":
        return or_(column != value, column.is_(None))  # a run without the field is one that differs
    return {"=": column == value, ">": column > value, ">=": column >= value, "<": column < value,
            "<=": column <= value}[op]


def _tag(name: str, op: str, value: str) -> ColumnElement[bool]:
    """Tags are a JSON list per run: a tag is found as its JSON text in the list's."""
    if op in ORDERING:
        raise ValueError(f"filter: {name} is text: compare it with =, != or ~ (contains), not {op}")
    listed = cast(Run.tags, Text)
    if op == "~":
        return listed.ilike(f"%{_like_escaped(value)}%", escape="\\")
    found = listed.like(f"%{_like_escaped(json.dumps(value))}%", escape="\\")
    return not_(found) if op == "!=" else found


def tagged(tags: tuple[str, ...]) -> ColumnElement[bool]:
    """Runs carrying any of ``tags`` (the Tag picker)."""
    return or_(*(_tag("tag", "=", tag) for tag in tags))


def _json_values(column, keys: list[str], dialect: str) -> tuple[ColumnElement, ColumnElement]:
    """(number or NULL, text or NULL) of the field at ``keys`` in a JSON column: a field of another type, or
    none, is NULL, so a filter never fails on a run whose field holds something else."""
    if dialect == "postgresql":
        node = func.json_extract_path(column, *keys)
        text = func.json_extract_path_text(column, *keys)
        return (case((func.json_typeof(node) == "number", cast(text, Float)), else_=None),
                case((func.json_typeof(node) == "string", text), else_=None))
    path = "$" + "".join(f'."{key}"' for key in keys)
    kind, found = func.json_type(column, literal(path)), func.json_extract(column, literal(path))
    return (case((kind.in_(("integer", "real")), found), else_=None), case((kind == "text", found), else_=None))


def _like_escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
