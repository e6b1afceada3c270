"""An attached server's API key and a password in its URL are the user's secrets: serve_attach, serve_list,
serve_status and serve_stop echoed both to any client (tools/serve/schemas.py EngineStatus); they are still
what gpubox sends to that server."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.settings import Settings
from tests.conftest import call_ok
from tests.serve.test_misbehaving_server import Fake, serving

pytestmark = pytest.mark.anyio
KEY, PASSWORD = "sk-VERYSECRET123", "s3cretpw"


async def test_an_attached_servers_key_and_url_password_are_not_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str | None] = []
    original = Fake.do_GET

    def do_get(self: Fake) -> None:
        seen.append(self.headers.get("Authorization"))
        original(self)

    monkeypatch.setattr(Fake, "do_GET", do_get)
    with serving() as server:
        url = server.url.replace("http://", f"http://alice:{PASSWORD}@")
        mcp = build_server(Settings.load(state_dir=tmp_path / "state"))
        try:
            async with Client(mcp) as c:
                attached = await call_ok(c, "serve_attach", base_url=url, api_key=KEY)
                shown = [
                    attached,
                    await call_ok(c, "serve_list"),
                    await call_ok(c, "serve_status", engine_id=attached["id"]),
                    await call_ok(c, "serve_stop", engine_id=attached["id"]),
                ]
        finally:
            state_of(mcp).close()
    text = json.dumps(shown)
    assert KEY not in text and PASSWORD not in text, text
    assert attached["base_url"] == server.url.replace("http://", "http://***@") and attached["api_key"] is None
    assert "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode() in seen  # still sent to the server
