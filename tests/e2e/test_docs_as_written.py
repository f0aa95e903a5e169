"""The docs' own examples, run as written: every ```console and ```python block of README.md and docs/*.md (found
when the tests are collected, so a block added later is run too), from a temporary folder that is not the
checkout, with a fresh PARALLAX_HOME and HOME, one shell per document from its top (its folder and exports carry
from block to block). Where a block shows output, the output is checked. A block that needs what this machine lacks
(``needs=gpu`` ...) is listed as a skipped test with the reason; the convention is in docs/HOW_IT_IS_BUILT.md.

    .venv/bin/python -m pytest tests/e2e/test_docs_as_written.py -q
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.doc_blocks import NEEDS, RUN, DocSession, read_blocks
from tests.support import ROOT

pytestmark = pytest.mark.processes

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = {doc: read_blocks(doc) for doc in DOCS}


def unmet(needs: tuple[str, ...]) -> str | None:
    """Why a block with ``needs`` cannot run here, or None."""
    for need in needs:
        if need == "gpu":
            import torch

            if not torch.cuda.is_available():
                return NEEDS["gpu"]
        elif need == "slurm":
            from tests.slurm_cluster import unavailable_reason

            if (reason := unavailable_reason()) is not None:
                return f"{NEEDS['slurm']}: {reason}"
        else:
            return NEEDS[need]
    return None


def doc_env(folder: Path) -> dict[str, str]:
    """A user's environment: the installed ``parallax`` and ``python`` first on the PATH, a home and a
    PARALLAX_HOME of its own, nothing of the suite's PARALLAX_* settings but its shared dataset folder."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PARALLAX_", "PYTEST_")) and name not in ("PYTHONPATH", "SLURM_CONF")}
    (folder / "home").mkdir()
    env.update(HOME=str(folder / "home"), PARALLAX_HOME=str(folder / "parallax-home"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    if "PARALLAX_DATA_DIR" in os.environ:  # digits decoded once per suite, as every test's home shares it
        env["PARALLAX_DATA_DIR"] = os.environ["PARALLAX_DATA_DIR"]
    return env


@pytest.mark.parametrize("doc", [doc for doc in DOCS if any(b.language in RUN for b in BLOCKS[doc])],
                         ids=lambda doc: str(doc.relative_to(ROOT)))
def test_the_docs_examples_run_as_written(doc, tmp_path, request):
    env = doc_env(tmp_path)
    work = tmp_path / "home" / "work"  # where the user stands: not the checkout
    work.mkdir()
    session = DocSession(work, env)
    try:
        for index, block in enumerate(BLOCKS[doc]):
            if block.language not in RUN or unmet(block.needs) is not None:
                continue
            if "slurm" in block.needs:
                session.env = {**env, **request.getfixturevalue("slurm_cluster").env}
            session.run(block, index)
    finally:
        stop_what_is_left(tmp_path / "parallax-home")


def stop_what_is_left(home: Path) -> None:
    """A run a document left going (it failed half-way) is cancelled, as its reader would."""
    from db import dispose_engines, make_engine, store
    from db.run_state import ACTIVE_STATUSES
    from trainer_backend.control.lifecycle import cancel

    database = home / "parallax.db"
    if not database.exists():
        return
    url = f"sqlite:///{database}"
    for run in store.list_runs(make_engine(url)):
        if run.status in ACTIVE_STATUSES:
            cancel(run.id, db_url=url)
    dispose_engines()


# Only the blocks this machine cannot run: the others ran with the rest of their document, above.
@pytest.mark.parametrize("block", [block for doc in DOCS for block in BLOCKS[doc]
                                   if block.needs and block.language in RUN and unmet(block.needs) is not None],
                         ids=lambda block: f"{block.path.relative_to(ROOT)}:{block.line}")
def test_a_block_that_needs_more_than_this_machine_is_listed_with_the_reason(block):
    pytest.skip(unmet(block.needs))
