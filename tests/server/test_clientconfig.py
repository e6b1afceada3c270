"""`gpubox client-config` snippets: the command, environment and URL they write."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from gpubox import clientconfig


def test_the_python_command_is_the_venv_link_not_the_base_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(sys.executable)  # a venv's python links out to the base interpreter
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "not-the-script")])
    monkeypatch.setattr(sys, "executable", str(venv_python))
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert clientconfig.server_command() == (str(venv_python), ["-m", "gpubox", "serve"])
