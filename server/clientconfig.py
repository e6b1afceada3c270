"""Client configuration snippets for Claude Desktop, Cursor, VS Code and remote HTTP clients."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Literal

from gpubox.errors import ConfigError
from gpubox.settings import Settings

Target = Literal["claude-desktop", "cursor", "vscode", "remote"]


def server_command() -> tuple[str, list[str]]:
    """Absolute command that starts the stdio server from any working directory."""
    exe = Path(sys.argv[0]).resolve() if Path(sys.argv[0]).name == "gpubox" else None
    found = shutil.which("gpubox")
    if exe is not None and exe.is_file():
        return str(exe), ["serve"]
    if found:
        return str(Path(found).resolve()), ["serve"]
    # Absolute but not resolved: a venv's python is a symlink to the base interpreter, which has no gpubox.
    return os.path.abspath(sys.executable), ["-m", "gpubox", "serve"]


def _path_list(paths: list[Path]) -> str:
    # A JSON list reads back exactly whatever characters the paths hold (os.pathsep, commas, quotes).
    return json.dumps([str(p) for p in paths], ensure_ascii=False)


def stdio_env(settings: Settings, config: Path | None = None) -> dict[str, str]:
    """The stdio child's environment (allow-listed by MCP clients): what the server needs, the TOML file given with
    --config (its other settings were dropped: the installed server ran on defaults) and a log level set anywhere."""
    env = {
        "GPUBOX_STATE_DIR": str(settings.state_dir),
        "GPUBOX_ALLOWED_ROOTS": _path_list(settings.allowed_roots),
        "HF_HUB_OFFLINE": "1",
    }
    if config is not None:
        env["GPUBOX_CONFIG"] = os.path.abspath(config)  # the client starts the server in a working folder of its own
    if settings.log_level != Settings.model_fields["log_level"].default:
        env["GPUBOX_LOG_LEVEL"] = settings.log_level
    # Only a restriction the installing shell has: a default would hide every GPU but the first.
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
    if settings.model_dirs:
        env["GPUBOX_MODEL_DIRS"] = _path_list(settings.model_dirs)
    if settings.tools:
        env["GPUBOX_TOOLS"] = ",".join(settings.tools)
    for key, value in env.items():
        if any("\ud800" <= ch <= "\udfff" for ch in value):  # bytes of a path that are not UTF-8
            raise ConfigError(
                f"{key} would hold {value.encode('utf-8', 'backslashreplace').decode()!r}, a path that is not UTF-8: "
                "MCP clients write the environment as UTF-8 text, and the server would start on another folder. "
                "Rename it or choose another"
            )
    return env


def snippet(
    target: Target, settings: Settings, name: str = "gpubox", config: Path | None = None
) -> tuple[dict[str, Any], str]:
    """(JSON config, human note) for `target`."""
    command, args = server_command()
    env = stdio_env(settings, config)
    if target == "claude-desktop":
        note = (
            "Merge into claude_desktop_config.json (macOS: ~/Library/Application Support/Claude/, "
            "Windows: %APPDATA%\\Claude\\, Linux: ~/.config/Claude/) and restart Claude Desktop."
        )
        return {"mcpServers": {name: {"command": command, "args": args, "env": env}}}, note
    if target == "cursor":
        note = "Merge into ~/.cursor/mcp.json (or .cursor/mcp.json in a project)."
        return {"mcpServers": {name: {"command": command, "args": args, "env": env}}}, note
    if target == "vscode":
        note = "Save as .vscode/mcp.json in your workspace (VS Code agent mode)."
        return {"servers": {name: {"type": "stdio", "command": command, "args": args, "env": env}}}, note
    from gpubox.http import _bracket, reach_host  # as connect_hint: a wildcard bind is reached on loopback

    url = f"http://{_bracket(reach_host(settings.host))}:{settings.port}/mcp"
    headers = {"Authorization": "Bearer <your-token>"} if settings.resolved_token() else {}
    note = (
        "On the GPU box: `gpubox serve --transport http` (loopback). From your machine, tunnel it with "
        f"`ssh -N -L {settings.port}:127.0.0.1:{settings.port} user@gpu-box` and use the URL below; "
        "or serve on "
        "0.0.0.0 with --token-file and put the token in the Authorization header. Legacy SSE clients: "
        f"{url.removesuffix('/mcp')}/sse"
    )
    cfg: dict[str, Any] = {"type": "http", "url": url}
    if headers:
        cfg["headers"] = headers
    return {"mcpServers": {name: cfg}}, note
