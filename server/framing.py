"""JSON-RPC framing checks in front of the SDK's transports, so a malformed frame is answered, not dropped.

The SDK drops a stdio line it cannot parse or validate (the dispatcher logs the exception at DEBUG), so a client
that sent a lone surrogate, a batch, a request without "jsonrpc" or with list params waits for an answer forever;
over streamable HTTP it answers 400 with `"id": null` and -32602 for all of them. Here each frame is checked
first and a bad one gets the JSON-RPC 2.0 error (https://www.jsonrpc.org/specification#error_object) carrying
its id whenever the id can be read, even out of text too deep or too broken to parse as a whole.
Every valid frame goes on to the SDK untouched.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import sys
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, BinaryIO, TextIO, cast

import anyio
import anyio.to_thread
import pydantic_core
from mcp.server.auth.middleware.bearer_auth import RequireAuthMiddleware
from mcp.server.stdio import stdio_server
from mcp_types import INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, jsonrpc_message_adapter
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

log = logging.getLogger("gpubox.framing")

BATCH = "batches are not supported: MCP 2025-06-18 removed JSON-RPC batching; send one message per frame"

Reply = dict[str, Any] | list[dict[str, Any]]

# A quote, or a run of openers (or closers) with only scalars between them: a 10^5-deep frame is one token.
_TOKEN = re.compile(r'"|[\[{](?:[^"\[\]{}]*+[\[{])*+|[\]}](?:[^"\[\]{}]*+[\]}])*+')
# the rest of a string after its opening quote; possessive, so an unterminated string costs one pass
_STRING_REST = re.compile(r'[^"\\]*+(?:\\.[^"\\]*+)*+"', re.DOTALL)
_SPACE = re.compile(r"[ \t\r\n]*+")
_DECODER = json.JSONDecoder()


def _skip_space(text: str, pos: int) -> int:
    m = _SPACE.match(text, pos)
    return pos if m is None else m.end()


def id_position(text: str) -> int | None:
    """Where the value of the top-level object's first "id" key starts, found without parsing the frame: it may
    be too deep or too broken to parse. One pass over quotes and bracket runs, no recursion; it stops at the id,
    which clients put before "params". Only frames that failed to parse are scanned."""
    if not text.lstrip().startswith("{"):
        return None
    depth, pos = 0, 0
    while (m := _TOKEN.search(text, pos)) is not None:
        token = m.group()
        pos = m.end()
        if token != '"':
            depth += token.count("[") + token.count("{") - token.count("]") - token.count("}")
            continue
        end = _STRING_REST.match(text, pos)
        if end is None:
            break  # an unterminated string: nothing after it is structure
        key, pos = text[m.start() : end.end()], end.end()
        colon = _skip_space(text, pos)
        if depth == 1 and key == '"id"' and text.startswith(":", colon):
            return _skip_space(text, colon + 1)
    return None


def valid_id(value: object) -> bool:
    """MCP ids are strings or integers (never null, a float or a boolean)."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _read_id(text: str) -> str | int | None:
    at = id_position(text)
    if at is None:
        return None
    try:
        value, _ = _DECODER.raw_decode(text, at)
    except (ValueError, RecursionError):
        return None
    return value if valid_id(value) else None


def error(rid: str | int | None, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


def _parse(text: str) -> tuple[Any, dict[str, Any] | None]:
    """The parsed frame, or the error that answers it. jiter (pydantic_core) is the parser the SDK itself uses,
    so what passes here parses there: it refuses lone surrogates (\\ud800) and nesting past 200 levels with a
    ValueError, where Python's json accepts the first and recurses into a RecursionError on the second."""
    try:
        return pydantic_core.from_json(text), None
    except ValueError as e:
        return None, error(_read_id(text), PARSE_ERROR, f"Parse error: {e}")


def _batch(items: list[Any]) -> Reply:
    """One error per request in the batch, so every waiting id gets its answer; one with a null id otherwise."""
    ids = [item["id"] for item in items if isinstance(item, dict) and valid_id(item.get("id"))]
    return [error(i, INVALID_REQUEST, BATCH) for i in ids] or error(None, INVALID_REQUEST, BATCH)


def _validate(msg: dict[str, Any]) -> dict[str, Any] | None:
    rid = msg["id"] if valid_id(msg.get("id")) else None
    if "id" in msg and rid is None and (msg["id"] is not None or "method" in msg):
        # the SDK would take {"id": 1.5, "method": ...} for a notification and never answer it
        return error(None, INVALID_REQUEST, "Invalid request: id must be a string or an integer")
    if msg.get("jsonrpc") != "2.0":
        return error(rid, INVALID_REQUEST, 'Invalid request: "jsonrpc" must be "2.0"')
    if msg.get("params") is not None and not isinstance(msg["params"], dict):
        return error(rid, INVALID_PARAMS, "Invalid params: MCP params are an object of named parameters")
    try:
        jsonrpc_message_adapter.validate_python(msg, by_name=False)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"][1:]) or "message"
        return error(rid, INVALID_REQUEST, f"Invalid request: {where}: {first['msg']}")
    return None


def check(frame: bytes | str) -> Reply | None:
    """The JSON-RPC error answering `frame`, or None when it is a valid JSON-RPC message for the SDK."""
    if isinstance(frame, bytes):
        try:
            frame = frame.decode("utf-8")
        except UnicodeDecodeError:
            return error(None, PARSE_ERROR, "Parse error: the frame is not UTF-8")
    value, problem = _parse(frame)
    if problem is not None:
        return problem
    if isinstance(value, list):
        return _batch(value)
    if not isinstance(value, dict):
        return error(None, INVALID_REQUEST, "Invalid request: a JSON-RPC message is an object")
    return _validate(value)


def encode(reply: Reply) -> bytes:
    return json.dumps(reply, separators=(",", ":")).encode("ascii")


def too_large(limit: int, rid: str | int | None = None) -> dict[str, Any]:
    return error(rid, INVALID_REQUEST, f"Invalid request: the frame is larger than {limit} bytes")


# --- HTTP ---------------------------------------------------------------------------------------------------


_INLINE_BYTES = 64 * 1024


async def _buffer(receive: Receive, limit: int) -> tuple[list[Message], bool]:
    """The messages read (to replay) and whether they hold the whole body within `limit` bytes."""
    messages: list[Message] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, False
        size += len(message.get("body", b""))
        if size > limit:
            return messages, False
        if not message.get("more_body", False):
            return messages, True


class FramingGuard:
    """Wraps an endpoint that takes JSON-RPC in POST bodies: a frame `check` refuses is answered 400 with its
    JSON-RPC error; every other request reaches the endpoint as it came, the buffered body replayed. Bodies over
    `max_body` go on unread (beyond `max_body`) for the SDK to answer 413, as it does now."""

    def __init__(self, app: ASGIApp, max_body: int) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not self._json_within_limit(scope):
            await self.app(scope, receive, send)
            return
        messages, whole = await _buffer(receive, self.max_body)
        body = b"".join(m.get("body", b"") for m in messages)
        reply = None
        if whole:  # a large body is checked off the event loop (a broken one is scanned in Python for its id)
            reply = check(body) if len(body) <= _INLINE_BYTES else await anyio.to_thread.run_sync(check, body)
        if reply is not None:
            log.info("answered a malformed JSON-RPC frame on %s: %s", scope["path"], _summary(reply))
            await Response(encode(reply), status_code=400, media_type="application/json")(scope, receive, send)
            return
        pending = deque(messages)

        async def replay() -> Message:
            return pending.popleft() if pending else await receive()

        await self.app(scope, replay, send)

    def _json_within_limit(self, scope: Scope) -> bool:
        """Only JSON bodies are frames (the SDK answers 415 to others); a declared oversize body is the SDK's 413."""
        headers = Headers(scope=scope)
        media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        declared = headers.get("content-length", "")
        return media == "application/json" and not (declared.isdigit() and int(declared) > self.max_body)


def guard_routes(app: Starlette, paths: set[str], max_body: int) -> None:
    """Put a FramingGuard on the routes at `paths`, behind the SDK's bearer-token check where there is one, so an
    unauthenticated client still gets 401 and nothing of its body is read."""
    for route in app.router.routes:
        if not isinstance(route, Route | Mount) or route.path not in paths:
            continue
        if isinstance(route.app, RequireAuthMiddleware):
            route.app.app = FramingGuard(route.app.app, max_body)
        else:
            route.app = FramingGuard(route.app, max_body)


def _summary(reply: Reply) -> str:
    first = reply[0] if isinstance(reply, list) else reply
    return f"id {first['id']!r}: {first['error']['message'][:200]}"


# --- stdio --------------------------------------------------------------------------------------------------


class _Wire(io.TextIOBase):
    """stdout's wire, written by the SDK's writer task and the frame checker's thread: one lock, whole lines."""

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__()
        self._raw = raw
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, s: str, /) -> int:
        with self._lock:
            self._raw.write(s.encode("utf-8"))
        return len(s)

    def flush(self) -> None:
        with self._lock:
            self._raw.flush()

    def answer(self, reply: Reply) -> None:
        log.info("answered a malformed JSON-RPC frame on stdin: %s", _summary(reply))
        with self._lock:
            self._raw.write(encode(reply) + b"\n")
            self._raw.flush()


class _CheckedLines(io.TextIOBase):
    """stdin's wire as the SDK's reader sees it: only lines that `check` passes; the rest are answered on `out`.
    A line is read up to `limit` bytes, where the SDK's own reader reads any length."""

    def __init__(self, raw: BinaryIO, out: _Wire, limit: int) -> None:
        super().__init__()
        self._raw = raw
        self._out = out
        self._limit = limit

    def readable(self) -> bool:
        return True

    def readline(self, size: int = -1, /) -> str:
        while line := self._raw.readline(self._limit + 1):
            if len(line) > self._limit and not line.endswith(b"\n"):
                self._skip_to_newline()
                self._out.answer(too_large(self._limit, _read_id(line.decode("utf-8", "replace"))))
                continue
            if not line.strip():
                continue  # a blank line is no frame; the SDK drops it too
            reply = check(line)
            if reply is None:
                return line.decode("utf-8")
            self._out.answer(reply)
        return ""

    def _skip_to_newline(self) -> None:
        while chunk := self._raw.readline(64 * 1024):
            if chunk.endswith(b"\n"):
                return


@contextmanager
def _claimed_wire() -> Iterator[tuple[BinaryIO, BinaryIO]]:
    """The wire on private descriptors, with fd 0 on /dev/null and fd 1 on stderr meanwhile, as the SDK's
    stdio_server() arranges for itself (only when it opens the streams): a child process or native library that
    writes to stdout (llama.cpp logs there) would otherwise corrupt the protocol stream."""
    sys.stdout.flush()
    wire_in, wire_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    try:
        # closefd=False: the reader thread may still block on the wire after serving ends (as in the SDK)
        yield os.fdopen(wire_in, "rb", closefd=False), os.fdopen(wire_out, "wb", closefd=False)
    finally:
        os.dup2(wire_in, 0)
        os.dup2(wire_out, 1)


async def _serve_stdio(mcp: MCPServer[Any], limit: int) -> None:
    with _claimed_wire() as (wire_in, wire_out):
        out = _Wire(wire_out)
        lines = _CheckedLines(wire_in, out, limit)
        async with stdio_server(anyio.wrap_file(cast(TextIO, lines)), anyio.wrap_file(cast(TextIO, out))) as (r, w):
            # MCPServer.run_stdio_async is these two lines with stdio_server()'s own streams; it takes no others
            server = mcp._lowlevel_server
            await server.run(r, w, server.create_initialization_options())


def serve_stdio(mcp: MCPServer[Any], limit: int) -> None:
    """`mcp.run()` (stdio) with every line checked by `check` first; lines over `limit` bytes are refused."""
    anyio.run(_serve_stdio, mcp, limit)
