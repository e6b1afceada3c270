"""Where `gpubox serve --transport http` listens and who it lets in: a scheme's default port, an IPv6 wildcard,
a port already taken, host/origin entries that could never match, and a prompt exit on SIGTERM."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from pydantic import ValidationError

from gpubox.errors import ConfigError
from gpubox.http import check_port, connect_hint, security_settings
from gpubox.httpguard import matches
from gpubox.settings import Settings
from tests.conftest import running_http_server


def settings(tmp_path: Path, **kw: object) -> Settings:
    return Settings.load(state_dir=tmp_path / "s", **kw)  # type: ignore[arg-type]


def test_on_port_80_the_loopback_names_pass_without_a_port(tmp_path: Path) -> None:
    # clients leave the default port out of Host (curl drops an explicit ':80'): every one got 421
    on80 = security_settings(settings(tmp_path, port=80))
    assert matches("127.0.0.1", on80.allowed_hosts, origin=False)
    assert matches("localhost", on80.allowed_hosts, origin=False)
    assert matches("http://localhost", on80.allowed_origins, origin=True)
    other = security_settings(settings(tmp_path, port=8765))
    assert not matches("127.0.0.1", other.allowed_hosts, origin=False)  # that request went to another port


def test_an_ipv6_wildcard_bind_points_clients_at_ipv6(tmp_path: Path) -> None:
    # asyncio binds '::' IPv6-only: the hint said http://127.0.0.1:<port>, which refused connections
    hint = connect_hint(settings(tmp_path, host="::", token="a-good-long-token-value"))
    assert "http://[::1]:" in hint and "127.0.0.1" not in hint


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("allowed_origins", "https://gpu-box.example/"),
        ("allowed_origins", "*"),
        ("allowed_hosts", "gpu-box.example/"),
        ("allowed_hosts", "Bad Host"),
        ("allowed_hosts", "*"),
    ],
)
def test_a_host_or_origin_entry_that_can_match_nothing_is_refused_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str, value: str
) -> None:
    monkeypatch.setenv(f"GPUBOX_{field.upper()}", value)  # it failed closed: every client refused, nothing said
    with pytest.raises((ValidationError, ConfigError), match="matches no request"):
        settings(tmp_path)


def test_good_host_and_origin_entries_still_load(tmp_path: Path) -> None:
    s = settings(
        tmp_path, allowed_hosts=["gpu-box.example:*", "[fd00::1]", "10.0.0.2:8765"], allowed_origins=["https://a.b"]
    )
    assert s.allowed_hosts == ["gpu-box.example:*", "[fd00::1]", "10.0.0.2:8765"]


def test_a_port_in_use_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}.*--port"):
            check_port(settings(tmp_path, port=port))


def test_an_ipv6_wildcard_is_not_refused_for_an_ipv4_listener_on_the_port(tmp_path: Path) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this host")
    with socket.socket() as busy:  # asyncio binds '::' IPv6-only, so uvicorn would listen fine beside it
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        check_port(settings(tmp_path, host="::", port=busy.getsockname()[1], token="a-good-long-token-value"))


def test_a_host_that_does_not_resolve_is_named_as_such(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not resolve"):
        check_port(settings(tmp_path, host="no-such-host.invalid", token="a-good-long-token-value"))


@pytest.mark.slow
def test_sigterm_during_a_long_generation_exits_promptly(tmp_path: Path) -> None:
    """uvicorn waited for running calls without limit: a 3,000-token generation kept a server that had closed
    its socket alive for minutes after SIGTERM (past systemd's stop timeout, whose SIGKILL skips the cleanup)."""
    with running_http_server(tmp_path) as (base, token, proc, log):

        async def call_then_terminate() -> None:
            generating = anyio.Event()

            async def on_progress(*_: object) -> None:
                generating.set()

            async def generate(client: Client) -> None:
                with contextlib.suppress(Exception):  # the server goes away under the call: no result is expected
                    args = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": 3000, "temperature": 0}
                    await client.call_tool("infer_complete", args, progress_callback=on_progress)

            http = httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=600)
            )
            with contextlib.suppress(Exception):
                async with (
                    http,
                    Client(streamable_http_client(f"{base}/mcp", http_client=http)) as client,
                    anyio.create_task_group() as tg,
                ):
                    tg.start_soon(generate, client)
                    await generating.wait()
                    proc.send_signal(signal.SIGTERM)
                    await anyio.to_thread.run_sync(wait_exit, proc, log)
                    tg.cancel_scope.cancel()

        anyio.run(call_then_terminate)
        assert proc.returncode in (0, -signal.SIGTERM), log.read_text()[-2000:]  # uvicorn re-raises the signal


def wait_exit(proc: subprocess.Popen[bytes], log: Path) -> None:
    try:
        proc.wait(timeout=30)  # grace 5 s, then the call is cancelled; it ran on for minutes before
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server was still running 30 s after SIGTERM:\n{log.read_text()[-2000:]}")
