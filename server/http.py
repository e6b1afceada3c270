"""One HTTP port: streamable HTTP at /mcp, legacy SSE at /sse (+ /messages/), GET /health.

Security: binding beyond loopback needs a token of at least MIN_TOKEN_CHARS; DNS-rebinding protection is
always on with explicit allowed hosts/origins (the SDK switches it off silently for non-loopback binds
otherwise) and compares whole hosts and ports (gpubox.httpguard); requests must arrive within a deadline and
within header limits. A malformed JSON-RPC frame is answered with its JSON-RPC error and id (gpubox.framing).
"""

from __future__ import annotations

import logging
import socket
import stat
from pathlib import Path
from typing import Any

import psutil
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette

from gpubox.errors import ConfigError
from gpubox.framing import guard_routes
from gpubox.httpguard import MAX_HEADER_BYTES, HostOriginGuard, deadline_protocol
from gpubox.settings import Settings, is_loopback

log = logging.getLogger("gpubox.http")

LOOPBACK_HOSTS = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
LOOPBACK_ORIGINS = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
WILDCARD_BINDS = {"0.0.0.0", "::", ""}
# A network-facing bearer token must resist guessing; 16 characters of base64 is ~96 bits.
MIN_TOKEN_CHARS = 16
_WARNED: set[Path] = set()  # token files already said to be readable by others (check_bind runs twice)
SHUTDOWN_GRACE_S = 5  # what running calls get to finish after SIGTERM before they are cancelled


def check_bind(settings: Settings) -> None:
    """Refuse a non-loopback bind without a strong token (a GPU box open to the network runs arbitrary work);
    warn when the token file is readable by other users. Raises ConfigError; called before anything starts."""
    token = settings.resolved_token()  # raises ConfigError for a blank, unreadable or non-UTF-8 token
    if token is not None and settings.token is None and settings.token_file is not None:
        mode = settings.token_file.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO) and settings.token_file not in _WARNED:
            _WARNED.add(settings.token_file)
            log.warning(
                "token file %s is readable by group/others (mode %o); restrict it with `chmod 600 %s`",
                settings.token_file,
                stat.S_IMODE(mode),
                settings.token_file,
            )
    if is_loopback(settings.host):
        return
    tunnel = f"`ssh -N -L {settings.port}:127.0.0.1:{settings.port} <this-host>`"
    if token is None:
        raise ConfigError(
            f"refusing to bind {settings.host}:{settings.port} without a token: "
            "anyone who can reach it could "
            "use this GPU box. Set GPUBOX_TOKEN, --token or --token-file, or bind 127.0.0.1 and tunnel with "
            f"{tunnel}."
        )
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"refusing to bind {settings.host}:{settings.port} with a {len(token)}-character token: use at least "
            f"{MIN_TOKEN_CHARS} (e.g. `head -c 32 /dev/urandom | base64`), or bind 127.0.0.1 and tunnel with {tunnel}."
        )


def _bracket(addr: str) -> str:
    return f"[{addr}]" if ":" in addr else addr


def _local_names(*, ipv6_only: bool = False) -> list[str]:
    """Names and addresses a remote client may legitimately use as Host when we bind a wildcard. asyncio binds
    '::' IPv6-only (IPV6_V6ONLY), so no IPv4 address reaches it then."""
    names = {socket.gethostname(), socket.getfqdn()}
    families = (socket.AF_INET6,) if ipv6_only else (socket.AF_INET, socket.AF_INET6)
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family in families:
                names.add(a.address.split("%", 1)[0])
    return sorted(n for n in names if n)


def security_settings(settings: Settings) -> TransportSecuritySettings:
    hosts = list(LOOPBACK_HOSTS)
    origins = list(LOOPBACK_ORIGINS)
    if settings.host in WILDCARD_BINDS:
        extra = _local_names(ipv6_only=settings.host == "::")
    else:  # another loopback address (127.0.0.2) too: its own URL was refused as a foreign Host
        extra = [] if settings.host.lower() in ("127.0.0.1", "localhost", "::1") else [settings.host]
    if extra:
        extra = [_bracket(n) for n in extra]
        hosts += [f"{n}:*" for n in extra]
        origins += [f"http://{n}:*" for n in extra] + [f"https://{n}:*" for n in extra]
    if settings.port in (80, 443):  # clients leave a scheme's default port out of Host (curl drops ':80' too)
        hosts, origins = with_default_port(hosts), with_default_port(origins)
    hosts += with_default_port(settings.allowed_hosts)
    origins += with_default_port(settings.allowed_origins)
    # in lower case: the guard hands the SDK's case-sensitive check lower-case headers, so a configured
    # 'GPU-Box.example:*' or a host name with capitals matched no request
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=list(dict.fromkeys(h.lower() for h in hosts)),
        allowed_origins=list(dict.fromkeys(o.lower() for o in origins)),
    )


def with_default_port(patterns: list[str]) -> list[str]:
    """Each `name:*` (any port) followed by `name` alone: a client sends no port when it uses the scheme's default
    one (RFC 9110 7.2), as browsers and TLS proxies on 443 do, and the SDK's `:*` and our guard want an explicit
    port. For the user's own entries always (a proxy in front may listen on 443); for the loopback and local
    names only when gpubox itself listens on 80 or 443."""
    out: list[str] = []
    for p in patterns:
        out.append(p)
        if p.endswith(":*") and len(p) > 2:
            out.append(p[:-2])
    return out


def build_http_app(mcp: MCPServer[Any], settings: Settings) -> Starlette:
    """Streamable HTTP app (owns the session-manager lifespan) with the SSE routes appended."""
    security = security_settings(settings)
    common: dict[str, Any] = {
        "host": settings.host,
        "transport_security": security,
        "max_request_body_size": settings.max_request_body_bytes,
    }
    app = mcp.streamable_http_app(**common)
    sse = mcp.sse_app(**common)
    have = {getattr(r, "path", None) for r in app.router.routes}
    app.router.routes.extend(r for r in sse.router.routes if getattr(r, "path", None) not in have)
    # Mount strips the trailing slash of /messages/
    guard_routes(app, {"/mcp", "/messages"}, settings.max_request_body_bytes)
    # The SDK's own check stays on behind this one; this one compares hosts and ports whole.
    app.add_middleware(
        HostOriginGuard,
        hosts=security.allowed_hosts,
        origins=security.allowed_origins,
        exempt=frozenset({"/health"}),
    )
    return app


def reach_host(host: str) -> str:
    """Where a client on this box reaches a bind address: a wildcard on loopback ('::' binds IPv6 only)."""
    return {"::": "::1", "0.0.0.0": "127.0.0.1", "": "127.0.0.1"}.get(host, host)


def connect_hint(settings: Settings) -> str:
    base = f"http://{_bracket(reach_host(settings.host))}:{settings.port}"
    auth = ' with header "Authorization: Bearer <token>"' if settings.resolved_token() else ""
    return (
        f"gpubox listening: streamable HTTP {base}/mcp, SSE {base}/sse, health {base}/health{auth}. "
        "Client snippets: `gpubox client-config remote`."
    )


def check_port(settings: Settings) -> None:
    """Refuse a port another process listens on in one line, before anything starts (uvicorn found it only after
    the server was built, and exited with its own line). Binds each address as asyncio will: IPv6 ones
    IPv6-only, with SO_REUSEADDR (a port in TIME_WAIT is free)."""
    where = f"{_bracket(settings.host)}:{settings.port}"
    try:
        infos = socket.getaddrinfo(
            settings.host or None, settings.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise ConfigError(
            f"cannot listen on {where}: the host does not resolve ({exc.strerror}); check --host"
        ) from None
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind(addr)
            except OSError as exc:
                raise ConfigError(
                    f"cannot listen on {where}: {exc.strerror or exc}; another process (another gpubox?) may hold "
                    "the port: pass --port or GPUBOX_PORT"
                ) from None


def _server(config: Any, hint: str) -> Any:
    """uvicorn's Server, saying where to connect once it listens (not before a bind that may fail)."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:
                log.info(hint)

    return Server(config)


def serve_http(mcp: MCPServer[Any], settings: Settings) -> None:
    """Serve until SIGINT/SIGTERM. On a signal, calls still running get SHUTDOWN_GRACE_S, then are cancelled (a
    generation stops at its next token): uvicorn waited for them without limit, so a 3,000-token generation
    kept a server that had closed its socket alive for minutes, past a service manager's stop timeout."""
    import uvicorn

    check_bind(settings)  # the CLI checked already; kept for any other caller (its warning is said once)
    app = build_http_app(mcp, settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        access_log=settings.log_level == "DEBUG",
        lifespan="on",
        http=deadline_protocol(settings.http_request_timeout_seconds),
        # h11 bounds the head still incomplete (uvicorn answers 400 past it), the guard every complete head (431
        # with a reason). h11's bound at twice the guard's: a head between the two always gets the guard's 431,
        # while memory per connection stays bounded.
        h11_max_incomplete_event_size=2 * MAX_HEADER_BYTES,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
    _server(config, connect_hint(settings)).run()
