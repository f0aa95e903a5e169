"""Every path a user gives is made absolute against the folder they stand in, as the command line first reads it;
names (built-in datasets, timm models, module paths) stay as given."""

from __future__ import annotations

from pathlib import Path

from contract.config import RunConfig
from contract.fields import BUILTIN_DATASETS
from contract.user_paths import absolute_model, user_path, with_absolute_paths


def test_a_relative_path_is_made_absolute_against_the_folder_given(tmp_path):
    here = str(tmp_path / "work")
    assert user_path("data/x", here) == f"{tmp_path}/work/data/x"
    assert user_path("../data/./x/", here) == f"{tmp_path}/data/x"
    assert user_path("/srv/data", here) == "/srv/data"
    assert user_path("~/data", here) == str(Path.home() / "data")


def test_names_stay_names_and_paths_become_absolute(tmp_path):
    here = str(tmp_path)
    for name in BUILTIN_DATASETS:
        assert with_absolute_paths(RunConfig(dataset=name), here).dataset == name
    config = with_absolute_paths(RunConfig(dataset="../leaves/train.csv", model="nets/my_net.py:Net"), here)
    assert config.dataset == f"{tmp_path.parent}/leaves/train.csv" and config.model == f"{tmp_path}/nets/my_net.py:Net"
    assert absolute_model("resnet18", here) == "resnet18"
    assert absolute_model("torchvision.models:resnet18", here) == "torchvision.models:resnet18"
    assert absolute_model("my_net.py:Net", here) == f"{tmp_path}/my_net.py:Net"
    assert with_absolute_paths(RunConfig(), here) == RunConfig()


def test_dot_dot_after_a_symbolic_link_is_where_the_system_goes(tmp_path):
    """``data/../x``, with ``data`` a link to another disk's folder, is the x beside that folder, as ``ls`` and
    ``open`` read it (it was the x beside the link); links a ``..`` does not leave are kept as typed."""
    (tmp_path / "disk" / "datasets" / "flowers").mkdir(parents=True)
    (tmp_path / "disk" / "other").mkdir()
    here = tmp_path / "work"
    here.mkdir()
    (here / "data").symlink_to(tmp_path / "disk" / "datasets")
    assert user_path("data/../other", str(here)) == f"{tmp_path}/disk/other"
    assert Path(user_path("data/../other", str(here))).samefile(here / "data/../other")
    assert user_path("data/flowers", str(here)) == f"{here}/data/flowers"  # kept as typed
    assert user_path("data/flowers/../flowers", str(here)) == f"{tmp_path}/disk/datasets/flowers"
    assert user_path("../work/data", str(here)) == f"{here}/data"
