"""A model server that answers wrongly is the server's fault, not the caller's: through the MCP tools each such
answer ends in an UpstreamError whose message names the engine and its URL, quotes what the server sent and says
what to do about the server (its log, a restart, a detach), never an input error that sends the agent off to
retry with other arguments. Two answers are not the server's fault: a base_url that gives no model list at
serve_attach is the caller's argument to fix, and an error the engine reports inside its stream is classified by
its code (a refused request, an overload, a failure). The misbehaving server is test_misbehaving_server's, with
a few more answers added here. Also: the steps of a request that could block (a long answer's JSON parse, the
first TLS context) run off the event loop every client shares."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import ssl
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer

from gpubox import services
from gpubox.app import build_server, state_of
from gpubox.errors import BusyError, GpuboxError, InvalidInputError, UpstreamError
from gpubox.settings import Settings
from gpubox.tools.inference.backends import GenParams
from gpubox.tools.serve import client, remote
from gpubox.tools.serve.schemas import EngineRecord
from tests.conftest import call_err, call_ok
from tests.serve.test_misbehaving_server import Fake, Server, attached, say, serving

pytestmark = pytest.mark.anyio


def _json_reply(handler: Fake, body: bytes) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    with contextlib.suppress(OSError):  # the client hangs up at its cap
        handler.wfile.write(body)


def _cut_chunked(handler: Fake) -> None:
    """One chunk of a chunked stream, then the connection closes without the last chunk: what a crashed vLLM
    (uvicorn sends chunked) leaves the client with."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    event = b'data: {"choices": [{"delta": {"content": "The answer is"}}]}\n\n'
    handler.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
    handler.wfile.flush()
    handler.close_connection = True


def _error_chunk(error: Any) -> Callable[[Fake], None]:
    """A stream whose one chunk is an error object, then [DONE]: how vLLM reports an error raised while it streams
    (create_streaming_error_response: {"error": {"message", "type", "param", "code"}}, BadRequestError/400 unless
    the exception says otherwise)."""

    def answer(handler: Fake) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.close_connection = True
        handler.event({"choices": [{"delta": {"content": "The"}}]})
        handler.event({"error": error})
        handler.wfile.write(b"data: [DONE]\n\n")
        handler.wfile.flush()

    return answer


# answers Fake has not: chosen, like its own, by the last message
EXTRA: dict[str, Callable[[Fake], None]] = {
    "err400": _error_chunk(
        {"message": "'guided_json' is not a valid JSON schema", "type": "BadRequestError", "param": None, "code": 400}
    ),
    "errtype": _error_chunk({"message": "stop must be a list", "type": "invalid_request_error", "code": None}),
    "err429": _error_chunk({"message": "too many requests", "type": "RateLimitError", "code": 429}),
    "err503": _error_chunk({"message": "engine is draining", "type": "ServiceUnavailableError", "code": 503}),
    "err500": _error_chunk({"message": "Internal server error", "type": "InternalServerError", "code": 500}),
    "errtext": _error_chunk("CUDA error: an illegal memory access"),
    "badjson": lambda h: _json_reply(h, b"{not json at all"),
    "bigjson": lambda h: _json_reply(h, b'{"choices": "' + b"z" * (client.MAX_BODY + 2**20) + b'"}'),
    "http500": lambda h: h.reply({"error": "engine core died"}, 500),
    "http400": lambda h: h.reply({"error": {"message": "max_tokens is too large for this model"}}, 400),
    "cutchunk": _cut_chunked,
}


@pytest.fixture
def extra_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Fake.do_POST

    def do_post(self: Fake) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        answer = EXTRA.get(json.loads(raw)["messages"][-1]["content"])
        if answer is not None:
            answer(self)
            return
        self.rfile = io.BufferedReader(io.BytesIO(raw))  # type: ignore[assignment]  # read again by Fake's own
        original(self)

    monkeypatch.setattr(Fake, "do_POST", do_post)


def assert_upstream(text: str, server: str, url: str, sent: str | None) -> None:
    """The UpstreamError's message: names the server and URL, quotes what it sent, says what to do about it."""
    assert UpstreamError.LEAD in text, text
    assert server in text and url in text, text
    if sent is not None:
        assert "it sent: " in text and sent in text, text
    assert "restart" in text and "serve_stop" in text, text  # check/restart it, or detach it
    assert "refused the request" not in text, text  # not the input error's wording


@pytest.mark.parametrize(
    ("mode", "fault", "sent"),
    [
        ("notjson", "sent a chunk that is not JSON", "{oops"),
        ("badcontent", "sent a malformed chunk (the content must be a string)", '"content": 5'),
        ("truncated", "closed its stream after 1 chunks without [DONE]", None),
        ("noline", "sent a line longer than 1 MB", "data: yyyy"),
        ("badjson", "answered JSON that does not parse", "{not json at all"),
        ("bigjson", "answered more than 8 MB to one request", '{"choices": "zzzz'),
        ("cutchunk", "broke off its answer", None),
    ],
)
@pytest.mark.usefixtures("extra_modes")
async def test_a_server_that_answers_wrongly_is_an_upstream_error(
    tmp_path: Path, mode: str, fault: str, sent: str | None
) -> None:
    with serving() as server:
        async with attached(tmp_path, server) as (c, engine_id):
            text = await call_err(c, "infer_chat", model="fake", messages=say(mode), max_tokens=5)
            assert_upstream(text, f"engine {engine_id} ('fake' at {server.url})", server.url, sent)
            assert fault in text, text
            assert f"serve_stop engine_id='{engine_id}'" in text, text


@pytest.mark.usefixtures("extra_modes")
async def test_a_server_failure_is_an_upstream_error_and_a_refused_request_stays_an_input_error(
    tmp_path: Path,
) -> None:
    with serving() as server:
        async with attached(tmp_path, server) as (c, engine_id):
            text = await call_err(c, "infer_chat", model="fake", messages=say("http500"), max_tokens=5)
            assert_upstream(text, f"engine {engine_id} ('fake' at {server.url})", server.url, "engine core died")
            assert "failed the request (HTTP 500)" in text, text
            # a 4xx refuses the request's own arguments (here max_tokens): that one is the caller's to change
            text = await call_err(c, "infer_chat", model="fake", messages=say("http400"), max_tokens=5)
            assert f"engine {engine_id}" in text and "refused the request (HTTP 400)" in text, text
            assert "max_tokens is too large" in text and UpstreamError.LEAD not in text, text


async def test_a_server_that_went_away_is_an_upstream_error(tmp_path: Path) -> None:
    with serving() as server:
        async with attached(tmp_path, server) as (c, engine_id):
            server.shutdown()
            server.server_close()
            text = await call_err(c, "infer_chat", model="fake", messages=say("finished"), max_tokens=5)
            assert_upstream(text, f"engine {engine_id} ('fake' at {server.url})", server.url, None)
            assert "did not answer (ConnectError" in text, text


async def test_a_server_that_stopped_answering_its_probe_is_an_upstream_error(tmp_path: Path) -> None:
    with serving() as server:
        async with attached(tmp_path, server) as (c, engine_id):
            server.shutdown()
            server.server_close()
            st = await call_ok(c, "serve_status", engine_id=engine_id)
            assert st["state"] == "unresponsive", st
            text = await call_err(c, "infer_chat", model="fake", messages=say("finished"), max_tokens=5)
            assert_upstream(text, f"engine {engine_id} serving 'fake' at {server.url}", server.url, None)
            assert "stopped answering: its health probe failed" in text, text


async def test_attaching_a_url_that_is_not_a_model_list_is_an_input_error(tmp_path: Path) -> None:
    """The caller's own base_url at fault: attach refuses it as an argument to change, quoting what the URL sent;
    the same broken list from a server attached earlier is the server's fault (serve_status's error)."""
    with serving() as server:
        mcp = build_server(Settings.load(state_dir=tmp_path / "state"))
        try:
            async with Client(mcp) as c:
                server.models = ({"data": "oops"}, 200)
                text = await call_err(c, "serve_attach", base_url=server.url)
                assert f"did not return an OpenAI model list at {server.url}/models" in text, text
                assert "usually ending in /v1" in text and '{"data": "oops"}' in text, text
                assert UpstreamError.LEAD not in text and "serve_stop" not in text, text  # no engine to stop yet
                with pytest.raises(InvalidInputError, match="OpenAI model list"):
                    client.models(server.url, None, attaching=True)
                assert (await call_ok(c, "serve_list"))["engines"] == []
                server.models = ({"data": [{"id": "fake"}]}, 200)
                engine_id = (await call_ok(c, "serve_attach", base_url=server.url))["id"]
                server.models = ({"data": "oops"}, 200)  # broken later: the server's fault now
                st = await call_ok(c, "serve_status", engine_id=engine_id)
                with pytest.raises(UpstreamError, match="did not return an OpenAI model list"):
                    client.models(server.url, None)
        finally:
            state_of(mcp).close()
    assert not st["healthy"] and UpstreamError.LEAD in st["error"], st
    assert "did not return an OpenAI model list" in st["error"] and '{"data": "oops"}' in st["error"], st


# --- an error the engine reports inside its stream ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "kind", "said"),
    [
        ("err400", InvalidInputError, "'guided_json' is not a valid JSON schema"),
        ("errtype", InvalidInputError, "stop must be a list"),
        ("err429", BusyError, "too many requests"),
        ("err503", BusyError, "engine is draining"),
        ("err500", UpstreamError, "Internal server error"),
        ("errtext", UpstreamError, "CUDA error: an illegal memory access"),
    ],
)
@pytest.mark.usefixtures("extra_modes")
async def test_an_error_the_engine_reports_in_its_stream_is_classified_by_its_code(
    mode: str, kind: type[GpuboxError], said: str
) -> None:
    """vLLM's in-stream {"error": {...}} chunk: a 4xx (or an invalid-request type) refuses the request's arguments,
    a 429/503 is an overload to retry, anything else the server's fault; each with the engine's own message."""
    with serving() as server:
        url = server.url
        rec = EngineRecord(
            id="e1",
            engine="openai",
            model="fake",
            source=url,
            base_url=url,
            started=0.0,
            state="attached",
        )
        with anyio.fail_after(30), pytest.raises(GpuboxError) as caught:
            await remote.generate(rec, say(mode), None, GenParams(max_tokens=5), None)
    assert type(caught.value) is kind, caught.value
    text = str(caught.value)
    assert said in text and f"engine e1 ('fake' at {server.url})" in text, text
    assert "malformed chunk" not in text, text
    if kind is UpstreamError:
        assert UpstreamError.LEAD in text and "reported an error" in text, text
    else:
        assert UpstreamError.LEAD not in text, text


@pytest.mark.usefixtures("extra_modes")
async def test_an_engine_refusing_the_request_mid_stream_is_an_input_error_through_the_tools(tmp_path: Path) -> None:
    with serving() as server:
        async with attached(tmp_path, server) as (c, engine_id):
            text = await call_err(c, "infer_chat", model="fake", messages=say("err400"), max_tokens=5)
    assert f"engine {engine_id}" in text and "refused the request" in text, text
    assert "'guided_json' is not a valid JSON schema" in text and UpstreamError.LEAD not in text, text


# --- off the event loop ------------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def two_clients(tmp_path: Path, server: Server) -> AsyncIterator[tuple[Client, Client, MCPServer[Any], str]]:
    """Two MCP clients of one gpubox server with `server` attached: the loop they share is the one to keep free."""
    mcp = build_server(Settings.load(state_dir=tmp_path / "state"))
    try:
        async with Client(mcp) as a, Client(mcp) as b:
            engine_id = (await call_ok(a, "serve_attach", base_url=server.url))["id"]
            yield a, b, mcp, engine_id
    finally:
        state_of(mcp).close()


@contextlib.contextmanager
def held_step() -> Iterator[tuple[Callable[[Callable[[], Any]], Any], threading.Event, threading.Event, list[bool]]]:
    """A blocking step that waits for the test's release, its first time only. On the loop, nothing else runs
    until it gives up (10 s): `released` then says False, whatever the timing of the rest."""
    entered, release = threading.Event(), threading.Event()
    released: list[bool] = []

    def hold(then: Callable[[], Any]) -> Any:
        if not entered.is_set():
            entered.set()
            released.append(release.wait(10))
        return then()

    try:
        yield hold, entered, release, released
    finally:
        release.set()


async def _meanwhile(
    a: Client, b: Client, args: dict[str, Any], entered: threading.Event, release: threading.Event
) -> None:
    """Client A's infer_chat is held in its step; client B's serve_list completes meanwhile."""
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(a.call_tool, "infer_chat", args))
            assert await anyio.to_thread.run_sync(entered.wait, 10)
            with anyio.fail_after(20):  # a shared 2-core box: slow, but never held by A's step
                await call_ok(b, "serve_list")
            release.set()


async def test_a_long_answer_is_parsed_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with held_step() as (hold, entered, release, released):

        def loads(text: str) -> Any:
            return hold(lambda: json.loads(text))

        monkeypatch.setattr(remote, "json", SimpleNamespace(loads=loads, JSONDecodeError=json.JSONDecodeError))
        with serving() as server:
            async with two_clients(tmp_path, server) as (a, b, _, _):
                args = {"model": "fake", "messages": say("finished"), "max_tokens": 5, "json_schema": {}}
                await _meanwhile(a, b, args, entered, release)
    assert released == [True]


async def test_the_first_tls_context_is_built_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop_thread, built_on = threading.get_ident(), []
    with held_step() as (hold, entered, release, released):

        def build() -> ssl.SSLContext:  # not cached, unlike the real one: each call reads the CA bundle again
            built_on.append(threading.get_ident())
            return hold(ssl.create_default_context)

        monkeypatch.setattr(client, "_ssl_context", build)
        with serving() as server:
            async with two_clients(tmp_path, server) as (a, b, mcp, engine_id):
                # an https engine: its first request builds the process's TLS context (the CA bundle read from disk)
                https = server.url.replace("http://", "https://")
                services.serve(state_of(mcp)).engines.store.set(engine_id, base_url=https)
                args = {"model": "fake", "messages": say("finished"), "max_tokens": 5}
                await _meanwhile(a, b, args, entered, release)
    assert released == [True]
    assert built_on and loop_thread not in built_on, built_on  # the context built off the loop is the one used
