"""End-to-end: `gpubox serve` as a real subprocess over stdio, streamable HTTP and SSE."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import GPUBOX, call_ok, child_env

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}
JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_stdio_server_answers_the_official_client(tmp_path: Path, mode: str) -> None:
    params = StdioServerParameters(command=GPUBOX, args=["serve"], env=child_env(tmp_path))
    async with Client(params, mode=mode) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert "gpu_status" in names
        assert "host" in await call_ok(client, "gpu_status")


async def test_http_without_a_token_gets_401(http_server: tuple[str, str]) -> None:
    base, _ = http_server
    async with httpx2.AsyncClient() as http:
        r = await http.post(f"{base}/mcp", json=INIT, headers=JSON_HEADERS)
        assert r.status_code == 401
        r = await http.post(f"{base}/mcp", json=INIT, headers={**JSON_HEADERS, "Authorization": "Bearer wrong"})
        assert r.status_code == 401
        r = await http.get(f"{base}/sse", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401


async def test_http_rejects_a_foreign_host_with_421_and_a_foreign_origin_with_403(
    http_server: tuple[str, str],
) -> None:
    base, token = http_server
    auth = {**JSON_HEADERS, "Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient() as http:
        r = await http.post(f"{base}/mcp", json=INIT, headers={**auth, "Host": "evil.example"})
        assert r.status_code == 421
        r = await http.post(f"{base}/mcp", json=INIT, headers={**auth, "Origin": "http://evil.example"})
        assert r.status_code == 403


async def test_http_bounds_the_request_body(http_server: tuple[str, str]) -> None:
    base, token = http_server
    big = b'{"x": "' + b"a" * (5 * 1024 * 1024) + b'"}'
    async with httpx2.AsyncClient() as http:
        r = await http.post(f"{base}/mcp", content=big, headers={**JSON_HEADERS, "Authorization": f"Bearer {token}"})
        assert r.status_code == 413


async def test_http_health_answers_without_auth(http_server: tuple[str, str]) -> None:
    base, _ = http_server
    async with httpx2.AsyncClient() as http:
        r = await http.get(f"{base}/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"


async def test_streamable_http_with_the_token_runs_tools(http_server: tuple[str, str]) -> None:
    base, token = http_server
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=120))
    async with http, Client(streamable_http_client(f"{base}/mcp", http_client=http)) as client:
        await call_ok(client, "gpu_status")


async def test_sse_endpoint_with_the_token_runs_tools(http_server: tuple[str, str]) -> None:
    base, token = http_server
    async with Client(sse_client(f"{base}/sse", headers={"Authorization": f"Bearer {token}"})) as client:
        res = await client.read_resource("gpu://status")
        assert "available" in res.contents[0].text  # type: ignore[union-attr]
        await call_ok(client, "gpu_status")


def test_binding_all_interfaces_without_a_token_is_refused(tmp_path: Path) -> None:
    out = subprocess.run(
        [GPUBOX, "serve", "--transport", "http", "--host", "0.0.0.0", "--port", "1"],
        env=child_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "refusing to bind 0.0.0.0" in out.stderr and "--token-file" in out.stderr


def test_python_m_gpubox_is_the_same_cli(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "gpubox", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("gpubox ")
