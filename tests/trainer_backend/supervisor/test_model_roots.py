"""What the dashboard may run as your own model: a class or function defined in a file or module inside the
model folders; never a file outside them (by path, `..` or a link), never a module of the standard library or an
installed package, never a name an allowed file merely imports. Read, never imported.

    .venv/bin/python -m pytest tests/trainer_backend/supervisor/test_model_roots.py -q
"""

from __future__ import annotations

import sys

import pytest

from contract.model_source import ModelError
from trainer_backend.supervisor.model_roots import check_model_allowed, model_roots

NET = '''
import os
from os import system
import torch.nn as nn
from torch import load as loader


class Net(nn.Module):
    pass


def make_net(width=4):
    return Net()


if os.environ.get("NEVER"):
    class Maybe(nn.Module):
        pass

Rebound = make_net


def Twice():
    return Net()


Twice = system

for Looped in (make_net,):
    pass


def rebinds():
    global make_later
    make_later = system


def make_later():
    return Net()
'''


@pytest.fixture
def models(tmp_path, monkeypatch):
    root = tmp_path / "models"
    (root / "pkg").mkdir(parents=True)
    (root / "mynet.py").write_text(NET)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "nets.py").write_text(NET)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "theirs.py").write_text(NET)
    (root / "linked.py").symlink_to(outside / "theirs.py")
    monkeypatch.setenv("PARALLAX_MODEL_ROOTS", str(root))
    monkeypatch.syspath_prepend(str(root))
    return root, outside


@pytest.mark.parametrize("name", ["resnet18", "efficientnet_b0.ra_in1k", "parallax_sleeps_each_step"])
def test_a_timm_name_is_allowed(name, models):
    check_model_allowed(name)


@pytest.mark.parametrize("attr", ["Net", "make_net", "Maybe"])
def test_a_class_or_function_a_file_in_the_folders_defines_is_allowed(attr, models):
    root, _ = models
    check_model_allowed(f"{root}/mynet.py:{attr}")
    check_model_allowed(f"pkg.nets:{attr}")


@pytest.mark.parametrize("where", ["{outside}/theirs.py", "{root}/linked.py", "{root}/../outside/theirs.py"])
def test_a_file_outside_the_folders_is_refused_saying_how_to_allow_it(where, models):
    root, outside = models
    name = where.format(root=root, outside=outside) + ":Net"
    with pytest.raises(ModelError) as refused:
        check_model_allowed(name)
    text = str(refused.value)
    assert f"model {name!r} is not allowed from the dashboard" in text and f"outside the model folders ({root})" in text
    assert f"put the file in {root}, or add its folder to PARALLAX_MODEL_ROOTS" in text and "\n" not in text
    assert "the command line runs any model" in text
    if "linked" in where:
        assert f"it resolves to {outside / 'theirs.py'}" in text


@pytest.mark.parametrize("name", ["os:system", "subprocess:run", "shutil:rmtree", "builtins:exec", "torch:load",
                                  "importlib:import_module", "pkg_not_here:Net"])
def test_a_module_outside_the_folders_is_refused(name, models):
    with pytest.raises(ModelError, match=f"model {name!r} is not allowed from the dashboard: .* add its folder to "
                       "PARALLAX_MODEL_ROOTS"):
        check_model_allowed(name)


@pytest.mark.parametrize("attr, why", [
    ("os.system", "not an attribute reached through it"), ("Net.__init__", "not an attribute reached through it"),
    ("system", "must be a class or function that mynet.py defines itself"), ("loader", "defines itself"),
    ("os", "defines itself"), ("nn", "defines itself"), ("Rebound", "defines itself"), ("Looped", "defines itself"),
    ("Twice", "the file also binds Twice otherwise"), ("make_later", "the file also binds make_later otherwise"),
    ("missing", "defines itself"),
])
def test_a_name_an_allowed_file_only_imports_or_rebinds_is_refused(attr, why, models):
    root, _ = models
    with pytest.raises(ModelError, match=why):
        check_model_allowed(f"{root}/mynet.py:{attr}")
    with pytest.raises(ModelError, match="not an attribute reached through it|nets.py defines itself|also binds"):
        check_model_allowed(f"pkg.nets:{attr}")


def test_the_file_is_read_and_never_imported(models):
    root, _ = models
    marker = root.parent / "imported"
    (root / "loud.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass Net:\n    pass\n")
    check_model_allowed(f"{root}/loud.py:Net")
    check_model_allowed("loud:Net")
    assert not marker.exists() and "loud" not in sys.modules


def test_the_folders_default_to_the_home_s_models_and_may_be_several(parallax_home, monkeypatch, tmp_path):
    for unset in (None, "", ":"):
        monkeypatch.setenv("PARALLAX_MODEL_ROOTS", unset) if unset is not None else \
            monkeypatch.delenv("PARALLAX_MODEL_ROOTS", raising=False)
        assert model_roots() == [parallax_home / "models"]
    (parallax_home / "models").mkdir()
    (parallax_home / "models" / "a.py").write_text("def net():\n    pass\n")
    check_model_allowed(f"{parallax_home}/models/a.py:net")
    monkeypatch.setenv("PARALLAX_MODEL_ROOTS", f"{tmp_path / 'one'}:{tmp_path / 'two'}")
    assert model_roots() == [tmp_path / "one", tmp_path / "two"]
    with pytest.raises(ModelError, match=f"outside the model folders \\({tmp_path / 'one'}, {tmp_path / 'two'}\\)"):
        check_model_allowed(f"{parallax_home}/models/a.py:net")


def test_a_file_in_the_folders_that_is_not_python_source_is_refused(models):
    """Bytecode the folders hold (Python writes __pycache__/*.pyc beside each module it imports) is imported as
    readily as source, but cannot be read for what it defines: from it a form could reach anything the source
    imports (mynet.py's ``system``). Only .py files are read and run."""
    import py_compile

    root, _ = models
    compiled = py_compile.compile(str(root / "mynet.py"), cfile=str(root / "__pycache__" / "mynet.pyc"))
    plain_bytes = root / "plain.pyc"  # no NUL byte: the parser's error is a SyntaxError, not a ValueError
    plain_bytes.write_bytes(b"\xa7\r\r\n" + b"\x01" * 12 + b"\xe3system")
    for path in (compiled, plain_bytes):
        with pytest.raises(ModelError, match=f"model '{path}:system' is not allowed from the dashboard: {path} is not "
                                             "Python source"):
            check_model_allowed(f"{path}:system")
    (root / "mynet.pyc").write_bytes(plain_bytes.read_bytes())  # the module path finds bytecode too
    (root / "mynet.py").rename(root / "mynet.txt")
    with pytest.raises(ModelError, match="is not Python source"):
        check_model_allowed("mynet:system")


REBOUND_LATER = {
    "in-an-except-block": "class Net:\n    pass\n\n\ntry:\n    raise ValueError\nexcept ValueError:\n"
                          "    from os import system as Net\n",
    "in-a-match-case": "def Net():\n    pass\n\n\nmatch 1:\n    case 1:\n        from os import system as Net\n",
    "by-a-star-import-after-it": "def system(command):\n    pass\n\n\nfrom os import *\n",
    "in-a-decorator": "class Net:\n    pass\n\n\n@(Net := __import__('os').system).__class__\nclass Other:\n    pass\n",
}


@pytest.mark.parametrize("rebinding", REBOUND_LATER, ids=list(REBOUND_LATER))
def test_a_definition_the_file_rebinds_anywhere_at_its_top_level_is_refused(models, rebinding):
    root, _ = models
    (root / "rebound.py").write_text(REBOUND_LATER[rebinding])
    attr = "system" if "star" in rebinding else "Net"
    with pytest.raises(ModelError, match=f"{attr} must be a class or function that rebound.py defines itself .*"
                                         "the file also binds"):
        check_model_allowed(f"{root}/rebound.py:{attr}")


def test_a_star_import_before_the_definition_leaves_it_the_file_s_own(models):
    root, _ = models
    (root / "star_first.py").write_text("from os import *\n\n\ndef system(command):\n    pass\n")
    check_model_allowed(f"{root}/star_first.py:system")
