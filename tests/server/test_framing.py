"""Malformed JSON-RPC frames get a JSON-RPC error with their id (gpubox.framing), over stdio and streamable HTTP
against a real `gpubox serve`, and the server goes on answering well-formed requests."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest

from gpubox.framing import BATCH, check, id_position
from tests.conftest import GPUBOX, child_env, running_http_server

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
LIST = '{"jsonrpc":"2.0","id":%s,"method":"tools/list"}'
DEEP = "[" * 100_000 + "]" * 100_000
# name -> (frame, id the error must carry, JSON-RPC error code)
CASES: dict[str, tuple[str, Any, int]] = {
    "lone surrogate": ('{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{"x":"\\ud800"}}', 7, -32700),
    "10^5-deep nesting": (
        '{"jsonrpc":"2.0","id":"deep","method":"tools/list","params":{"x":' + DEEP + "}}",
        "deep",
        -32700,
    ),
    "batch": ("[" + LIST % 8 + "]", 8, -32600),
    "no jsonrpc": ('{"id":9,"method":"tools/list"}', 9, -32600),
    "params as a list": ('{"jsonrpc":"2.0","id":10,"method":"tools/list","params":[1]}', 10, -32602),
    "truncated": ('{"jsonrpc":"2.0","id":11,"method":"tools/li', 11, -32700),
    "float id": ('{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}', None, -32600),
}
TIMEOUT = 20.0


def _assert_error(reply: Any, name: str, rid: Any, code: int) -> None:
    first = reply[0] if isinstance(reply, list) else reply
    assert first["jsonrpc"] == "2.0" and first["id"] == rid, (name, reply)
    assert first["error"]["code"] == code and first["error"]["message"], (name, reply)


@pytest.mark.parametrize("name", list(CASES))
def test_check_answers_each_malformed_frame_with_its_id(name: str) -> None:
    frame, rid, code = CASES[name]
    reply = check(frame)
    assert reply is not None
    _assert_error(reply, name, rid, code)
    assert check(frame.encode()) == reply


@pytest.mark.parametrize(
    "frame",
    [
        LIST % 1,
        '{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"x","arguments":{"deep":'
        + "[" * 150
        + "]" * 150
        + "}}}",
        '{"jsonrpc":"2.0","method":"notifications/initialized"}',
        '{"jsonrpc":"2.0","id":3,"result":{}}',
        '{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"x"}}',
        '{"jsonrpc":"2.0","id":2,"method":"x","params":{"s":"caf\\u00e9 \\ud83d\\ude00"}}',  # a surrogate *pair*
    ],
)
def test_check_passes_valid_messages(frame: str) -> None:
    assert check(frame) is None


def test_a_batch_gets_one_error_per_request_and_an_empty_one_a_null_id() -> None:
    reply = check("[" + LIST % 1 + ',{"jsonrpc":"2.0","method":"n"},' + LIST % '"b"' + "]")
    assert isinstance(reply, list) and [r["id"] for r in reply] == [1, "b"]
    assert all(r["error"] == {"code": -32600, "message": BATCH} for r in reply)
    assert check("[]") == {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": BATCH}}


def test_the_id_is_read_from_the_top_level_object_only() -> None:
    text = '{"params":{"id":5,"s":"\\"id\\": 6"},"id" : 7, "x": ['
    at = id_position(text)
    assert at is not None and text[at] == "7"
    assert id_position('["id", 1]') is None
    assert id_position('{"a":"' + '\\"' * 100_000) is None  # an unterminated string ends the scan, in one pass


def test_not_utf8_is_a_parse_error() -> None:
    assert check(b'{"jsonrpc":"2.0","id":1,"method":"\xff"}') == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32700, "message": "Parse error: the frame is not UTF-8"},
    }


# --- over a real stdio server ---------------------------------------------------------------------------


class _Stdio:
    """A real `gpubox serve` (stdio) as a subprocess, one JSON line at a time."""

    def __init__(self, tmp_path: Path, **env: str) -> None:
        self.proc = subprocess.Popen(
            [GPUBOX, "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=child_env(tmp_path, **env),
        )

    def __enter__(self) -> _Stdio:
        return self

    def __exit__(self, *exc: object) -> None:
        with self.proc:  # closes the pipes
            self.proc.terminate()
            self.proc.wait(timeout=15)

    def send(self, frame: str | dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        text = frame if isinstance(frame, str) else json.dumps(frame)
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()

    def receive(self) -> Any:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], TIMEOUT)
        assert ready, f"no answer within {TIMEOUT} s"
        return json.loads(self.proc.stdout.readline())


@pytest.mark.slow
def test_stdio_answers_malformed_frames_and_keeps_serving(tmp_path: Path) -> None:
    with _Stdio(tmp_path) as wire:
        wire.send(INIT)
        assert wire.receive()["id"] == 1
        wire.send(INITIALIZED)
        for name, (frame, rid, code) in CASES.items():
            wire.send(frame)
            _assert_error(wire.receive(), name, rid, code)
        wire.send("")  # a blank line is skipped, not answered
        wire.send(LIST % 99)
        answer = wire.receive()
        assert answer["id"] == 99 and answer["result"]["tools"]


STRAY = """
import os, sys
from gpubox.framing import _claimed_wire
with _claimed_wire() as (_, wire):
    print("stray print", flush=True)
    os.system("echo stray child")
    wire.write(b"frame\\n")
    wire.flush()
print("restored")
"""


def test_stray_stdout_output_misses_the_wire() -> None:
    """While serving, fd 1 is stderr (as in the SDK's own stdio_server): a tool's print or a child's (llama.cpp)
    output cannot corrupt the protocol stream."""
    done = subprocess.run([sys.executable, "-c", STRAY], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout == "frame\nrestored\n"
    assert "stray print" in done.stderr and "stray child" in done.stderr


@pytest.mark.slow
def test_stdio_refuses_a_line_over_the_body_limit(tmp_path: Path) -> None:
    with _Stdio(tmp_path, GPUBOX_MAX_REQUEST_BODY_BYTES="4096") as wire:
        wire.send('{"jsonrpc":"2.0","id":5,"method":"tools/list","params":{"pad":"' + "x" * 100_000 + '"}}')
        _assert_error(wire.receive(), "too large", 5, -32600)
        wire.send(INIT)
        assert wire.receive()["id"] == 1


# --- over a real streamable HTTP server -------------------------------------------------------------------


def _result(r: httpx2.Response) -> Any:
    """The JSON-RPC message of a response, whether sent as JSON or as one SSE event."""
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in r.text.splitlines() if line.startswith("data:")]
        return json.loads(data[-1])
    return r.json()


@pytest.mark.slow
def test_http_answers_malformed_frames_with_their_id_and_keeps_serving(tmp_path: Path) -> None:
    with running_http_server(tmp_path) as (base, token, _, _), httpx2.Client(timeout=TIMEOUT) as http:
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {token}",
        }
        r = http.post(f"{base}/mcp", json=INIT, headers=headers)
        assert r.status_code == 200, r.text
        headers |= {"Mcp-Session-Id": r.headers["mcp-session-id"], "Mcp-Protocol-Version": "2025-06-18"}
        assert http.post(f"{base}/mcp", json=INITIALIZED, headers=headers).status_code == 202
        for name, (frame, rid, code) in CASES.items():
            r = http.post(f"{base}/mcp", content=frame.encode(), headers=headers)
            assert r.status_code == 400, (name, r.text)
            _assert_error(r.json(), name, rid, code)
        started = time.monotonic()
        r = http.post(f"{base}/mcp", content=(LIST % 99).encode(), headers=headers)  # answered as an SSE stream
        assert r.status_code == 200 and time.monotonic() - started < TIMEOUT
        answer = _result(r)
        assert answer["id"] == 99 and answer["result"]["tools"]


@pytest.mark.slow
def test_http_checks_frames_only_after_the_token(tmp_path: Path) -> None:
    with running_http_server(tmp_path) as (base, _, _, _), httpx2.Client(timeout=TIMEOUT) as http:
        r = http.post(
            f"{base}/mcp",
            content=CASES["batch"][0].encode(),
            headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream"},
        )
        assert r.status_code == 401
