"""Lock files are opened in the state dir only: a planted symlink had gpubox create the file it points at outside
(ledger.lock -> /elsewhere), and a folder in a lock file's place failed every tool that takes the lock with an
unexpected IsADirectoryError."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpubox.errors import GpuboxError
from gpubox.filelock import exclusive, try_exclusive


def test_a_symlinked_lock_file_is_refused_and_nothing_is_created_outside(tmp_path: Path) -> None:
    outside = tmp_path / "outside" / "created.lock"
    outside.parent.mkdir()
    lock = tmp_path / "state" / "box" / "ledger.lock"
    lock.parent.mkdir(parents=True)
    lock.symlink_to(outside)  # dangling: open(..., "a") created it
    with pytest.raises(GpuboxError, match="cannot be opened"), exclusive(lock):
        pass
    with pytest.raises(GpuboxError, match="cannot be opened"):
        try_exclusive(lock)
    assert not outside.exists()


def test_a_folder_in_a_lock_files_place_is_one_clear_error(tmp_path: Path) -> None:
    lock = tmp_path / "ledger.lock"
    lock.mkdir()
    refused = r"ledger\.lock cannot be opened .*remove whatever is in its place"
    with pytest.raises(GpuboxError, match=refused), exclusive(lock):
        pass


def test_locks_still_exclude_each_other(tmp_path: Path) -> None:
    lock = tmp_path / "run.lock"
    held = try_exclusive(lock)
    assert held is not None and try_exclusive(lock) is None
    held.close()
    again = try_exclusive(lock)
    assert again is not None
    again.close()
