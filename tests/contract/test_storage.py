"""One folder check for every export (--csv, --profile-dir): a file where the folder or a folder above it
should be is refused in one line naming the flag, before anything is written.

    .venv/bin/python -m pytest tests/contract/test_storage.py -q
"""

from __future__ import annotations

import pytest

from contract.storage import check_export_dir


@pytest.mark.parametrize("flag", ["--csv", "--profile-dir"])
def test_a_file_as_the_folder_or_above_it_is_refused_naming_the_flag(flag, tmp_path):
    blocker = tmp_path / "taken"
    blocker.write_text("keep me")
    with pytest.raises(ValueError) as refused:
        check_export_dir(blocker, flag)
    assert str(refused.value) == (f"{flag} {blocker} is an existing file, not a folder: give a folder "
                                  "(it is created if missing)")
    with pytest.raises(ValueError) as refused:
        check_export_dir(blocker / "out" / "deeper", flag)
    assert f"{flag} {blocker / 'out' / 'deeper'} is inside {blocker}, which is a file" in str(refused.value)
    assert blocker.read_text() == "keep me" and not (tmp_path / "out").exists()


def test_a_missing_or_existing_folder_is_taken(tmp_path):
    check_export_dir(tmp_path / "new" / "out", "--csv")
    check_export_dir(tmp_path, "--csv")
    assert not (tmp_path / "new").exists()  # checked, not made
