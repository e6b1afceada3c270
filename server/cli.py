"""The `gpubox` command: serve, call, doctor, client-config, install, uninstall, engine install."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpubox import __version__
from gpubox.errors import GpuboxError

log = logging.getLogger("gpubox")


def _setup_logging(level: str) -> None:
    # stderr only: on stdio, stdout is the MCP transport.
    logging.basicConfig(stream=sys.stderr, level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _path(text: str) -> Path:
    """A path argument; an empty one is refused (Path('') is the working directory, never what was meant)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path would mean the working directory; write the directory out")
    return Path(text)


def _settings_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=_path, help="TOML config file (keys as in Settings)")
    p.add_argument("--state-dir", type=_path, help="state directory (GPUBOX_STATE_DIR)")
    p.add_argument(
        "--allowed-root",
        action="append",
        dest="allowed_roots",
        type=_path,
        help="directory tools may read; repeatable (GPUBOX_ALLOWED_ROOTS)",
    )
    p.add_argument(
        "--model-dir",
        action="append",
        dest="model_dirs",
        type=_path,
        help="directory scanned for models; repeatable (GPUBOX_MODEL_DIRS)",
    )
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument("--tools", help="families or tools to expose, e.g. gpu,estimate,search (GPUBOX_TOOLS; default all)")


def _load_settings(ns: argparse.Namespace) -> Any:
    from gpubox.settings import Settings

    overrides = {
        k: getattr(ns, k, None)
        for k in (
            "state_dir",
            "tools",
            "allowed_roots",
            "model_dirs",
            "log_level",
            "host",
            "port",
            "token",
            "token_file",
        )
    }
    return Settings.load(ns.config, **overrides)


def _client_settings(ns: argparse.Namespace) -> Any:
    """Settings a client config will start the server with, refused now if the server would refuse them then."""
    settings = _load_settings(ns)
    if settings.tools:  # names are checked against the registered tools, as at start-up
        from gpubox.app import build_server, state_of

        state_of(build_server(settings)).close()
    return settings


def _serve(ns: argparse.Namespace) -> int:
    settings = _load_settings(ns)
    settings.ensure_state_dir()  # as for call: said once at start, not by every tool
    _setup_logging(settings.log_level)
    from gpubox.app import build_server, state_of

    if ns.transport == "http":
        from gpubox.http import check_bind, check_port

        check_bind(settings)  # before anything else starts
        check_port(settings)
    mcp = build_server(settings)
    try:
        if ns.transport == "stdio":
            from gpubox.framing import serve_stdio

            serve_stdio(mcp, settings.max_request_body_bytes)  # mcp.run() with malformed frames answered
        else:
            from gpubox.http import serve_http

            serve_http(mcp, settings)
    finally:
        state_of(mcp).close()
    return 0


def _call(ns: argparse.Namespace) -> int:
    import anyio

    settings = _load_settings(ns)
    # A one-shot process has no background: search_index must finish before the call returns, or the process
    # exit would cut the indexing short (the caller can still pass wait_seconds).
    settings = settings.model_copy(update={"search_index_wait_seconds": 3600.0})
    settings.ensure_state_dir()  # every family keeps files there: an unusable one is one line, not a traceback
    _setup_logging(settings.log_level if ns.log_level else "WARNING")
    from gpubox.app import build_server, state_of
    from gpubox.calling import call_tool

    mcp = build_server(settings)
    try:
        is_error, payload = anyio.run(call_tool, mcp, ns.tool, ns.args)
    finally:
        state_of(mcp).close()
    if is_error:
        print(payload, file=sys.stderr)
        return 1
    print(json.dumps(payload, indent=2) if not isinstance(payload, str) else payload)
    return 0


def _doctor(ns: argparse.Namespace) -> int:
    from gpubox.doctor import render, report

    rep = report(_load_settings(ns))
    # json.dumps escapes a path's undecodable bytes (a surrogate) where model_dump_json refused to serialise them
    print(json.dumps(rep.model_dump(mode="json"), indent=2) if ns.json else render(rep))
    return 0


def _client_config(ns: argparse.Namespace) -> int:
    from gpubox.clientconfig import snippet

    cfg, note = snippet(ns.target, _client_settings(ns), name=ns.name, config=ns.config)
    print(note, file=sys.stderr)
    print(json.dumps(cfg, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from gpubox.installcmd import server_name

    parser = argparse.ArgumentParser(prog="gpubox", description="MCP server for one GPU box.")
    parser.add_argument("--version", action="version", version=f"gpubox {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the MCP server (stdio by default)")
    _settings_args(serve)
    serve.add_argument(
        "--transport",
        choices=["stdio", "http"],
        default="stdio",
        help="stdio, or http (streamable HTTP at /mcp + SSE at /sse on one port)",
    )
    serve.add_argument("--host", help="bind address for http (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port for http (default 8765)")
    serve.add_argument("--token", help="bearer token required over http (prefer --token-file or GPUBOX_TOKEN)")
    serve.add_argument("--token-file", type=_path, help="file whose first line is the bearer token")
    serve.set_defaults(func=_serve)

    call = sub.add_parser("call", help="run one tool in-process and print its structured result as JSON")
    _settings_args(call)
    call.add_argument("tool", help="tool name, e.g. gpu_status")
    call.add_argument("args", nargs="*", help="key=value arguments (values parsed as JSON when possible)")
    call.set_defaults(func=_call)

    doctor = sub.add_parser("doctor", help="report what this machine has (extras, GPUs, models)")
    _settings_args(doctor)
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.set_defaults(func=_doctor)

    cc = sub.add_parser("client-config", help="print a client configuration snippet")
    _settings_args(cc)
    cc.add_argument(
        "target",
        nargs="?",
        default="claude-desktop",
        choices=["claude-desktop", "cursor", "vscode", "remote"],
    )
    cc.add_argument("--name", default="gpubox", type=server_name, help="server name in the client config")
    cc.add_argument("--host", help=argparse.SUPPRESS)
    cc.add_argument("--port", type=int, help="port of the remote server (remote target)")
    cc.set_defaults(func=_client_config)

    from gpubox.installcmd import register  # install / uninstall: write a client's own config file

    register(sub, _settings_args, _client_settings)
    from gpubox.engine_install import register as register_engine  # gpubox engine install vllm

    register_engine(sub, _settings_args, _load_settings)
    return parser


def _settings_problem(exc: ValidationError) -> str:
    """One line per invalid setting, without pydantic's URL and input echo (which may hold a token)."""
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ())) or "settings"
        lines.append(f"{where}: {str(err.get('msg', '')).removeprefix('Value error, ')}")
    return "invalid settings: " + "; ".join(lines)


_PATH_ERRNOS = {errno.ENAMETOOLONG, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.ELOOP}


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        return int(ns.func(ns))
    except GpuboxError as exc:
        print(f"gpubox: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:  # settings from flags, env or TOML that do not validate
        print(f"gpubox: {_settings_problem(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in _PATH_ERRNOS or exc.filename is None:
            raise
        # a path from a flag, env or TOML the system refuses to look at (a name over 255 bytes, a folder this user
        # cannot enter): one line naming it, not a traceback
        print(f"gpubox: {exc.filename}: {exc.strerror}; check that path", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
