"""Connection-level guards for the HTTP transport, in front of the SDK's own checks.

- Host/Origin: the SDK matches its `host:*` patterns by prefix, so `Host: 127.0.0.1:8765@evil.com` or
  `Origin: http://127.0.0.1:8765.evil.com` pass it. Here a header is parsed into scheme, host and port and
  each part is compared whole: the DNS-rebinding protection a browser-reachable server needs
  (https://developer.mozilla.org/en-US/docs/Web/Security/Attacks/DNS_rebinding is the background).
- Request deadline: uvicorn's h11 protocol waits for a request's headers forever (only idle keep-alive
  connections time out), so a client trickling a header a byte at a time holds a connection and its memory
  indefinitely ("slowloris"). Each request must arrive complete within a deadline or the socket is closed.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import h11
from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("gpubox.http")

# host: a DNS name / IPv4 literal, or a bracketed IPv6 literal; port: 1-5 digits, or "*" in patterns only.
_HOSTPORT = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::(?P<port>[0-9]{1,5}|\*))?")
_ORIGIN = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.+)")


@dataclass(frozen=True)
class Authority:
    scheme: str | None
    host: str
    port: str | None  # digits, "*" (patterns only) or None when absent


def parse_authority(value: str, *, origin: bool, pattern: bool = False) -> Authority | None:
    """`host[:port]` (a Host header) or `scheme://host[:port]` (an Origin); None when malformed."""
    scheme: str | None = None
    rest = value.strip()
    if origin:
        m = _ORIGIN.fullmatch(rest)
        if m is None:
            return None
        scheme, rest = m["scheme"].lower(), m["rest"]
    m = _HOSTPORT.fullmatch(rest)
    if m is None or (m["port"] == "*" and not pattern):
        return None
    return Authority(scheme, m["host"].lower(), m["port"])


def matches(value: str | None, patterns: Iterable[str], *, origin: bool) -> bool:
    """Whether the header `value` equals one pattern in scheme, host and port (`:*` = any explicit port)."""
    if not value:
        return False
    got = parse_authority(value, origin=origin)
    if got is None:
        return False
    for raw in patterns:
        want = parse_authority(raw, origin=origin, pattern=True)
        if want is None or want.scheme != got.scheme or want.host != got.host:
            continue
        if want.port == got.port or (want.port == "*" and got.port is not None):
            return True
    return False


class HostOriginGuard:
    """ASGI middleware: 421 for a Host not allowed, 403 for an Origin not allowed (absent Origin is fine:
    non-browser clients send none). Paths in `exempt` (the open /health) are not checked."""

    def __init__(
        self, app: ASGIApp, *, hosts: list[str], origins: list[str], exempt: frozenset[str] = frozenset()
    ) -> None:
        self.app = app
        self.hosts = hosts
        self.origins = origins
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host = headers.get("host")
        origin = headers.get("origin")
        if not matches(host, self.hosts, origin=False):
            log.warning("refused Host header %r", host)
            await PlainTextResponse("Invalid Host header", status_code=421)(scope, receive, send)
            return
        if origin is not None and not matches(origin, self.origins, origin=True):
            log.warning("refused Origin header %r", origin)
            await PlainTextResponse("Invalid Origin header", status_code=403)(scope, receive, send)
            return
        await self.app(scope, receive, send)


class _DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol plus a deadline for receiving each complete request (headers and body)."""

    request_timeout: float = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.request_timeout, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            log.info("closing a connection that sent no complete request within %.0f s", self.request_timeout)
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the next request starts on a kept-alive connection
        super().data_received(data)
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.SWITCHED_PROTOCOL):
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def deadline_protocol(seconds: float) -> type[H11Protocol]:
    """An h11 protocol class (for `uvicorn.Config(http=...)`) that closes connections whose request has not
    fully arrived `seconds` after the connection opened or the previous response ended."""
    return type("DeadlineH11Protocol", (_DeadlineH11Protocol,), {"request_timeout": float(seconds)})
