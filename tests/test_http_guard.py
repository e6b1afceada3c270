"""Host/Origin checks and the request deadline, over a real `gpubox serve --transport http`."""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import urlsplit

import httpx2
import pytest

from gpubox.httpguard import matches

from .conftest import child_env, running_http_server

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
LOOPBACK_HOSTS = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
LOOPBACK_ORIGINS = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("127.0.0.1:8765", True),
        ("LOCALHOST:1", True),
        ("[::1]:8765", True),
        ("127.0.0.1", False),  # a `:*` pattern wants an explicit port, as the SDK's does
        ("127.0.0.1:8765@evil.com", False),
        ("127.0.0.1:8765.evil.com", False),
        ("127.0.0.1:evil", False),
        ("127.0.0.1.evil.com:8765", False),
        ("", False),
    ],
)
def test_host_patterns_match_the_whole_host_and_port(host: str, ok: bool) -> None:
    assert matches(host, LOOPBACK_HOSTS, origin=False) is ok


@pytest.mark.parametrize(
    ("origin", "ok"),
    [
        ("http://127.0.0.1:8765", True),
        ("http://[::1]:3000", True),
        ("https://127.0.0.1:8765", False),
        ("http://127.0.0.1:8765.evil.com", False),
        ("http://127.0.0.1:8765@evil.com", False),
        ("http://127.0.0.1:8765/path", False),
        ("null", False),
    ],
)
def test_origin_patterns_match_the_whole_scheme_host_and_port(origin: str, ok: bool) -> None:
    assert matches(origin, LOOPBACK_ORIGINS, origin=True) is ok


def test_exact_patterns_need_an_exact_port() -> None:
    assert matches("gpu-box.internal:8765", ["gpu-box.internal:8765"], origin=False)
    assert not matches("gpu-box.internal:87650", ["gpu-box.internal:8765"], origin=False)
    assert matches("https://gpu-box.internal", ["https://gpu-box.internal"], origin=True)


async def _post(base: str, token: str, **headers: str) -> int:
    async with httpx2.AsyncClient() as http:
        r = await http.post(
            f"{base}/mcp", json=INIT, headers={**JSON_HEADERS, "Authorization": f"Bearer {token}", **headers}
        )
        return r.status_code


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_host_that_only_starts_like_an_allowed_one_gets_421(http_server: tuple[str, str]) -> None:
    base, token = http_server
    port = urlsplit(base).port
    assert await _post(base, token, Host=f"127.0.0.1:{port}@evil.com") == 421
    assert await _post(base, token, Host=f"127.0.0.1:{port}.evil.com") == 421
    assert await _post(base, token) == 200


@pytest.mark.slow
@pytest.mark.anyio
async def test_an_origin_that_only_starts_like_an_allowed_one_gets_403(http_server: tuple[str, str]) -> None:
    base, token = http_server
    port = urlsplit(base).port
    assert await _post(base, token, Origin=f"http://127.0.0.1:{port}.evil.com") == 403
    assert await _post(base, token, Origin=f"http://127.0.0.1:{port}") == 200


def _closed_by_server(sock: socket.socket) -> bool:
    """True when the server closes the connection; the 60 s socket timeout is only a fail-safe."""
    sock.settimeout(60)
    try:
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


@pytest.mark.slow
def test_a_client_that_never_finishes_its_headers_is_disconnected(tmp_path: Path) -> None:
    env = child_env(tmp_path, GPUBOX_HTTP_REQUEST_TIMEOUT_SECONDS="1")
    with running_http_server(tmp_path, env=env) as (base, _, _, _):
        port = urlsplit(base).port
        assert port is not None
        with socket.create_connection(("127.0.0.1", port)) as slow:
            slow.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            assert _closed_by_server(slow)
        with socket.create_connection(("127.0.0.1", port)) as silent:
            assert _closed_by_server(silent)


@pytest.mark.slow
def test_a_kept_alive_connection_still_serves_complete_requests(tmp_path: Path) -> None:
    env = child_env(tmp_path, GPUBOX_HTTP_REQUEST_TIMEOUT_SECONDS="1")
    with running_http_server(tmp_path, env=env) as (base, _, _, _), httpx2.Client() as http:
        for _ in range(3):
            assert http.get(f"{base}/health").json()["status"] == "ok"
