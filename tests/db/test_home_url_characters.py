"""A PARALLAX_HOME (or PARALLAX_DATA_DIR) whose name holds characters a URL gives meaning to:
``?`` (a query), ``#`` (a fragment), ``%41`` (an escaped ``A``). The database is made inside the
home, under its real name, and nothing is written beside it.

    .venv/bin/python -m pytest tests/db/test_home_url_characters.py -q
"""

from __future__ import annotations

import os

import pytest
from sqlalchemy import make_url

import db
from db.connection import absolute_database_url, sqlite_file
from contract.environment import data_dir, database_url

ODD_NAMES = ["home?mode=ro", "home#part", "home%41b", "home%3Fx"]


@pytest.fixture(autouse=True)
def _close_engines():
    yield
    db.dispose_engines()


@pytest.mark.parametrize("name", ODD_NAMES)
def test_the_database_lands_inside_a_home_named_with_url_characters(tmp_path, monkeypatch, name):
    home = tmp_path / "place" / name
    monkeypatch.setenv("PARALLAX_HOME", str(home))
    monkeypatch.delenv("PARALLAX_DB_URL", raising=False)
    url = database_url()
    assert sqlite_file(make_url(url)) == home / "parallax.db"
    assert make_url(absolute_database_url(url)).database == str(home / "parallax.db")  # as a supervisor is handed it
    db.make_engine()
    assert (home / "parallax.db").is_file()
    assert sorted(os.listdir(tmp_path / "place")) == [name]  # nothing beside the home


@pytest.mark.parametrize("name", ODD_NAMES)
def test_a_data_dir_named_with_url_characters_is_used_as_named(tmp_path, monkeypatch, name):
    monkeypatch.setenv("PARALLAX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PARALLAX_DATA_DIR", str(tmp_path / name))
    assert data_dir() == tmp_path / name
    assert (tmp_path / name).is_dir()
