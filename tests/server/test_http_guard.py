"""Host/Origin checks, header limits and the request deadline, over a real `gpubox serve --transport http`."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from urllib.parse import urlsplit

import httpx2
import pytest

from gpubox.httpguard import MAX_HEADER_BYTES, MAX_HEADERS, MalformedHeader, header_problem, matches, parse_strict
from tests.conftest import child_env, running_http_server

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
        ("LocalHost:08765", True),
        ("[::1]:8765", True),
        ("127.0.0.1", False),  # a `:*` pattern wants an explicit port, as the SDK's does
        ("127.0.0.1:8765@evil.com", False),
        ("127.0.0.1:8765.evil.com", False),
        ("127.0.0.1:evil", False),
        ("127.0.0.1:99999", False),
        ("127.0.0.1:0", False),
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
        ("HTTP://LocalHost:8765", True),
        ("http://[::1]:3000", True),
        ("http://127.0.0.1:65536", False),
        ("https://127.0.0.1:8765", False),
        ("http://127.0.0.1:8765.evil.com", False),
        ("http://127.0.0.1:8765@evil.com", False),
        ("http://127.0.0.1:8765/path", False),
        ("null", False),
    ],
)
def test_origin_patterns_match_the_whole_scheme_host_and_port(origin: str, ok: bool) -> None:
    assert matches(origin, LOOPBACK_ORIGINS, origin=True) is ok


@pytest.mark.parametrize(
    ("value", "origin", "reason"),
    [
        ("127.0.0.1:99999", False, "port must be a number from 1 to 65535"),
        ("127.0.0.1:0", False, "port must be a number from 1 to 65535"),
        ("127.0.0.1:", False, "port must be a number from 1 to 65535"),
        ("127.0.0.1:８７６５", False, "port must be a number from 1 to 65535"),  # fullwidth digits
        ("127.0.0.1:8765@evil.com", False, "port must be a number from 1 to 65535"),
        ("evil.com@127.0.0.1:8765", False, "the host is not"),
        ("http://127.0.0.1:70000", True, "port must be a number from 1 to 65535"),
        ("http://127.0.0.1:8765/path", True, "no path"),
    ],
)
def test_a_malformed_host_or_origin_says_what_is_wrong(value: str, origin: bool, reason: str) -> None:
    with pytest.raises(MalformedHeader, match=reason):
        parse_strict(value, origin=origin)


def test_header_limits() -> None:
    assert header_problem([(b"h%d" % i, b"v") for i in range(MAX_HEADERS)]) is None
    assert "101 header fields" in (header_problem([(b"h%d" % i, b"v") for i in range(MAX_HEADERS + 1)]) or "")
    assert "bytes of header fields" in (header_problem([(b"x", b"v" * MAX_HEADER_BYTES)]) or "")


def test_exact_patterns_need_an_exact_port() -> None:
    assert matches("gpu-box.internal:8765", ["gpu-box.internal:8765"], origin=False)
    assert not matches("gpu-box.internal:87650", ["gpu-box.internal:8765"], origin=False)
    assert matches("https://gpu-box.internal", ["https://gpu-box.internal"], origin=True)


async def _post(base: str, token: str, **headers: str) -> httpx2.Response:
    async with httpx2.AsyncClient() as http:
        return await http.post(
            f"{base}/mcp", json=INIT, headers={**JSON_HEADERS, "Authorization": f"Bearer {token}", **headers}
        )


async def _status(base: str, token: str, **headers: str) -> int:
    return (await _post(base, token, **headers)).status_code


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_host_that_only_starts_like_an_allowed_one_is_refused(http_server: tuple[str, str]) -> None:
    base, token = http_server
    port = urlsplit(base).port
    assert await _status(base, token, Host=f"127.0.0.1.evil.com:{port}") == 421  # valid, not ours: misdirected
    assert await _status(base, token, Host=f"127.0.0.1:{port}@evil.com") == 400  # not valid Host syntax
    assert await _status(base, token, Host=f"127.0.0.1:{port}.evil.com") == 400
    assert await _status(base, token) == 200


@pytest.mark.slow
@pytest.mark.anyio
async def test_an_origin_that_only_starts_like_an_allowed_one_is_refused(http_server: tuple[str, str]) -> None:
    base, token = http_server
    port = urlsplit(base).port
    assert await _status(base, token, Origin=f"http://127.0.0.1.evil.com:{port}") == 403
    assert await _status(base, token, Origin=f"http://127.0.0.1:{port}.evil.com") == 400
    assert await _status(base, token, Origin="null") == 403
    assert await _status(base, token, Origin=f"http://127.0.0.1:{port}") == 200


@pytest.mark.slow
@pytest.mark.anyio
async def test_host_and_origin_compare_case_insensitively_and_ports_must_be_in_range(
    http_server: tuple[str, str],
) -> None:
    base, token = http_server
    port = urlsplit(base).port
    # the SDK's own check behind the guard compares case-sensitively: it sees the canonical lower-case form
    assert await _status(base, token, Host=f"LOCALHOST:{port}") == 200
    assert await _status(base, token, Host=f"LocalHost:{port}", Origin=f"HTTP://LOCALHOST:{port}") == 200
    for host in ("127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1:http"):
        r = await _post(base, token, Host=host)
        assert r.status_code == 400 and "port must be a number from 1 to 65535" in r.text, (host, r.text)
    r = await _post(base, token, Origin="http://127.0.0.1:65536")
    assert r.status_code == 400 and "port must be a number from 1 to 65535" in r.text


def _raw_request(port: int, head: bytes) -> bytes:
    """Send a request head as is (clients merge repeated headers) and read the status line and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


@pytest.mark.slow
def test_two_host_headers_get_400(tmp_path: Path) -> None:
    with running_http_server(tmp_path) as (base, token, _, _):
        port = urlsplit(base).port
        assert port is not None
        head = (
            f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nHost: evil.com\r\nAuthorization: Bearer {token}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        answer = _raw_request(port, head)
        # h11 refuses it already ("Invalid HTTP request received."); the guard's check stands behind it
        assert answer.startswith(b"HTTP/1.1 400"), answer[:300]


@pytest.mark.slow
@pytest.mark.anyio
async def test_too_many_or_too_large_headers_get_431(http_server: tuple[str, str]) -> None:
    base, token = http_server
    many = {f"X-H{i}": "v" for i in range(MAX_HEADERS + 1)}
    r = await _post(base, token, **many)
    assert r.status_code == 431 and "header fields; at most 100" in r.text
    r = await _post(base, token, **{"X-Big": "a" * (MAX_HEADER_BYTES + 1024)})
    assert r.status_code == 431 and "bytes of header fields" in r.text
    async with httpx2.AsyncClient() as http:  # the open /health too
        r = await http.get(f"{base}/health", headers=many)
    assert r.status_code == 431
    # the report's case: 2,000 headers, ~120 KB. h11 refuses a head that big while it is still incomplete (400);
    # one that arrives complete in a single read reaches the guard (431)
    try:
        r = await _post(base, token, **{f"X-Header-{i:04d}": "v" * 48 for i in range(2000)})
        assert r.status_code in (400, 431)
    except (httpx2.ReadError, httpx2.WriteError):
        pass  # refused and closed while the client was still sending its head
    assert await _status(base, token, **{f"X-H{i}": "v" for i in range(50)}) == 200


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
def test_a_pipelined_request_trickled_byte_by_byte_is_disconnected(tmp_path: Path) -> None:
    """The second of two pipelined requests is read when the first one's response ends, not as data arrives: the
    deadline was never set for it, and a byte every half second (no token needed) held the connection for good."""
    env = child_env(tmp_path, GPUBOX_HTTP_REQUEST_TIMEOUT_SECONDS="1")
    with running_http_server(tmp_path, env=env) as (base, _, _, _):
        port = urlsplit(base).port
        assert port is not None
        host = f"Host: 127.0.0.1:{port}\r\n"
        with socket.create_connection(("127.0.0.1", port)) as slow:
            slow.sendall(
                f"GET /health HTTP/1.1\r\n{host}\r\nPOST /mcp HTTP/1.1\r\n{host}Content-Length: 100000\r\n\r\n".encode()
            )
            stop = threading.Event()

            def trickle() -> None:
                while not stop.wait(0.2):
                    try:
                        slow.sendall(b"{")
                    except OSError:
                        return

            sender = threading.Thread(target=trickle, daemon=True)
            sender.start()
            try:
                assert _closed_by_server(slow)
            finally:
                stop.set()
                sender.join()


@pytest.mark.slow
def test_a_kept_alive_connection_still_serves_complete_requests(tmp_path: Path) -> None:
    env = child_env(tmp_path, GPUBOX_HTTP_REQUEST_TIMEOUT_SECONDS="1")
    with running_http_server(tmp_path, env=env) as (base, _, _, _), httpx2.Client() as http:
        for _ in range(3):
            assert http.get(f"{base}/health").json()["status"] == "ok"


def test_a_configured_any_port_entry_also_allows_the_default_port(tmp_path: Path) -> None:
    from gpubox.http import security_settings
    from gpubox.settings import Settings

    s = Settings.load(
        state_dir=tmp_path / "s", allowed_hosts=["gpu-box.example:*"], allowed_origins=["https://gpu-box.example:*"]
    )
    sec = security_settings(s)
    assert matches("gpu-box.example", sec.allowed_hosts, origin=False)  # a TLS proxy on 443 sends no port
    assert matches("gpu-box.example:8443", sec.allowed_hosts, origin=False)
    assert matches("https://gpu-box.example", sec.allowed_origins, origin=True)
    assert not matches("127.0.0.1", sec.allowed_hosts, origin=False)  # the loopback defaults keep their ports
    assert not matches("gpu-box.example.evil.com", sec.allowed_hosts, origin=False)


@pytest.mark.slow
def test_a_port_less_host_passes_the_guard_and_the_sdk_behind_it(tmp_path: Path) -> None:
    env = child_env(  # capitals as a user may write them: Host and Origin compare without case
        tmp_path, GPUBOX_ALLOWED_HOSTS="GPU-Box.example:*", GPUBOX_ALLOWED_ORIGINS="https://GPU-Box.example:*"
    )
    with running_http_server(tmp_path, env=env) as (base, token, _, _):

        async def go() -> tuple[int, int, int, int]:
            return (
                await _status(base, token, Host="gpu-box.example", Origin="https://gpu-box.example"),
                await _status(base, token, Host="gpu-box.example:443"),
                await _status(base, token, Host="other.example"),
                await _status(base, token, Host="gpu-box.example", Origin="http://gpu-box.example"),
            )

        import anyio

        assert anyio.run(go) == (200, 200, 421, 403)  # the scheme is compared too
