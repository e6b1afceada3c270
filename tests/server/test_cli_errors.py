"""Bad files and URLs given to the CLI end in one `gpubox:` line naming them, exit status 2, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpubox import cli


def _run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    home = tmp_path / "home"
    for var, value in {"HOME": home, "XDG_CONFIG_HOME": home / ".config", "GPUBOX_STATE_DIR": tmp_path / "s"}.items():
        monkeypatch.setenv(var, str(value))
    for var in ("CODEX_HOME", "APPDATA", "GPUBOX_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    assert cli.main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpubox: ") and "Traceback" not in err
    return err


@pytest.mark.parametrize(("client", "where"), [("cursor", ".cursor/mcp.json"), ("codex", ".codex/config.toml")])
@pytest.mark.parametrize("command", ["install", "uninstall"])
def test_a_client_config_that_is_not_utf8_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    client: str,
    where: str,
    command: str,
) -> None:
    path = tmp_path / "home" / where
    path.parent.mkdir(parents=True)
    path.write_bytes('{"mcpServers": {}}'.encode("utf-16"))
    err = _run(monkeypatch, tmp_path, capsys, command, "--client", client)
    assert str(path) in err and "not UTF-8" in err
    assert path.read_bytes() == '{"mcpServers": {}}'.encode("utf-16")


@pytest.mark.parametrize(
    ("content", "needle"), [(b'port = 8765\nhost = "127.0.0.1\n', "not valid TOML"), (b"\xff\xfe\x00", "not UTF-8")]
)
def test_doctor_with_a_bad_toml_config_names_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, needle: str
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_bytes(content)
    err = _run(monkeypatch, tmp_path, capsys, "doctor", "--config", str(bad))
    assert str(bad) in err and needle in err


@pytest.mark.parametrize(
    "url", ["http://[::1/mcp", "http://127.0.0.1:99999/mcp", "http://127.0.0.1:port/mcp", "http://:8765/mcp"]
)
def test_install_remote_with_a_bad_url_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str
) -> None:
    err = _run(monkeypatch, tmp_path, capsys, "install", "--client", "cursor", "--remote", url)
    assert repr(url) in err and "http://127.0.0.1:8765/mcp" in err
    assert not (tmp_path / "home" / ".cursor" / "mcp.json").exists()


@pytest.mark.parametrize("kind", ["file", "unmakeable"])
def test_an_unusable_state_dir_is_one_line_naming_it_and_doctor_lists_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    state = blocker if kind == "file" else blocker / "state"  # a folder cannot be made under a file
    err = _run(monkeypatch, tmp_path, capsys, "call", "box_plan", "--state-dir", str(state))
    assert f"state_dir {state} cannot be made" in err and "GPUBOX_STATE_DIR" in err, err
    assert cli.main(["doctor", "--state-dir", str(state), "--allowed-root", str(tmp_path / "gone")]) == 0
    out = capsys.readouterr().out
    assert "problems:" in out and f"state dir {state}" in out and f"allowed root {tmp_path / 'gone'} does not" in out


@pytest.mark.parametrize("command", [["install", "--client", "cursor", "--print"], ["client-config", "cursor"]])
def test_a_client_config_naming_an_unknown_tool_is_refused_before_it_is_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    err = _run(monkeypatch, tmp_path, capsys, *command, "--tools", "gpu,bogus")
    assert "tools: unknown bogus" in err, err
    assert not (tmp_path / "home" / ".cursor").exists()


def test_an_empty_server_name_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        cli.main(["install", "--client", "cursor", "--name", " ", "--print"])
    assert ended.value.code == 2 and "server name is empty" in capsys.readouterr().err
