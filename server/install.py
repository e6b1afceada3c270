"""`gpubox install` / `gpubox uninstall`: write or remove gpubox's entry in an MCP client's own config file.

Where each client keeps its user-level MCP servers, and in what format (checked against its documentation):

- Claude Desktop: `claude_desktop_config.json`, "mcpServers", stdio only; macOS ~/Library/Application Support/
  Claude/, Windows %APPDATA%\\Claude\\ (https://modelcontextprotocol.io/quickstart/user). Linux has no official
  build; the community builds read ~/.config/Claude/. Remote servers are added under Settings > Connectors:
  "Claude Desktop will not connect to remote servers that are configured directly via claude_desktop_config.json"
  (https://support.claude.com/en/articles/11503834).
- Claude Code: ~/.claude.json, top-level "mcpServers" is the user scope; "type" stdio / http with "headers"
  (https://code.claude.com/docs/en/mcp).
- Cursor: ~/.cursor/mcp.json, "mcpServers"; "url" and "headers" for remote servers (https://cursor.com/docs/mcp).
- VS Code: mcp.json in the user profile (Code/User/ under the same folders as Claude Desktop), top-level
  "servers", "type" stdio / http with "headers"
  (https://code.visualstudio.com/docs/copilot/reference/mcp-configuration).
- Codex: $CODEX_HOME/config.toml (default ~/.codex), `[mcp_servers.<name>]` with command / args / env, or
  url / http_headers (https://developers.openai.com/codex/mcp).

Every change copies the file to `<file>.bak-<timestamp>` first and replaces it atomically; an entry that is
already what gpubox would write is left alone (no write, no backup); other servers and settings are kept;
a file that does not parse is refused and left untouched.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from gpubox import tomledit
from gpubox.errors import ConfigError
from gpubox.urls import check_http_url

Client = Literal["claude-desktop", "claude-code", "cursor", "vscode", "codex"]
CLIENTS: tuple[Client, ...] = ("claude-desktop", "claude-code", "cursor", "vscode", "codex")
Action = Literal["written", "unchanged", "removed", "absent"]

_SURROGATE = re.compile("[\ud800-\udfff]")
_BEARER = re.compile(r'(Bearer )(?:[^"\\\n]|\\.)+')  # to the closing quote: a token may hold spaces, \" and \\
_SERVERS_KEY: dict[Client, str] = {
    "claude-desktop": "mcpServers",
    "claude-code": "mcpServers",
    "cursor": "mcpServers",
    "vscode": "servers",
    "codex": "mcp_servers",
}
_LABEL: dict[Client, str] = {
    "claude-desktop": "Claude Desktop",
    "claude-code": "Claude Code",
    "cursor": "Cursor",
    "vscode": "VS Code",
    "codex": "Codex",
}
_NEXT: dict[Client, str] = {
    "claude-desktop": "quit and reopen Claude Desktop",
    "claude-code": "check with `claude mcp list` (restart running Claude Code sessions)",
    "cursor": "restart Cursor, then check Settings > MCP",
    "vscode": "run 'MCP: List Servers' in VS Code",
    "codex": "start codex and type /mcp",
}


@dataclass(frozen=True)
class Stdio:
    command: str
    args: list[str]
    env: dict[str, str]


@dataclass(frozen=True)
class Remote:
    url: str
    token: str | None = None
    token_source: str = ""  # where the token came from, shown instead of it in --print


@dataclass(frozen=True)
class Outcome:
    client: Client
    path: Path
    action: Action
    backup: Path | None
    preview: str  # the entry as it appears (or would appear) in the file, token redacted

    def message(self, dry_run: bool) -> str:
        label = _LABEL[self.client]
        if self.action == "unchanged":
            return f"{label}: {self.path} already has this gpubox entry; it is up to date (nothing written)."
        if self.action == "absent":
            return f"{label}: {self.path} has no gpubox entry; nothing to remove."
        verb = {"written": "write", "removed": "remove the entry from"}[self.action]
        if dry_run:
            return f"{label}: would {verb} {self.path} (nothing written: --print)."
        saved = f"backup {self.backup}" if self.backup else "new file"
        done = "wrote" if self.action == "written" else "removed gpubox's entry from"
        return f"{label}: {done} {self.path} ({saved}); {_NEXT[self.client]}."


def _home(env: Mapping[str, str]) -> Path:
    return Path(env["HOME"]) if env.get("HOME") else Path.home()


def _app_config_dir(env: Mapping[str, str], platform: str) -> Path:
    """Where Electron apps keep per-user data: Claude Desktop's and VS Code's folders live here."""
    if platform == "darwin":
        return _home(env) / "Library" / "Application Support"
    if platform == "win32":
        if not env.get("APPDATA"):
            raise ConfigError("APPDATA is not set; run this from a normal Windows user session")
        return Path(env["APPDATA"])
    return Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else _home(env) / ".config"


def config_path(client: Client, env: Mapping[str, str], platform: str) -> Path:
    """The user-level config file `client` reads its MCP servers from."""
    if client == "claude-desktop":
        return _app_config_dir(env, platform) / "Claude" / "claude_desktop_config.json"
    if client == "vscode":
        return _app_config_dir(env, platform) / "Code" / "User" / "mcp.json"
    if client == "claude-code":
        return _home(env) / ".claude.json"
    if client == "cursor":
        return _home(env) / ".cursor" / "mcp.json"
    codex_home = Path(env["CODEX_HOME"]) if env.get("CODEX_HOME") else _home(env) / ".codex"
    return codex_home / "config.toml"


def check_url(url: str) -> str:
    example = "e.g. http://127.0.0.1:8765/mcp (an IPv6 address in brackets: http://[::1]:8765/mcp)"
    return check_http_url(url, "--remote", example)


def entry(client: Client, server: Stdio | Remote) -> dict[str, Any]:
    """gpubox's server entry in `client`'s own format."""
    if isinstance(server, Stdio):
        base: dict[str, Any] = {"command": server.command, "args": list(server.args), "env": dict(server.env)}
        return {"type": "stdio", **base} if client in ("claude-code", "vscode") else base
    if client == "claude-desktop":
        raise ConfigError(
            "Claude Desktop does not read remote servers from claude_desktop_config.json; add the URL under "
            "Settings > Connectors instead (those connect with OAuth and cannot send gpubox's bearer token: "
            "https://support.claude.com/en/articles/11503834). With a token, use a client that sends headers "
            "(claude-code, cursor, vscode, codex), or install gpubox locally and use stdio (no --remote)."
        )
    headers = {"Authorization": f"Bearer {server.token}"} if server.token else {}
    if client == "codex":
        return {"url": server.url, **({"http_headers": headers} if headers else {})}
    remote: dict[str, Any] = {"url": server.url} if client == "cursor" else {"type": "http", "url": server.url}
    return {**remote, "headers": headers} if headers else remote


def _redact(text: str, server: Stdio | Remote) -> str:
    if isinstance(server, Remote) and server.token:
        hidden = f"<token from {server.token_source or 'the token file'}>"
        # JSON and TOML previews escape '"' and '\\': hide the escaped form as well as the raw one
        return text.replace(json.dumps(server.token)[1:-1], hidden).replace(server.token, hidden)
    return text


def _read(path: Path) -> str:
    """The file's text, "" when it does not exist; ConfigError for one that is not UTF-8 or cannot be read."""
    try:
        # bytes decoded, not read_text: its newline translation turned a CRLF file into LF when written back
        return path.read_bytes().decode("utf-8") if path.is_file() else ""
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}); gpubox will not rewrite it: save it as "
            "UTF-8 (e.g. `iconv -f UTF-16 -t UTF-8`), or add the entry by hand (`--print` shows it). "
            "The file was not changed."
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read ({exc.strerror or exc}); check its permissions") from None


def _load_json(path: Path, servers_key: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(whole document, its servers map); {} for a missing or empty file."""
    text = _read(path)
    if not text.strip():
        return {}, {}
    try:
        doc = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except _Unwritable as exc:
        raise ConfigError(
            f"{path} holds the number {exc}, which JSON cannot write back as it is (it reads as infinite or is not "
            "JSON); gpubox will not rewrite it: add the entry by hand (`--print` shows it). The file was not changed."
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); gpubox will not "
            "rewrite it (comments, which some clients allow, would be lost): fix it, or add the "
            "entry by hand (`--print` shows it). The file was not changed."
        ) from None
    except (ValueError, RecursionError) as exc:  # an integer over 4,300 digits, nesting past the interpreter's limit
        raise ConfigError(
            f"{path} cannot be read back as it is ({type(exc).__name__}); gpubox will not rewrite it: add the entry "
            "by hand (`--print` shows it). The file was not changed."
        ) from None
    servers = doc.get(servers_key, {}) if isinstance(doc, dict) else None
    if not isinstance(servers, dict):
        raise ConfigError(
            f"{path}: expected a JSON object with an object under {servers_key!r}; the file was not changed"
        )
    return doc, servers


class _Unwritable(ValueError):
    """A number json.dumps would not write back as it was read (1e400 became Infinity, which is not JSON)."""


def _no_constant(name: str) -> Any:
    raise _Unwritable(name)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Unwritable(text)
    return value


def _json_text(doc: dict[str, Any]) -> str:
    text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    # a lone surrogate (a cut emoji escape such as "\ud83d" in a client's history) cannot be written as UTF-8:
    # written back as the escape it was read from
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _backup(path: Path, now: datetime) -> Path:
    stamp = now.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.bak-{stamp}")
    n = 1
    while target.exists():  # two changes within one second keep both backups
        target = path.with_name(f"{path.name}.bak-{stamp}-{n}")
        n += 1
    shutil.copy2(path, target)
    return target


def _write_target(path: Path) -> Path:
    """The file to replace: a symlinked config (dotfiles managers) is written through to what it points at, so
    the link stays a link; a read-only file is refused, not silently replaced."""
    try:
        target = path.resolve() if path.is_symlink() else path
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise ConfigError(f"{path} is a symlink that cannot be followed ({exc}); fix the link") from None
    if target.is_file():
        st = target.stat()
        # Root passes os.access on any file, so the owner's write bit is checked too: a 0444 file was made
        # read-only on purpose.
        if not os.access(target, os.W_OK) or not st.st_mode & stat.S_IWUSR:
            shown = path if target == path else f"{path} (a link to {target})"
            raise ConfigError(
                f"{shown} is read-only; gpubox will not replace it. Make it writable (chmod u+w), or add the "
                "entry by hand (`--print` shows it). The file was not changed."
            )
    return target


def _write(path: Path, text: str, secret: bool, now: datetime) -> Path | None:
    """Back up (beside `path`), then replace atomically; the old mode is kept (tightened to 0600 when a token is
    inside)."""
    target = _write_target(path)
    try:
        data = text.encode("utf-8")  # before the backup: text that cannot be written leaves no backup behind
    except UnicodeEncodeError as exc:
        raise ConfigError(f"cannot write {path}: {exc.reason} in the new text; the file was not changed") from None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        existed = target.is_file()
        backup = _backup(path, now) if existed else None
        mode = target.stat().st_mode & 0o777 if existed else 0o644
        # The temporary file sits beside the target: os.replace is atomic only within one file system.
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    except OSError as exc:
        raise ConfigError(f"cannot write {path} ({exc.strerror or exc}); check its folder's permissions") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode & ~0o077 if secret else mode)
        os.replace(tmp, target)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise ConfigError(f"cannot write {path} ({exc.strerror or exc}); the file was not changed") from None
        raise
    return backup


def _json_preview(key: str, name: str, value: dict[str, Any]) -> str:
    return json.dumps({key: {name: value}}, indent=2, ensure_ascii=False) + "\n"


def install(
    client: Client,
    server: Stdio | Remote,
    env: Mapping[str, str],
    platform: str,
    name: str = "gpubox",
    dry_run: bool = False,
    now: datetime | None = None,
) -> Outcome:
    """Add or update gpubox's entry in `client`'s config; `dry_run` only reports what would change."""
    path = config_path(client, env, platform)
    value = entry(client, server)
    key = _SERVERS_KEY[client]
    if client == "codex":
        old_text = _read(path)
        current = tomledit.parse(old_text, path).get(key, {})
        unchanged = isinstance(current, dict) and current.get(name) == value
        preview = tomledit.render((key, name), value)
        new_text = "" if unchanged else tomledit.set_table(old_text, (key, name), value, path)
    else:
        doc, servers = _load_json(path, key)
        unchanged = servers.get(name) == value
        preview = _json_preview(key, name, value)
        new_text = "" if unchanged else _json_text({**doc, key: {**servers, name: value}})
    preview = _redact(preview, server)
    if unchanged:
        return Outcome(client, path, "unchanged", None, preview)
    if dry_run:
        return Outcome(client, path, "written", None, preview)
    backup = _write(path, new_text, isinstance(server, Remote) and bool(server.token), now or datetime.now())
    return Outcome(client, path, "written", backup, preview)


def uninstall(
    client: Client,
    env: Mapping[str, str],
    platform: str,
    name: str = "gpubox",
    dry_run: bool = False,
    now: datetime | None = None,
) -> Outcome:
    """Remove only gpubox's entry (`name`) from `client`'s config; everything else stays."""
    path = config_path(client, env, platform)
    key = _SERVERS_KEY[client]
    if client == "codex":
        old_text = _read(path)
        current = tomledit.parse(old_text, path).get(key, {})
        present = isinstance(current, dict) and name in current
        new_text = tomledit.remove_table(old_text, (key, name), path) if present else ""
        preview = tomledit.render((key, name), current[name]) if present else ""
    else:
        doc, servers = _load_json(path, key)
        present = name in servers
        new_text = _json_text({**doc, key: {k: v for k, v in servers.items() if k != name}}) if present else ""
        preview = _json_preview(key, name, servers[name]) if present else ""
    if not present:
        return Outcome(client, path, "absent", None, "")
    preview = _BEARER.sub(r"\1<redacted>", preview)
    if dry_run:
        return Outcome(client, path, "removed", None, preview)
    return Outcome(client, path, "removed", _write(path, new_text, False, now or datetime.now()), preview)
