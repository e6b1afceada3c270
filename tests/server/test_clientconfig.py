"""`gpubox client-config` snippets: the command, environment and URL they write."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from gpubox import clientconfig
from gpubox.settings import Settings


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


def test_cuda_visible_devices_is_passed_only_when_the_installer_has_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings.load(state_dir=tmp_path / "s", allowed_roots=[tmp_path])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert "CUDA_VISIBLE_DEVICES" not in clientconfig.stdio_env(settings)  # every GPU stays visible
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")
    assert clientconfig.stdio_env(settings)["CUDA_VISIBLE_DEVICES"] == "1,2"


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("::1", "http://[::1]:18803/mcp"),
        ("", "http://127.0.0.1:18803/mcp"),
        ("::", "http://[::1]:18803/mcp"),  # asyncio binds "::" IPv6-only: 127.0.0.1 was refused
        ("gpu-box.internal", "http://gpu-box.internal:18803/mcp"),
    ],
)
def test_the_remote_url_is_one_a_client_can_connect_to(tmp_path: Path, host: str, url: str) -> None:
    settings = Settings.load(state_dir=tmp_path / "s", host=host, port=18803)
    cfg, note = clientconfig.snippet("remote", settings)
    assert cfg["mcpServers"]["gpubox"]["url"] == url
    assert url.removesuffix("/mcp") + "/sse" in note
