"""The command line reads every path a user gives against the folder it runs in: its flags, the fields of its
--config file, the images to predict and the folders to export to (contract/user_paths.py)."""

from __future__ import annotations

import json

from trainer_backend.control.cli import build_parser, config_from_args


def test_the_command_line_resolves_its_flags_and_its_config_files_paths_where_it_runs(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    (work / "run.json").write_text(json.dumps({"dataset": "../data/leaves", "model": "my_net.py:Net"}))
    monkeypatch.chdir(work)
    args = build_parser().parse_args(["run", "--config", "run.json"])
    assert args.config == work / "run.json"
    config = config_from_args(args)
    assert config.dataset == f"{tmp_path}/data/leaves" and config.model == f"{work}/my_net.py:Net"
    flags = config_from_args(build_parser().parse_args(["launch", "--dataset", "./leaves", "--model", "resnet18"]))
    assert flags.dataset == f"{work}/leaves" and flags.model == "resnet18"
    predict = build_parser().parse_args(["predict", "7", "photo.png", "../b.png"])
    assert predict.images == [work / "photo.png", tmp_path / "b.png"]
    assert build_parser().parse_args(["predict", "7", "--folder", "held"]).folder == work / "held"
    export = build_parser().parse_args(["export", "7", "--csv", "out", "--profile-dir", "prof"])
    assert (export.csv, export.profile_dir) == (work / "out", work / "prof")
    assert build_parser().parse_args(["sweep", "--strategies", "single", "--report", "r.html"]).report == work / "r.html"
