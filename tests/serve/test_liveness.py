"""An engine that stops answering, through the MCP tools: a small OpenAI-compatible server on a thread, attached
with serve_attach (or recorded as a vLLM engine gpubox runs), whose chat stream can be held and whose health probe
can hang as a hung process's does. A request to it ends with what to do long before the 600 s read timeout and the
engine reads 'unresponsive' until it answers again; an engine that answers its probe is waited on however long it
holds a request (a long prefill, a queue)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from gpubox import services
from gpubox.app import build_server, state_of
from gpubox.errors import UpstreamError
from gpubox.settings import Settings
from gpubox.tools.serve.liveness import Liveness, watching
from gpubox.tools.serve.schemas import EngineRecord
from tests.conftest import call_err, call_ok

pytestmark = pytest.mark.anyio
HI = [{"role": "user", "content": "hi"}]
WORDS = ["Hello", " there", "!"]


class Engine:
    """GET /v1/models and (with `has_health`) GET /health answer at once, unless `sick` is set: then every GET is
    read and never answered, as by a hung process. POST /v1/chat/completions streams `before` chunks, waits for
    `release` (a hung engine or a long prefill), then streams the rest."""

    def __init__(self, has_health: bool = True, before: int = 0, health_status: int = 200) -> None:
        self.has_health, self.before, self.health_status = has_health, before, health_status
        self.sick, self.release, self.held, self.closing = (threading.Event() for _ in range(4))
        self.chats = 0
        self.probes = 0  # GETs of the probe's path
        self._counted = threading.Condition()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # the listener was shut down: the test is over
                return
            threading.Thread(target=self.answer, args=(conn,), daemon=True).start()

    def wait_probes(self, n: int, timeout: float = 30.0) -> bool:
        with self._counted:
            return self._counted.wait_for(lambda: self.probes >= n, timeout)

    def answer(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # the client hangs up on a request it gave up
            method, path = read_request(conn)
            if method == "GET":
                self.get(conn, path)
            else:
                self.chat(conn)

    def get(self, conn: socket.socket, path: str) -> None:
        if path.endswith("/health") and not self.has_health:
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        if path.endswith("/health") and self.health_status != 200:  # a gateway that passes no /health on
            conn.sendall(b"HTTP/1.1 %d No\r\nContent-Length: 0\r\nConnection: close\r\n\r\n" % self.health_status)
            return
        if path.endswith("/health") or (path.endswith("/models") and not self.has_health):
            with self._counted:
                self.probes += 1
                self._counted.notify_all()
        if self.sick.is_set():
            self.closing.wait()
            return
        body = b"{}" if path.endswith("/health") else json.dumps({"data": [{"id": "m"}]}).encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))

    def chat(self, conn: socket.socket) -> None:
        self.chats += 1
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        for i, word in enumerate(WORDS):
            if i == self.before:
                self.held.set()
                self.release.wait()
                if self.closing.is_set():
                    return
            conn.sendall(b"data: %s\n\n" % json.dumps({"choices": [{"delta": {"content": word}}]}).encode())
        done = {"choices": [{"delta": {}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 1}}
        conn.sendall(b"data: %s\n\ndata: [DONE]\n\n" % json.dumps(done).encode())

    def close(self) -> None:
        self.closing.set()
        self.release.set()
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()


def read_request(conn: socket.socket) -> tuple[str, str]:
    data = b""
    while b"\r\n\r\n" not in data:
        got = conn.recv(65536)
        if not got:
            raise OSError("closed")
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    sizes = [int(v) for k, _, v in (x.partition(":") for x in lines[1:]) if k.strip().lower() == "content-length"]
    while len(body) < (sizes[0] if sizes else 0):
        body += conn.recv(65536)
    method, path, _ = lines[0].split(" ", 2)
    return method, path


@contextlib.contextmanager
def running(engine: Engine) -> Iterator[Engine]:
    thread = threading.Thread(target=engine.serve, daemon=True)
    thread.start()
    try:
        yield engine
    finally:
        engine.close()
        thread.join(10)


@contextlib.asynccontextmanager
async def gpubox(tmp_path: Path, probe_timeout: float = 2.0) -> AsyncIterator[tuple[Client, Any]]:
    """A gpubox server that probes an engine after 0.2 s without a byte, and gives a probe `probe_timeout` s: short
    where a probe must hang, long where every probe must be answered (a probe is a thread, an event loop and an HTTP
    client: a loaded CI box can take more than a second for one)."""
    settings = Settings.load(state_dir=tmp_path / "state", serve_probe_after_s=0.2, serve_probe_timeout_s=probe_timeout)
    mcp = build_server(settings)
    try:
        async with Client(mcp) as c:
            yield c, mcp
    finally:
        state_of(mcp).close()


async def wait_event(event: threading.Event) -> bool:
    return await anyio.to_thread.run_sync(event.wait, 30.0)


@pytest.mark.parametrize("before", [0, 2], ids=["before-the-first-byte", "between-chunks"])
@pytest.mark.parametrize("has_health", [True, False], ids=["health", "models-only"])
async def test_a_request_to_an_attached_server_that_stops_answering_ends_at_once_with_what_to_do(
    tmp_path: Path, before: int, has_health: bool
) -> None:
    with running(Engine(has_health=has_health, before=before)) as engine:
        async with gpubox(tmp_path) as (c, _):
            att = await call_ok(c, "serve_attach", base_url=engine.url)
            assert att["state"] == "attached" and att["healthy"]
            engine.sick.set()  # the server hangs: its requests and its probe go unanswered
            began = time.monotonic()
            text = await call_err(c, "infer_chat", messages=HI, model="m")
            assert time.monotonic() - began < 30  # not the 600 s read timeout: one 0.2 s silence, one 2 s probe
            assert engine.held.is_set() and "stopped answering" in text and "its health probe failed" in text, text
            assert f"serve_stop engine_id='{att['id']}'" in text and "restart the server" in text, text

            listed = (await call_ok(c, "serve_list"))["engines"]
            assert [(e["id"], e["state"], e["healthy"]) for e in listed] == [(att["id"], "unresponsive", False)]
            st = await call_ok(c, "serve_status", engine_id=att["id"])
            assert st["state"] == "unresponsive" and "restart the server" in st["next_step"], st

            # known silent: the next request is refused after one probe, never sent to the server
            assert "stopped answering" in await call_err(c, "infer_chat", messages=HI, model="m")
            assert engine.chats == 1

            engine.sick.clear()  # the server answers again
            engine.release.set()
            st = await call_ok(c, "serve_status", engine_id=att["id"])
            assert st["state"] == "attached" and st["healthy"] and st["error"] is None, st
            res = await call_ok(c, "infer_chat", messages=HI, model="m")
            assert res["text"] == "".join(WORDS)


async def test_an_engine_that_answers_its_probe_is_waited_on_however_long_it_holds_the_request(
    tmp_path: Path,
) -> None:
    with running(Engine(before=1)) as engine:
        async with gpubox(tmp_path, probe_timeout=10) as (c, _):
            att = await call_ok(c, "serve_attach", base_url=engine.url)
            results: list[dict[str, Any]] = []
            finished = anyio.Event()

            async def chat() -> None:
                results.append(await call_ok(c, "infer_chat", messages=HI, model="m"))
                finished.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(chat)
                assert await wait_event(engine.held)
                probes = engine.probes
                # three silences of 0.2 s came and went, each probe answered: the request is still waited on
                assert await anyio.to_thread.run_sync(engine.wait_probes, probes + 3)
                assert not finished.is_set() and not results
                st = await call_ok(c, "serve_status", engine_id=att["id"])
                assert st["state"] == "attached" and st["healthy"]
                engine.release.set()  # the long prefill is over
                with anyio.fail_after(30):
                    await finished.wait()
            assert results[0]["text"] == "".join(WORDS) and results[0]["finish_reason"] == "stop"


async def test_a_hung_vllm_engine_reads_unresponsive_names_serve_stop_and_is_ready_again_once_it_answers(
    tmp_path: Path,
) -> None:
    with running(Engine()) as engine:
        async with gpubox(tmp_path) as (c, mcp):
            engines = services.serve(state_of(mcp)).engines
            rec = EngineRecord(
                id="abc123", engine="vllm", model="m", source="x", base_url=engine.url, started=time.time(),
                state="ready",
            )  # fmt: skip
            engines.store.write(rec)  # an engine gpubox runs (no pid: its process is not checked here)
            engine.sick.set()
            text = await call_err(c, "infer_chat", messages=HI, model="m")
            assert "stopped answering" in text and "serve_stop engine_id='abc123' ends a hung engine" in text, text
            st = await call_ok(c, "serve_status", engine_id="abc123")
            assert st["state"] == "unresponsive" and not st["healthy"] and "serve_start" in st["next_step"], st
            assert st["error"] is not None and "health probe" in st["error"]

            engine.sick.clear()
            st = await call_ok(c, "serve_status", engine_id="abc123")
            assert st["state"] == "ready" and st["healthy"] and st["error"] is None, st


@pytest.mark.parametrize("status", [401, 403, 405])
async def test_a_server_whose_health_route_is_refused_but_whose_models_answer_is_attached_and_served(
    tmp_path: Path, status: int
) -> None:
    # an auth gateway in front of the server refuses paths it does not pass on: the model list is the probe then
    with running(Engine(health_status=status)) as engine:
        async with gpubox(tmp_path, probe_timeout=10) as (c, _):
            att = await call_ok(c, "serve_attach", base_url=engine.url)
            assert att["state"] == "attached" and att["healthy"], att
            engine.release.set()  # nothing held: the answer streams at once
            assert (await call_ok(c, "infer_chat", messages=HI, model="m"))["text"] == "".join(WORDS)
            st = await call_ok(c, "serve_status", engine_id=att["id"])
            assert st["state"] == "attached" and st["healthy"], st


async def test_a_chunk_that_comes_while_a_probe_fails_keeps_the_request_and_the_engine_answering() -> None:
    # a streaming engine whose /health is slower than the probe's limit under load is not 'unresponsive'
    probing, verdict = threading.Event(), threading.Event()
    recorded: list[bool] = []
    probes: list[int] = []

    def probe() -> bool:
        # only the first probe is the slow one that fails: a later one answering False at once would race the
        # test's touch below (under CI load it can finish first, and then the engine was silent through it)
        probes.append(1)
        probing.set()
        if len(probes) > 1:
            return True
        verdict.wait(30)
        return False

    rec = EngineRecord(
        id="e1", engine="vllm", model="m", source="x", base_url="http://127.0.0.1:9/v1", started=0.0, state="ready"
    )
    live = Liveness(rec, 0.05, probe, recorded.append)
    with anyio.fail_after(30):
        async with watching(live) as touch:
            assert await wait_event(probing)  # silent for 0.05 s: the probe runs
            touch()  # a chunk arrives meanwhile
            verdict.set()  # then the probe gives up
            probing.clear()
            assert await wait_event(probing)  # the watch goes on (its next probe), the request was not cancelled
            touch()
    assert False not in recorded


async def test_a_request_whose_engine_stays_silent_through_a_probe_is_ended_and_recorded() -> None:
    recorded: list[bool] = []
    rec = EngineRecord(
        id="e2", engine="vllm", model="m", source="x", base_url="http://127.0.0.1:9/v1", started=0.0, state="ready"
    )
    live = Liveness(rec, 0.05, lambda: False, recorded.append)
    with anyio.fail_after(30), pytest.raises(UpstreamError, match="stopped answering"):
        async with watching(live):
            await anyio.sleep_forever()  # the request waits on an engine that sends nothing
    assert recorded == [False]
