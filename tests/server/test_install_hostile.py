"""Client config files and CLI input a hostile-input pass found mishandled: a lone surrogate escape or a number JSON
cannot write back in a client's JSON file, Unicode line separators and CRLF endings in Codex's TOML, control
characters in a --remote URL, --config and --log-level dropped from the installed entry, another loopback address
refused as a foreign Host, and path names the system refuses to look at."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpubox import cli
from gpubox.errors import ConfigError, InvalidInputError
from gpubox.install import config_path, install
from gpubox.urls import check_http_url
from tests.server.test_install import SERVER, _backups, _cli


def test_a_lone_surrogate_escape_in_a_clients_json_is_kept_as_it_was(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path / "home")}
    path = config_path("claude-code", env, "linux")
    path.parent.mkdir(parents=True)
    path.write_text('{"history": ["cut \\ud83d emoji", "\\u00e9t\\u00e9"], "mcpServers": {}}\n')
    install("claude-code", SERVER, env, "linux")  # UnicodeEncodeError before, with a backup left behind
    text = path.read_text(encoding="utf-8")
    assert "\\ud83d" in text and "été" in text, text
    assert json.loads(text)["history"][0] == "cut \ud83d emoji" and "gpubox" in json.loads(text)["mcpServers"]


@pytest.mark.parametrize("number", ["1e400", "-1e999", "NaN", "Infinity"])
def test_a_number_json_cannot_write_back_is_refused_and_the_file_left_alone(tmp_path: Path, number: str) -> None:
    env = {"HOME": str(tmp_path / "home")}
    path = config_path("cursor", env, "linux")
    path.parent.mkdir(parents=True)
    text = f'{{"big": {number}, "mcpServers": {{}}}}\n'
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"holds the number {number}.*not changed"):
        install("cursor", SERVER, env, "linux")  # 1e400 was written back as Infinity: no longer JSON
    assert path.read_text() == text and _backups(path) == []


def test_codex_toml_with_unicode_line_separators_and_crlf_endings_is_edited_in_place(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path / "home")}
    path = config_path("codex", env, "linux")
    path.parent.mkdir(parents=True)
    text = 'model = "o3"  # see docs\u2028section 2\r\ntitle = "a\u0085b"\r\n'
    text += '\r\n[mcp_servers.other]\r\ncommand = "x"\r\n'
    path.write_bytes(text.encode())
    install("codex", SERVER, env, "linux")  # refused before ("a form gpubox does not rewrite"): no gpubox entry
    written = path.read_bytes().decode()
    assert written.startswith(text) and "[mcp_servers.gpubox]\r\n" in written, written
    assert written.count("\n") == written.count("\r\n"), written  # CRLF kept, the added lines too


@pytest.mark.parametrize("url", ["http://127.0.0.1:8765/mcp\n[evil]", "http://127.0.0.1:8765/m\tcp", "http://a b/"])
def test_a_url_with_a_control_character_or_a_space_is_refused(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InvalidInputError, match="space or a control character"):
        check_http_url(url, "--remote", "e.g. http://127.0.0.1:8765/mcp")
    home = tmp_path / "home"
    assert _cli(monkeypatch, home, "install", "--client", "codex", "--remote", url) == 2  # was written as given
    assert "space or a control character" in capsys.readouterr().err
    assert not config_path("codex", {"HOME": str(home)}, "linux").exists()


def test_install_carries_the_config_file_and_the_log_level(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my.toml").write_text("infer_max_resident = 4\n")
    state = ["--state-dir", str(tmp_path / "state"), "--allowed-root", str(tmp_path)]
    argv = ["install", "--client", "cursor", "--print", "--config", "my.toml", "--log-level", "ERROR", *state]
    assert _cli(monkeypatch, tmp_path / "home", *argv) == 0
    env = json.loads(capsys.readouterr().out)["mcpServers"]["gpubox"]["env"]
    assert env["GPUBOX_CONFIG"] == str(tmp_path / "my.toml") and env["GPUBOX_LOG_LEVEL"] == "ERROR", env
    assert _cli(monkeypatch, tmp_path / "home", "install", "--client", "cursor", "--print", *state) == 0
    plain = json.loads(capsys.readouterr().out)["mcpServers"]["gpubox"]["env"]
    assert "GPUBOX_CONFIG" not in plain and "GPUBOX_LOG_LEVEL" not in plain, plain


@pytest.mark.parametrize("host", ["127.0.0.2", "127.1.2.3"])
def test_another_loopback_address_accepts_its_own_url(tmp_path: Path, host: str) -> None:
    from gpubox.http import security_settings
    from gpubox.httpguard import matches
    from gpubox.settings import Settings

    sec = security_settings(Settings.load(state_dir=tmp_path / "s", host=host, port=18766))
    assert matches(f"{host}:18766", sec.allowed_hosts, origin=False)  # 421 "not allowed" before
    assert matches(f"http://{host}:18766", sec.allowed_origins, origin=True)


@pytest.mark.parametrize("flag", ["--config", "--allowed-root", "--state-dir"])
def test_a_path_name_the_system_refuses_is_one_line_not_a_traceback(
    tmp_path: Path, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    long = str(tmp_path / ("a" * 300))
    assert cli.main(["doctor", flag, long]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpubox: ") and "File name too long" in err and "Traceback" not in err, err


@pytest.mark.parametrize("body", ["huge-int", "deep-json"])
def test_a_client_file_python_cannot_read_back_is_refused_unchanged(tmp_path: Path, body: str) -> None:
    env = {"HOME": str(tmp_path / "home")}
    path = config_path("cursor", env, "linux")
    path.parent.mkdir(parents=True)
    inner = "1" + "0" * 5000 if body == "huge-int" else "[" * 100_000 + "]" * 100_000
    text = f'{{"x": {inner}, "mcpServers": {{}}}}\n'
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"cannot be read back as it is.*not changed"):
        install("cursor", SERVER, env, "linux")  # a traceback before (ValueError / RecursionError)
    assert path.read_text() == text and _backups(path) == []


def test_a_codex_file_nested_past_the_interpreters_limit_is_refused_unchanged(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path / "home")}
    path = config_path("codex", env, "linux")
    path.parent.mkdir(parents=True)
    text = "x = " + "[" * 100_000 + "]" * 100_000 + "\n"
    path.write_text(text)
    with pytest.raises(ConfigError, match="nested too deeply"):
        install("codex", SERVER, env, "linux")
    assert path.read_text() == text


def test_a_state_dir_that_is_not_utf8_is_refused_not_written_as_another_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Python reads the byte 0xff of a path as a lone surrogate; written as "\\udcff" in a client's JSON, the
    client (Node) handed the server U+FFFD instead: another state dir, after a reported success."""
    odd = str(tmp_path) + "/st\udcff"
    home = tmp_path / "home"
    assert _cli(monkeypatch, home, "install", "--client", "cursor", "--state-dir", odd) == 2
    err = capsys.readouterr().err
    assert "GPUBOX_STATE_DIR" in err and "not UTF-8" in err, err
    assert not config_path("cursor", {"HOME": str(home)}, "linux").exists()
