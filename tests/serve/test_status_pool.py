"""Status probes of a hung engine never take the worker threads every client shares: with 45 serve_status calls
blocked on an engine that does not answer, another tool still answers."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.settings import Settings
from tests.conftest import call_ok, wait_until

pytestmark = pytest.mark.anyio


class Hung(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.hang, self.release, self.waiting = False, threading.Event(), 0
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Hung

    def log_message(self, *_: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.endswith("/health") and self.server.hang:
            self.server.waiting += 1
            self.server.release.wait(120)
        body = json.dumps({"data": [{"id": "m"}]} if self.path.endswith("/models") else {}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextlib.contextmanager
def hung() -> Iterator[Hung]:
    server = Hung()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


async def test_status_calls_on_a_hung_engine_leave_threads_for_every_other_tool(tmp_path: Path) -> None:
    settings = Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path], serve_probe_timeout_s=120)
    mcp = build_server(settings)
    try:
        with hung() as server:
            async with Client(mcp) as c, anyio.create_task_group() as tg:
                engine_id = (await call_ok(c, "serve_attach", base_url=server.url))["id"]
                server.hang = True

                async def status() -> None:
                    await call_ok(c, "serve_status", engine_id=engine_id)

                for _ in range(45):  # more than anyio's 40 shared worker threads
                    tg.start_soon(status)
                await wait_until(lambda: server.waiting >= 1, timeout=60)
                with anyio.fail_after(60):  # it waited for the probes' 120 s timeout when they held every thread
                    await call_ok(c, "box_plan")
                assert not server.release.is_set()
                server.release.set()
    finally:
        state_of(mcp).close()
