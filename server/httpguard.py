"""Connection-level guards for the HTTP transport, in front of the SDK's own checks.

- Host/Origin: the SDK matches its `host:*` patterns by prefix, so `Host: 127.0.0.1:8765@evil.com` or
  `Origin: http://127.0.0.1:8765.evil.com` pass it. Here a header is parsed into scheme, host and port and
  each part is compared whole: the DNS-rebinding protection a browser-reachable server needs
  (https://developer.mozilla.org/en-US/docs/Web/Security/Attacks/DNS_rebinding is the background).
  Scheme and host compare case-insensitively (RFC 3986 3.1, 3.2.2); a header that is not valid syntax (a port
  outside 1-65535, a path in an Origin, two Host lines) gets 400 as RFC 9112 3.2 asks, a valid one naming
  another server 421 (Host) or 403 (Origin).
- Header limits: h11 bounds only the part of a head that is still incomplete, so a head that arrives in one read
  (up to 256 KiB on loopback) passes however many fields it has. Every request is held to fixed limits here.
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
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("gpubox.http")

# Apache's LimitRequestFields is 100; 16 KiB for the whole head is h11's and Node.js's default (nginx allows
# 4 x 8 KiB buffers). An MCP client sends about ten headers in well under 1 KiB.
MAX_HEADERS = 100
MAX_HEADER_BYTES = 16 * 1024

# host: a DNS name / IPv4 literal, or a bracketed IPv6 literal
_HOST = re.compile(r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+")
_SPLIT = re.compile(r"(?P<host>\[[^\]]*\]|[^:\[\]]*)(?::(?P<port>.*))?", re.DOTALL)
_ORIGIN = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>[^/?#]+)", re.DOTALL)
_PORT_RANGE = "port must be a number from 1 to 65535"


class MalformedHeader(ValueError):
    """A Host or Origin value that is not valid syntax; the message says which part."""


@dataclass(frozen=True)
class Authority:
    scheme: str | None  # lower case
    host: str  # lower case
    port: str | None  # canonical digits, "*" (patterns only) or None when absent

    def __str__(self) -> str:
        base = f"{self.scheme}://{self.host}" if self.scheme else self.host
        return base if self.port is None else f"{base}:{self.port}"


def _port(raw: str | None, pattern: bool) -> str | None:
    if raw is None or (raw == "*" and pattern):
        return raw
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise MalformedHeader(_PORT_RANGE)
    return str(int(raw))  # "08765" and "8765" are one port


def parse_strict(value: str, *, origin: bool, pattern: bool = False) -> Authority:
    """`host[:port]` (a Host header) or `scheme://host[:port]` (an Origin); raises MalformedHeader."""
    scheme: str | None = None
    rest = value.strip()
    if origin:
        m = _ORIGIN.fullmatch(rest)
        if m is None:
            raise MalformedHeader("an Origin is scheme://host[:port], with no path")
        scheme, rest = m["scheme"].lower(), m["rest"]
    m = _SPLIT.fullmatch(rest)
    if m is None or _HOST.fullmatch(m["host"]) is None:
        raise MalformedHeader("the host is not a DNS name, an IPv4 address or a bracketed IPv6 address")
    return Authority(scheme, m["host"].lower(), _port(m["port"], pattern))


def parse_authority(value: str, *, origin: bool, pattern: bool = False) -> Authority | None:
    """As parse_strict, with None for a malformed value."""
    try:
        return parse_strict(value, origin=origin, pattern=pattern)
    except MalformedHeader:
        return None


def _allowed(got: Authority, patterns: Iterable[str], *, origin: bool) -> bool:
    for raw in patterns:
        want = parse_authority(raw, origin=origin, pattern=True)
        if want is None or want.scheme != got.scheme or want.host != got.host:
            continue
        if want.port == got.port or (want.port == "*" and got.port is not None):
            return True
    return False


def matches(value: str | None, patterns: Iterable[str], *, origin: bool) -> bool:
    """Whether the header `value` equals one pattern in scheme, host and port (`:*` = any explicit port)."""
    got = parse_authority(value, origin=origin) if value else None
    return got is not None and _allowed(got, patterns, origin=origin)


def header_problem(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why a request's header fields exceed MAX_HEADERS / MAX_HEADER_BYTES, or None."""
    if len(headers) > MAX_HEADERS:
        return f"{len(headers)} header fields; at most {MAX_HEADERS} are accepted"
    size = sum(len(k) + len(v) + 4 for k, v in headers)  # + ": " and CRLF, as on the wire
    if size > MAX_HEADER_BYTES:
        return f"{size} bytes of header fields; at most {MAX_HEADER_BYTES} are accepted"
    return None


@dataclass(frozen=True)
class Refusal:
    status: int
    reason: str


class HostOriginGuard:
    """ASGI middleware: 431 past the header limits, 400 for a malformed or repeated Host/Origin, 421 for a Host
    not allowed, 403 for an Origin not allowed (absent Origin is fine: non-browser clients send none). Paths in
    `exempt` (the open /health) skip the Host/Origin checks. Host and Origin reach the app in canonical (lower
    case) form, so the SDK's own case-sensitive check behind this one agrees."""

    def __init__(
        self, app: ASGIApp, *, hosts: list[str], origins: list[str], exempt: frozenset[str] = frozenset()
    ) -> None:
        self.app = app
        self.hosts = hosts
        self.origins = origins
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_big = header_problem(scope["headers"])
        if too_big is not None:
            await self._refuse(Refusal(431, f"Request header fields too large: {too_big}"), scope, receive, send)
            return
        if scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = list(scope["headers"])
        refusal = self._check(headers, b"host", "Host", self.hosts) or self._check(
            headers, b"origin", "Origin", self.origins
        )
        if refusal is not None:
            await self._refuse(refusal, scope, receive, send)
            return
        await self.app({**scope, "headers": headers}, receive, send)

    @staticmethod
    def _check(headers: list[tuple[bytes, bytes]], key: bytes, name: str, allowed: list[str]) -> Refusal | None:
        """Check one of Host/Origin and rewrite it in `headers` to its canonical form; a Refusal when it fails."""
        at = [i for i, (k, _) in enumerate(headers) if k == key]
        origin = key == b"origin"
        if not at:
            return None if origin else Refusal(400, "Invalid Host header: a request needs one")
        if len(at) > 1:
            return Refusal(400, f"Invalid {name} header: sent more than once")
        value = headers[at[0]][1].decode("latin-1")
        if origin and value.strip() == "null":  # an opaque origin (RFC 6454 7.3): valid, never one of ours
            return Refusal(403, "Invalid Origin header: null is not allowed")
        try:
            got = parse_strict(value, origin=origin)
        except MalformedHeader as e:
            return Refusal(400, f"Invalid {name} header: {e}")
        if not _allowed(got, allowed, origin=origin):
            return Refusal(403 if origin else 421, f"Invalid {name} header: {got} is not allowed")
        headers[at[0]] = (key, str(got).encode("latin-1"))
        return None

    @staticmethod
    async def _refuse(refusal: Refusal, scope: Scope, receive: Receive, send: Send) -> None:
        log.warning("refused a request to %r: %s", scope.get("path"), refusal.reason)  # %r: a path may hold \n
        await PlainTextResponse(refusal.reason, status_code=refusal.status)(scope, receive, send)


_RECEIVED = (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.SWITCHED_PROTOCOL)  # the request is all in (or none will come)


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

    def _arm_unless_received(self) -> None:
        if self.conn.their_state in _RECEIVED:
            self._disarm()
        elif self._deadline is None:
            self._arm()

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the next request starts on a kept-alive connection
        super().data_received(data)
        self._arm_unless_received()

    def on_response_complete(self) -> None:
        # a pipelined request already buffered is read here, not in data_received: without this its deadline was
        # never set, and a byte every few seconds (no token needed) held the connection for good
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is not h11.IDLE:  # idle: uvicorn's keep-alive
            self._arm_unless_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def deadline_protocol(seconds: float) -> type[H11Protocol]:
    """An h11 protocol class (for `uvicorn.Config(http=...)`) that closes connections whose request has not
    fully arrived `seconds` after the connection opened or the previous response ended."""
    return type("DeadlineH11Protocol", (_DeadlineH11Protocol,), {"request_timeout": float(seconds)})
