"""`gpubox install` / `uninstall`: each client's file, format and location, under a temporary HOME."""

from __future__ import annotations

import json
import os
import stat
import tomllib
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gpubox import cli
from gpubox.errors import ConfigError
from gpubox.install import CLIENTS, Client, Remote, Stdio, config_path, install, uninstall

SERVER = Stdio("/opt/gpubox/bin/gpubox", ["serve"], {"GPUBOX_STATE_DIR": "/srv/state", "HF_HUB_OFFLINE": "1"})
REMOTE = Remote("https://gpu-box.example:8765/mcp", "s3cret-token-0123456789", "/home/me/.gpubox-token")
KEY = {"claude-desktop": "mcpServers", "claude-code": "mcpServers", "cursor": "mcpServers", "vscode": "servers"}
T0 = datetime(2026, 1, 2, 3, 4, 5)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path / "home")}


def _servers(client: Client, path: Path) -> dict[str, Any]:
    if client == "codex":
        return tomllib.loads(path.read_text())["mcp_servers"]
    return json.loads(path.read_text())[KEY[client]]


def _backups(path: Path) -> list[Path]:
    return sorted(path.parent.glob(path.name + ".bak-*"))


def _seed(client: Client, path: Path) -> str:
    """A config with the user's own settings, another server and (TOML) comments; returns its text."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if client == "codex":
        text = (
            '# my codex settings\nmodel = "o3"\n\n[mcp_servers.docs]\ncommand = "npx"\nargs = ["-y", "docs-mcp"]\n'
            '\n# profiles below\n[profiles.fast]\nmodel = "o4-mini"\n'
        )
    else:
        other = {"command": "npx", "args": ["-y", "docs-mcp"]}
        text = json.dumps({"theme": "dark", KEY[client]: {"docs": other}, "zzz": [1, 2]}, indent=2) + "\n"
    path.write_text(text)
    return text


def test_config_paths_follow_each_clients_documentation() -> None:
    home = {"HOME": "/h"}
    linux = {c: str(config_path(c, home, "linux")) for c in CLIENTS}
    assert linux == {
        "claude-desktop": "/h/.config/Claude/claude_desktop_config.json",
        "claude-code": "/h/.claude.json",
        "cursor": "/h/.cursor/mcp.json",
        "vscode": "/h/.config/Code/User/mcp.json",
        "codex": "/h/.codex/config.toml",
    }
    mac = "/h/Library/Application Support"
    assert str(config_path("claude-desktop", home, "darwin")) == f"{mac}/Claude/claude_desktop_config.json"
    assert str(config_path("vscode", home, "darwin")) == f"{mac}/Code/User/mcp.json"
    win = {"HOME": "/h", "APPDATA": "/h/AppData/Roaming"}
    assert config_path("claude-desktop", win, "win32") == Path("/h/AppData/Roaming/Claude/claude_desktop_config.json")
    assert config_path("vscode", win, "win32") == Path("/h/AppData/Roaming/Code/User/mcp.json")
    assert config_path("vscode", {"HOME": "/h", "XDG_CONFIG_HOME": "/x"}, "linux") == Path("/x/Code/User/mcp.json")
    assert config_path("codex", {"HOME": "/h", "CODEX_HOME": "/c"}, "linux") == Path("/c/config.toml")


@pytest.mark.parametrize("client", CLIENTS)
def test_install_writes_the_entry_in_the_clients_format(client: Client, env: dict[str, str]) -> None:
    out = install(client, SERVER, env, "linux", now=T0)
    assert out.action == "written" and out.backup is None  # new file: nothing to back up
    entry = _servers(client, out.path)["gpubox"]
    assert entry["command"] == SERVER.command and entry["args"] == ["serve"] and entry["env"] == SERVER.env
    assert entry.get("type") == ("stdio" if client in ("claude-code", "vscode") else None)


@pytest.mark.parametrize("client", CLIENTS)
def test_second_install_is_up_to_date_and_makes_no_backup(client: Client, env: dict[str, str]) -> None:
    path = install(client, SERVER, env, "linux", now=T0).path
    before = path.read_bytes()
    again = install(client, SERVER, env, "linux", now=T0)
    assert again.action == "unchanged" and "up to date" in again.message(False)
    assert path.read_bytes() == before and _backups(path) == []


@pytest.mark.parametrize("client", CLIENTS)
def test_install_keeps_other_servers_and_backs_up_first(client: Client, env: dict[str, str]) -> None:
    path = config_path(client, env, "linux")
    original = _seed(client, path)
    out = install(client, SERVER, env, "linux", now=T0)
    assert out.backup is not None and out.backup.read_text() == original
    assert out.backup.name == f"{path.name}.bak-20260102-030405"
    assert set(_servers(client, path)) == {"docs", "gpubox"}
    if client == "codex":
        text = path.read_text()
        assert text.startswith(original)  # comments and other tables untouched, entry appended
    else:
        doc = json.loads(path.read_text())
        assert doc["theme"] == "dark" and doc["zzz"] == [1, 2]


@pytest.mark.parametrize("client", CLIENTS)
def test_uninstall_removes_only_gpubox(client: Client, env: dict[str, str]) -> None:
    path = config_path(client, env, "linux")
    original = _seed(client, path)
    install(client, SERVER, env, "linux", now=T0)
    out = uninstall(client, env, "linux", now=datetime(2026, 1, 2, 3, 4, 6))
    assert out.action == "removed" and out.backup is not None
    if client == "codex":
        assert path.read_text() == original  # byte for byte: the TOML edit leaves no trace
    else:
        assert json.loads(path.read_text()) == json.loads(original)
    gone = uninstall(client, env, "linux")
    assert gone.action == "absent" and len(_backups(path)) == 2  # nothing to remove: no write, no backup


@pytest.mark.parametrize("client", CLIENTS)
def test_print_writes_nothing(client: Client, env: dict[str, str]) -> None:
    path = config_path(client, env, "linux")
    original = _seed(client, path)
    out = install(client, SERVER, env, "linux", dry_run=True)
    assert out.action == "written" and "would write" in out.message(True)
    assert SERVER.command in out.preview and "gpubox" in out.preview
    assert path.read_text() == original and _backups(path) == []
    assert uninstall(client, env, "linux", dry_run=True).action == "absent"
    install(client, SERVER, env, "linux", now=T0)
    after = path.read_text()
    dry = uninstall(client, env, "linux", dry_run=True)
    assert dry.action == "removed" and path.read_text() == after and len(_backups(path)) == 1


@pytest.mark.parametrize("client", CLIENTS)
def test_malformed_file_is_refused_and_left_untouched(client: Client, env: dict[str, str]) -> None:
    path = config_path(client, env, "linux")
    path.parent.mkdir(parents=True)
    bad = 'model = "o3\n' if client == "codex" else '{"servers": {}, // a comment\n}'
    path.write_text(bad)
    with pytest.raises(ConfigError, match=r"not valid (JSON|TOML).*not changed"):
        install(client, SERVER, env, "linux")
    with pytest.raises(ConfigError, match="not changed"):
        uninstall(client, env, "linux")
    assert path.read_text() == bad and _backups(path) == []


def test_json_servers_that_is_not_an_object_is_refused(env: dict[str, str]) -> None:
    path = config_path("cursor", env, "linux")
    path.parent.mkdir(parents=True)
    path.write_text('{"mcpServers": []}')
    with pytest.raises(ConfigError, match="object under 'mcpServers'"):
        install("cursor", SERVER, env, "linux")
    assert path.read_text() == '{"mcpServers": []}'


@pytest.mark.parametrize("client", [c for c in CLIENTS if c != "claude-desktop"])
def test_remote_entry_sends_the_token_and_the_file_is_private(client: Client, env: dict[str, str]) -> None:
    out = install(client, REMOTE, env, "linux", now=T0)
    entry = _servers(client, out.path)["gpubox"]
    headers = entry.get("http_headers" if client == "codex" else "headers")
    assert entry["url"] == REMOTE.url and headers == {"Authorization": f"Bearer {REMOTE.token}"}
    assert stat.S_IMODE(os.stat(out.path).st_mode) & 0o077 == 0
    assert REMOTE.token not in out.preview and "<token from /home/me/.gpubox-token>" in out.preview
    removed = uninstall(client, env, "linux", dry_run=True)
    assert REMOTE.token not in removed.preview


def test_remote_without_token_has_no_headers(env: dict[str, str]) -> None:
    out = install("vscode", Remote("http://127.0.0.1:8765/mcp"), env, "linux")
    assert _servers("vscode", out.path)["gpubox"] == {"type": "http", "url": "http://127.0.0.1:8765/mcp"}


def test_claude_desktop_remote_is_refused_with_the_reason(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=r"Settings > Connectors.*cannot send gpubox's bearer token"):
        install("claude-desktop", REMOTE, env, "linux")
    assert not config_path("claude-desktop", env, "linux").exists()


def test_codex_entry_is_replaced_in_place(env: dict[str, str]) -> None:
    path = config_path("codex", env, "linux")
    path.parent.mkdir(parents=True)
    head = 'model = "o3"\n\n'
    tail = '\n# keep me\n[mcp_servers.docs]\ncommand = "npx"\n'
    path.write_text(head + '[mcp_servers.gpubox]\ncommand = "old"\n\n[mcp_servers.gpubox.env]\nA = "1"\n' + tail)
    install("codex", SERVER, env, "linux", now=T0)
    text = path.read_text()
    assert text.startswith(head + "[mcp_servers.gpubox]\n") and text.endswith(tail)
    assert '"old"' not in text and _servers("codex", path)["gpubox"]["env"] == SERVER.env


def test_codex_inline_entry_is_refused_not_duplicated(env: dict[str, str]) -> None:
    path = config_path("codex", env, "linux")
    path.parent.mkdir(parents=True)
    text = '[mcp_servers]\ngpubox = { command = "old" }\n'
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"inline table or dotted keys.*by hand"):
        install("codex", SERVER, env, "linux")
    assert path.read_text() == text and _backups(path) == []


def test_codex_strings_are_escaped(env: dict[str, str]) -> None:
    odd = Stdio('C:\\Program Files\\gpubox "x"\\gpubox.exe', ["serve"], {"GPUBOX_ALLOWED_ROOTS": "a\tb\nc\x7fé"})
    out = install("codex", odd, env, "linux")
    entry = _servers("codex", out.path)["gpubox"]
    assert entry["command"] == odd.command and entry["env"] == odd.env


def _cli(monkeypatch: pytest.MonkeyPatch, home: Path, *argv: str) -> int:
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.delenv("CODEX_HOME", raising=False)
    monkeypatch.delenv("APPDATA", raising=False)
    return cli.main(list(argv))


def test_cli_install_print_and_uninstall(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    state = ["--state-dir", str(tmp_path / "state"), "--allowed-root", str(tmp_path)]
    assert _cli(monkeypatch, home, "install", "--client", "cursor", "--print", *state) == 0
    shown = capsys.readouterr()
    assert json.loads(shown.out)["mcpServers"]["gpubox"]["args"][-1] == "serve" and "would write" in shown.err
    assert not (home / ".cursor" / "mcp.json").exists()
    assert _cli(monkeypatch, home, "install", "--client", "cursor", *state) == 0
    assert "wrote" in capsys.readouterr().out
    assert _cli(monkeypatch, home, "install", "--client", "cursor", *state) == 0
    assert "up to date" in capsys.readouterr().out
    assert _cli(monkeypatch, home, "uninstall", "--client", "cursor") == 0
    assert json.loads((home / ".cursor" / "mcp.json").read_text()) == {"mcpServers": {}}


def test_cli_remote_reads_the_token_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "token"
    token.write_text("abcdefghijklmnop0123\n")
    home = tmp_path / "home"
    url = "http://127.0.0.1:8765/mcp"
    assert _cli(monkeypatch, home, "install", "--client", "codex", "--remote", url, "--token-file", str(token)) == 0
    entry = tomllib.loads((home / ".codex" / "config.toml").read_text())["mcp_servers"]["gpubox"]
    assert entry == {"url": url, "http_headers": {"Authorization": "Bearer abcdefghijklmnop0123"}}
    assert _cli(monkeypatch, home, "install", "--client", "codex", "--token-file", str(token)) == 2
    assert "--token-file goes with --remote" in capsys.readouterr().err
    assert _cli(monkeypatch, home, "install", "--client", "cursor", "--remote", "gpu-box:8765") == 2
    assert "not an http(s) URL" in capsys.readouterr().err


def test_a_symlinked_config_is_written_through_and_stays_a_link(env: dict[str, str], tmp_path: Path) -> None:
    target = tmp_path / "dotfiles" / "cursor-mcp.json"
    _seed("cursor", target)
    link = config_path("cursor", env, "linux")
    link.parent.mkdir(parents=True)
    link.symlink_to(target)
    outcome = install("cursor", SERVER, env, "linux", now=T0)
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert set(_servers("cursor", target)) == {"docs", "gpubox"}
    assert outcome.backup is not None and "gpubox" not in json.loads(outcome.backup.read_text())["mcpServers"]
    assert not list(target.parent.glob(".cursor-mcp.json.*"))  # no temporary file left beside the target


def test_a_read_only_config_is_refused_and_left_untouched(env: dict[str, str]) -> None:
    path = config_path("codex", env, "linux")
    before = _seed("codex", path)
    path.chmod(0o444)
    with pytest.raises(ConfigError, match="read-only"):
        install("codex", SERVER, env, "linux", now=T0)
    assert path.read_text() == before and not _backups(path)


@pytest.mark.parametrize("client", [c for c in CLIENTS if c != "claude-desktop"])
@pytest.mark.parametrize("token", ['with "quotes" and \\ back-0123', "a passphrase with spaces 0123"])
def test_a_token_the_preview_escapes_or_spaces_is_still_hidden(client: Client, env: dict[str, str], token: str) -> None:
    # the JSON / TOML preview escapes '"' and '\': the raw token was hidden, its escaped form printed
    remote = Remote(REMOTE.url, token, "/home/me/.gpubox-token")
    out = install(client, remote, env, "linux", now=T0)
    words = [w for w in token.replace('"', " ").replace("\\", " ").split() if len(w) > 3]
    assert not any(w in out.preview for w in words), out.preview
    removed = uninstall(client, env, "linux", dry_run=True)
    assert not any(w in removed.preview for w in words), removed.preview
