"""The engine client's connection pool (tools/serve/client.py) against a small local OpenAI-style SSE server: the
real engine is tested in test_engine.py; this isolates what the pool must guarantee, quickly and on any CPU —
concurrent streams share one client, the last one out closes it (no socket outlives the calls), and a stream the
caller abandons drops its connection at once (the engine aborts it) while the others carry on."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from gpubox.tools.serve import client
from tests.conftest import free_port

pytestmark = pytest.mark.anyio


class Engine:
    """POST /v1/completions streams `max_tokens` chunks (0: until the client goes away) and records each stream's
    end: 'done' or 'dropped'."""

    def __init__(self) -> None:
        self.ends: list[str] = []
        self.dropped = threading.Event()

    async def completions(self, request: Request) -> StreamingResponse:
        body = await request.json()

        async def events() -> AsyncIterator[bytes]:
            n, sent = int(body.get("max_tokens") or 0), 0
            try:
                while n == 0 or sent < n:
                    yield f"data: {json.dumps({'choices': [{'text': 't'}]})}\n\n".encode()
                    sent += 1
                    await anyio.sleep(0.005)  # the engine's decode step
                yield b"data: [DONE]\n\n"
                self.ends.append("done")
            except BaseException:  # cancelled by the server when the client disconnects
                self.ends.append("dropped")
                self.dropped.set()
                raise

        return StreamingResponse(events(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[Engine, str]]:
    eng, port = Engine(), free_port()
    app = Starlette(routes=[Route("/v1/completions", eng.completions, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(400):  # uvicorn sets no event when it listens: poll its flag (up to 10 s)
            if server.started:
                break
            threading.Event().wait(0.025)
        assert server.started, "the local engine did not start"
        yield eng, f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(10)


async def test_concurrent_streams_share_one_client_that_the_last_one_closes(engine: tuple[Engine, str]) -> None:
    _, url = engine
    seen: list[int] = []
    results: list[int] = []

    async def one() -> None:
        n = 0
        async for _ in client.stream(url, None, "/completions", {"max_tokens": 20}, 30):
            seen.append(id(client._POOLS[_loop()][url].client))
            n += 1
        results.append(n)

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(one)
    assert results == [20, 20, 20]
    assert len(set(seen)) == 1  # one pooled client for the three
    assert url not in client._POOLS.get(_loop(), {})  # and closed when the last stream ended


async def test_an_abandoned_stream_drops_its_connection_and_the_others_finish(engine: tuple[Engine, str]) -> None:
    eng, url = engine
    eng.dropped.clear()
    finished: list[int] = []

    async def full() -> None:
        n = 0
        async for _ in client.stream(url, None, "/completions", {"max_tokens": 40}, 30):
            n += 1
        finished.append(n)

    async with anyio.create_task_group() as tg:
        tg.start_soon(full)
        async with contextlib.aclosing(client.stream(url, None, "/completions", {"max_tokens": 0}, 30)) as chunks:
            async for _ in chunks:
                break  # the caller goes away after the first token of an endless answer
        assert client._POOLS[_loop()][url].users == 1  # its slot is given back now, not by a later cleanup task
        assert await anyio.to_thread.run_sync(eng.dropped.wait, 10)  # the server saw it go, at once
    assert finished == [40]
    assert url not in client._POOLS.get(_loop(), {})


def _loop() -> object:
    import asyncio

    return asyncio.get_running_loop()
