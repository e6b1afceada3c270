"""The `gpubox install` / `gpubox uninstall` subcommands: argument parsing around gpubox.install."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpubox.errors import InvalidInputError
from gpubox.install import CLIENTS, Outcome, Remote, Stdio, check_url, install, uninstall

SettingsArgs = Callable[[argparse.ArgumentParser], None]
LoadSettings = Callable[[argparse.Namespace], Any]


def server_name(text: str) -> str:
    """A server name for a client's config: what the client shows and the key it is stored under."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the server name is empty; the client lists its servers by this name")
    return text


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--client", required=True, choices=CLIENTS, help="the MCP client whose config file to edit")
    p.add_argument(
        "--name", default="gpubox", type=server_name, help="server name in the client's config (default gpubox)"
    )
    p.add_argument("--print", action="store_true", dest="dry_run", help="show what would be written; write nothing")


def register(sub: Any, settings_args: SettingsArgs, load_settings: LoadSettings) -> None:
    """Add `install` and `uninstall` to the `gpubox` subcommands."""
    inst = sub.add_parser(
        "install",
        help="add gpubox to an MCP client's own config file (backup first, other servers kept)",
        description="Write gpubox's entry into the client's user config: stdio (this install) by default, or "
        "a remote server with --remote. Run again to update; `gpubox uninstall` removes it.",
    )
    _common(inst)
    settings_args(inst)
    inst.add_argument(
        "--remote", metavar="URL", help="a gpubox HTTP server instead of stdio, e.g. http://127.0.0.1:8765/mcp"
    )
    inst.add_argument(
        "--token-file",
        type=Path,
        dest="remote_token_file",
        metavar="FILE",
        help="file whose first line is the remote server's token",
    )
    inst.set_defaults(func=functools.partial(_install, load_settings=load_settings))
    uninst = sub.add_parser("uninstall", help="remove gpubox's entry from an MCP client's config file")
    _common(uninst)
    uninst.set_defaults(func=_uninstall)


def _server(ns: argparse.Namespace, load_settings: LoadSettings) -> Stdio | Remote:
    if ns.remote is None:
        if ns.remote_token_file is not None:
            raise InvalidInputError("--token-file goes with --remote URL (the token of a remote gpubox server)")
        from gpubox.clientconfig import server_command, stdio_env

        command, args = server_command()
        return Stdio(command, args, stdio_env(load_settings(ns), ns.config))
    from gpubox.configfiles import read_token_file
    from gpubox.settings import is_loopback

    url = check_url(ns.remote)
    token = read_token_file(ns.remote_token_file) if ns.remote_token_file else None
    host = urlsplit(url).hostname or ""
    if token and url.startswith("http://") and not is_loopback(host):
        print(
            f"gpubox: note: the token goes in clear text over http:// to {host}; prefer an ssh tunnel to "
            "127.0.0.1 or https (README: Remote GPU box)",
            file=sys.stderr,
        )
    return Remote(url, token, str(ns.remote_token_file or ""))


def _report(outcome: Outcome, dry_run: bool) -> int:
    if dry_run and outcome.preview:
        print(outcome.preview, end="")
        print(outcome.message(dry_run), file=sys.stderr)
    else:
        print(outcome.message(dry_run))
    return 0


def _install(ns: argparse.Namespace, load_settings: LoadSettings) -> int:
    server = _server(ns, load_settings)
    outcome = install(ns.client, server, os.environ, sys.platform, name=ns.name, dry_run=ns.dry_run)
    return _report(outcome, ns.dry_run)


def _uninstall(ns: argparse.Namespace) -> int:
    return _report(uninstall(ns.client, os.environ, sys.platform, name=ns.name, dry_run=ns.dry_run), ns.dry_run)
