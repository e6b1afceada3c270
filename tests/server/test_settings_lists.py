"""List settings given as one string (env vars, TOML strings): paths split on os.pathsep, hosts on commas."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpubox.clientconfig import stdio_env
from gpubox.settings import Settings


def test_a_root_with_a_comma_round_trips_through_client_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proj = tmp_path / "proj,v2"
    sibling = tmp_path / "v2"  # what a comma split would have allowed, relative to the working directory
    proj.mkdir()
    sibling.mkdir()
    monkeypatch.chdir(tmp_path)
    written = stdio_env(Settings.load(state_dir=tmp_path / "s", allowed_roots=[proj], model_dirs=[proj]))
    monkeypatch.setenv("GPUBOX_ALLOWED_ROOTS", written["GPUBOX_ALLOWED_ROOTS"])
    monkeypatch.setenv("GPUBOX_MODEL_DIRS", written["GPUBOX_MODEL_DIRS"])
    back = Settings.load(state_dir=tmp_path / "s")
    assert back.allowed_roots == [proj.resolve()]
    assert back.model_dirs == [proj.resolve()]


def test_a_plain_path_string_splits_on_pathsep_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tmp_path / "a,1", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    monkeypatch.setenv("GPUBOX_ALLOWED_ROOTS", f"{a}{os.pathsep}{b}")
    assert Settings.load(state_dir=tmp_path / "s").allowed_roots == [a.resolve(), b.resolve()]


def test_an_old_comma_separated_root_list_is_refused_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUBOX_ALLOWED_ROOTS", f"{tmp_path},{tmp_path}")
    with pytest.raises(ValidationError, match="not commas"):
        Settings.load(state_dir=tmp_path / "s")


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("ALLOWED_HOSTS", "gpu-box.internal:*", ["gpu-box.internal:*"]),
        ("ALLOWED_HOSTS", "gpu-box.internal:*, [::1]:8765", ["gpu-box.internal:*", "[::1]:8765"]),
        ("ALLOWED_ORIGINS", "https://gpu-box.internal", ["https://gpu-box.internal"]),
        ("ALLOWED_ORIGINS", '["https://a:1", "http://b"]', ["https://a:1", "http://b"]),
        ("TOOLS", "gpu,search", ["gpu", "search"]),
    ],
)
def test_host_and_origin_strings_split_on_commas_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str, value: str, expected: list[str]
) -> None:
    monkeypatch.setenv(f"GPUBOX_{field}", value)
    assert getattr(Settings.load(state_dir=tmp_path / "s"), field.lower()) == expected


def test_toml_host_and_origin_strings_are_kept_whole(tmp_path: Path) -> None:
    cfg = tmp_path / "gpubox.toml"
    cfg.write_text('allowed_hosts = "gpu-box.internal:*"\nallowed_origins = "https://gpu-box.internal"\n')
    s = Settings.load(cfg, state_dir=tmp_path / "s")
    assert (s.allowed_hosts, s.allowed_origins) == (["gpu-box.internal:*"], ["https://gpu-box.internal"])


def test_a_broken_json_list_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUBOX_ALLOWED_HOSTS", '["a"')
    with pytest.raises(ValidationError, match="not a valid JSON list"):
        Settings.load(state_dir=tmp_path / "s")


@pytest.mark.parametrize("value", ["gpu-box:gpu-box.lan", "a.example,b.example:web"])
def test_an_old_colon_separated_host_list_is_refused_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    # ':' separated hosts before; kept whole it would be one entry that matches no request, silently
    monkeypatch.setenv("GPUBOX_ALLOWED_HOSTS", value)
    with pytest.raises(ValueError, match="separate hosts with ','"):
        Settings.load(state_dir=tmp_path / "s")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("[::1]", ["[::1]"]), ("[::1]:*,gpu-box:8765", ["[::1]:*", "gpu-box:8765"]), ('["[fe80::1]:*"]', ["[fe80::1]:*"])],
)
def test_ipv6_hosts_are_hosts_not_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, expected: list[str]
) -> None:
    monkeypatch.setenv("GPUBOX_ALLOWED_HOSTS", value)
    assert Settings.load(state_dir=tmp_path / "s").allowed_hosts == expected


@pytest.mark.parametrize("value", ['["", "/tmp"]', '["  "]'])
def test_an_empty_root_entry_is_refused_not_read_as_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.chdir("/")  # where MCP hosts often start servers: '' would have allowed the whole filesystem
    monkeypatch.setenv("GPUBOX_ALLOWED_ROOTS", value)
    with pytest.raises(ValidationError, match="empty entry"):
        Settings.load(state_dir=tmp_path / "s")
    monkeypatch.delenv("GPUBOX_ALLOWED_ROOTS")
    with pytest.raises(ValidationError, match="empty entry"):
        Settings.load(state_dir=tmp_path / "s", model_dirs=[str(tmp_path), ""])


def test_a_blank_roots_variable_is_refused_rather_than_leaving_no_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for blank in (" ", os.pathsep, f" {os.pathsep} "):
        monkeypatch.setenv("GPUBOX_ALLOWED_ROOTS", blank)
        with pytest.raises(ValidationError, match="set but names no directory; unset it for the default"):
            Settings.load(state_dir=tmp_path / "s")


def test_an_empty_path_flag_is_refused_by_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    from gpubox.cli import main

    with pytest.raises(SystemExit) as ended:
        main(["doctor", "--allowed-root", ""])
    assert ended.value.code == 2 and "empty path" in capsys.readouterr().err
