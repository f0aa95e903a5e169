"""Every fenced block of README.md and docs/*.md says what it is: commands (```console), a script (```python), or
a display (```text, ```toml, ```json), so that the docs-as-tests harness runs every example a user would type and
none slips by under a fence it does not read (docs/HOW_IT_IS_BUILT.md, "Docs that run").

    .venv/bin/python -m pytest tests/project/test_docs_fences.py -q
"""

from __future__ import annotations

from tests.doc_blocks import commands, fence_problem, output_problem, read_blocks
from tests.support import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_fence_says_whether_it_runs():
    blocks = [block for doc in DOCS for block in read_blocks(doc)]
    assert len(blocks) > 30
    problems = [problem for block in blocks if (problem := fence_problem(block)) is not None]
    assert not problems, "\n".join(problems)


def test_every_command_of_a_console_block_names_the_command_as_users_type_it():
    typed = [(block.where, command) for doc in DOCS for block in read_blocks(doc) if block.language == "console"
             for command, _ in commands(block)]
    assert typed
    old_name = [f"{where}: {command}" for where, command in typed if "python -m trainer_backend" in command]
    assert not old_name, "`parallax` is the command's one name:\n" + "\n".join(old_name)


def test_shown_output_is_matched_line_by_line_with_dots_for_any_text():
    printed = "run_id=3 ddp on cpu,cpu: resnet18\nepoch 1/1  train_loss 2.1  671 img/s\nrun_id=3 status=completed\n"
    assert output_problem(["...", "run_id=3 status=completed"], printed) is None
    assert output_problem(["epoch 1/1 ... img/s", "run_id=... status=completed"], printed) is None
    assert "status=failed" in output_problem(["run_id=3 status=failed"], printed)
    assert output_problem(["run_id=3 status=completed", "epoch 1/1 ..."], printed) is not None  # in order
