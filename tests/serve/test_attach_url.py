"""serve_attach refuses a base URL no socket can reach with what to send instead (a port past 65535 reached httpx
and came back as an unexplained OverflowError), and keeps no record of it."""

from __future__ import annotations

import pytest
from mcp import Client

from tests.conftest import call_err, call_ok

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:99999/v1", "http://127.0.0.1:-1/v1", "http://127.0.0.1:0/v1", "http:///v1", "http://[::1/v1"],
)
async def test_a_base_url_with_no_reachable_port_or_host_is_refused_with_an_example(client: Client, url: str) -> None:
    text = await call_err(client, "serve_attach", base_url=url)
    assert "base_url " in text and "e.g. http://127.0.0.1:8000/v1" in text, text  # not the bare "Error executing tool"
    assert (await call_ok(client, "serve_list"))["engines"] == []
