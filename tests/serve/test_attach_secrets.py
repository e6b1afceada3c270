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
from tests.conftest import call_err, call_ok
from tests.serve.test_misbehaving_server import Fake, serving

pytestmark = pytest.mark.anyio
KEY, PASSWORD = "sk-VERYSECRET123", "s3cretpw"


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    seen: list[str | None] = []
    original = Fake.do_GET

    def do_get(self: Fake) -> None:
        seen.append(self.headers.get("Authorization"))
        original(self)

    monkeypatch.setattr(Fake, "do_GET", do_get)
    return seen


@pytest.mark.parametrize("how", ["url_password", "api_key"])
async def test_an_attached_servers_key_and_url_password_are_not_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    seen = _recording(monkeypatch)
    with serving() as server:
        url = server.url.replace("http://", f"http://alice:{PASSWORD}@") if how == "url_password" else server.url
        mcp = build_server(Settings.load(state_dir=tmp_path / "state"))
        try:
            async with Client(mcp) as c:
                attached = await call_ok(c, "serve_attach", base_url=url, api_key=KEY if how == "api_key" else None)
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
    assert attached["api_key"] is None
    if how == "url_password":
        assert attached["base_url"] == server.url.replace("http://", "http://***@")
        assert "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode() in seen  # still sent
    else:
        assert f"Bearer {KEY}" in seen  # still sent to the server


async def test_a_url_password_and_an_api_key_together_are_refused_before_any_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """httpx made Basic auth of the URL's user:password, replacing the Bearer key on every request."""
    seen = _recording(monkeypatch)
    with serving() as server:
        url = server.url.replace("http://", f"http://alice:{PASSWORD}@")
        mcp = build_server(Settings.load(state_dir=tmp_path / "state"))
        try:
            async with Client(mcp) as c:
                text = await call_err(c, "serve_attach", base_url=url, api_key=KEY)
                listed = await call_ok(c, "serve_list")
        finally:
            state_of(mcp).close()
    assert "not both" in text and KEY not in text and PASSWORD not in text, text
    assert seen == [] and json.dumps(listed).count('"id"') == 0
