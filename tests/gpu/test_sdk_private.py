"""The MCP SDK's private attributes gpubox reads (all of them behind tools/gpu/session.py's sdk_session_facts) still
exist and still mean what gpubox takes them to mean, checked on real sessions of an in-memory server.

A failure here after an SDK upgrade means: find the attribute's new name (or a public replacement) in
mcp/server/session.py and update sdk_session_facts; until then idle warnings are not broadcast to clients.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from mcp import Client
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gpubox import services
from gpubox.app import build_server, state_of
from gpubox.settings import Settings
from gpubox.tools.gpu.session import _SDK_PRIVATE, sdk_session_facts
from tests.conftest import call_ok

pytestmark = pytest.mark.anyio


def spy_on_sessions(mcp: Any) -> list[Any]:
    """The ServerSession of every tools/call the server handles, recorded by a middleware like gpubox's own."""
    seen: list[Any] = []

    async def record(ctx: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
        if ctx.method == "tools/call":
            seen.append(ctx.session)
        return await call_next(ctx)

    mcp.middleware.append(record)
    return seen


def assert_private_attributes(session: Any) -> None:
    for name in _SDK_PRIVATE:
        assert hasattr(session, name), (
            f"the MCP SDK's {type(session).__module__}.{type(session).__qualname__} has no '{name}' any more: "
            "update sdk_session_facts in tools/gpu/session.py for this SDK version"
        )


async def test_a_handshake_era_connection_is_one_weak_key_across_requests_and_takes_unsolicited_logs(
    settings: Settings,
) -> None:
    mcp = build_server(settings)
    seen = spy_on_sessions(mcp)
    try:
        async with Client(mcp, mode="legacy") as first, Client(mcp, mode="legacy") as second:
            await call_ok(first, "gpu_status")
            await call_ok(first, "gpu_status")
            await call_ok(second, "gpu_status")
            assert len(seen) == 3
            for session in seen:
                assert_private_attributes(session)
            a, b, other = (sdk_session_facts(s) for s in seen)
            assert a.connection is not None and weakref.ref(a.connection)() is a.connection  # a WeakKeyDictionary key
            assert seen[0] is not seen[1] and a.connection is b.connection, "one connection, a session per request"
            assert other.connection is not a.connection, "each client has its own connection"
            assert not a.log_is_request_scoped and not other.log_is_request_scoped
            assert services.session_meter(state_of(mcp)).broadcast_warning("test") == 2  # both clients, once each
    finally:
        state_of(mcp).close()


async def test_a_2026_protocol_session_is_known_to_take_log_messages_only_inside_its_requests(
    settings: Settings,
) -> None:
    mcp = build_server(settings)
    seen = spy_on_sessions(mcp)
    try:
        async with Client(mcp, mode="auto") as client:
            await call_ok(client, "gpu_status")
            [session] = seen
            assert session.protocol_version in MODERN_PROTOCOL_VERSIONS, "the in-memory client no longer speaks 2026"
            assert_private_attributes(session)
            facts = sdk_session_facts(session)
            assert facts.connection is not None and facts.log_is_request_scoped
            assert services.session_meter(state_of(mcp)).broadcast_warning("test") == 0
    finally:
        state_of(mcp).close()


def test_a_session_without_the_attributes_degrades_to_no_unsolicited_messages() -> None:
    facts = sdk_session_facts(object())
    assert facts.connection is None and facts.log_is_request_scoped
