"""An attached server that does not behave as an OpenAI-compatible one should, through the MCP tools: a small
HTTP server on a thread whose chat answer is chosen by the last message (endless deltas, a line without end, a
stream cut short, JSON instead of a stream, chunks of the wrong shape) and whose model list can break. Each ends
with a gpubox error that names the engine (never the SDK's bare "Error executing tool"), or with a bounded
answer, and one broken engine does not break serve_list."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.errors import BusyError, UpstreamError
from gpubox.settings import Settings
from gpubox.tools.serve import client, remote
from gpubox.tools.serve.engines import EngineManager
from gpubox.tools.serve.schemas import EngineStatus
from tests.conftest import call_err, call_ok, requires_models

pytestmark = pytest.mark.anyio
HOLD_S = 30.0  # how long the server keeps an endless answer going when nobody hangs up


def say(mode: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": mode}]


class Fake(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, *_: Any) -> None:
        pass

    def reply(self, obj: Any, code: int = 200) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.endswith("/models"):
            self.reply(*self.server.models)
        elif self.path.endswith("/health"):
            self.reply({})
        else:
            self.reply({}, 404)

    def event(self, obj: Any) -> None:
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.flush()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        listed = self.server.models[0]  # a test may break the model list on purpose: then any name answers
        data = listed.get("data") if isinstance(listed, dict) else None
        known = {m["id"] for m in data} if isinstance(data, list) else {body["model"]}
        if body["model"] not in known:  # as vLLM: a model is asked for by its name as written
            self.reply({"error": {"message": f"The model `{body['model']}` does not exist.", "code": 404}}, 404)
            return
        mode = body["messages"][-1]["content"]
        if mode in ("json", "bigjson"):  # stream=true ignored: one whole completion
            content = "hello" if mode == "json" else "x" * 5_000_000  # a server that ignores max_tokens too
            answer = {"choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}
            self.reply({**answer, "usage": {"prompt_tokens": 3, "completion_tokens": 1}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            self.stream(mode)
        except OSError:  # the client hung up: what a capped request must do
            self.server.hung_up.set()

    def stream(self, mode: str) -> None:
        w, began = self.wfile, time.monotonic()
        if mode in ("forever", "tiny"):  # 1 KB (or one-character) deltas with no end
            piece = "x" * (1000 if mode == "forever" else 1)
            while time.monotonic() - began < HOLD_S:
                self.event({"choices": [{"delta": {"content": piece}}]})
        elif mode == "noline":  # one 'data:' line that never ends
            w.write(b"data: ")
            while time.monotonic() - began < HOLD_S:
                w.write(b"y" * 65536)
                w.flush()
        elif mode == "drip":  # keep-alive comments and never an answer
            while time.monotonic() - began < HOLD_S:
                w.write(b": keep-alive\n\n")
                w.flush()
                time.sleep(0.05)
        elif mode == "truncated":
            self.event({"choices": [{"delta": {"content": "The answer is"}}]})
        elif mode == "nodata":
            w.write(b"hello\n")
        elif mode == "lastline":  # the last line without its newline: legal, aiter_lines gave it
            self.event({"choices": [{"delta": {"content": "ok"}}]})
            w.write(b"data: [DONE]")
        elif mode == "finished":  # a finish_reason, then the connection closes without [DONE]
            self.event({"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]})
        elif mode == "filtered":  # the server's moderation withheld the rest
            self.event({"choices": [{"delta": {"content": "I can"}, "finish_reason": "content_filter"}]})
        elif mode == "surrogate":  # valid JSON whose "\ud800" escape decodes to a lone surrogate
            self.event({"choices": [{"delta": {"content": "a\ud800b"}, "finish_reason": "stop"}]})
        else:
            raw = {
                "list": b"[1, 2]",
                "notjson": b"{oops",
                "badcontent": json.dumps({"choices": [{"delta": {"content": 5}}]}).encode(),
                "strdelta": json.dumps({"choices": [{"delta": "hi"}]}).encode(),
                "badusage": json.dumps(
                    {
                        "choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}],
                        "usage": {"completion_tokens": "many"},
                    }
                ).encode(),
                "error": json.dumps({"error": {"message": "engine core died", "code": 500}}).encode(),
            }[mode]
            w.write(b"data: " + raw + b"\n\ndata: [DONE]\n\n")
        w.flush()


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Fake)
        self.models: tuple[Any, int] = ({"data": [{"id": "fake"}]}, 200)
        self.hung_up = threading.Event()
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1"


@contextlib.contextmanager
def serving() -> Iterator[Server]:
    server = Server()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@contextlib.asynccontextmanager
async def attached(tmp_path: Path, server: Server) -> AsyncIterator[tuple[Client, str]]:
    mcp = build_server(Settings.load(state_dir=tmp_path / "state"))
    try:
        async with Client(mcp) as c:
            att = await call_ok(c, "serve_attach", base_url=server.url)
            yield c, att["id"]
    finally:
        state_of(mcp).close()


@pytest.mark.parametrize("mode", ["forever", "tiny"], ids=["1KB-deltas", "1-char-deltas"])
async def test_an_answer_that_streams_past_max_tokens_is_cut_at_about_max_tokens(tmp_path: Path, mode: str) -> None:
    with serving() as server:
        async with attached(tmp_path, server) as (c, _):
            reports = 0

            async def progress(*_: Any) -> None:
                nonlocal reports
                reports += 1

            began = time.monotonic()
            result = await c.call_tool(
                "infer_chat", {"model": "fake", "messages": say(mode), "max_tokens": 5}, progress_callback=progress
            )
            res = result.structured_content
            assert not result.is_error and res is not None, result.content
            assert time.monotonic() - began < HOLD_S / 2  # not read until the server stopped
            assert res["finish_reason"] == "length"
            # no more than max_tokens tokens can hold, with the delta that crossed it
            assert 0 < len(res["text"]) <= 5 * remote.MAX_CHARS_PER_TOKEN + 1000, len(res["text"])
            assert reports <= 5 + remote.EVENT_MARGIN + 1
            assert server.hung_up.wait(10)  # the connection was dropped: the server stops generating


async def test_a_line_without_end_is_refused_at_its_cap_naming_the_engine(tmp_path: Path) -> None:
    with serving() as server:
        async with attached(tmp_path, server) as (c, engine_id):
            began = time.monotonic()
            text = await call_err(c, "infer_chat", model="fake", messages=say("noline"), max_tokens=5)
            assert time.monotonic() - began < HOLD_S / 2
            assert f"engine {engine_id}" in text and "longer than 1 MB" in text, text
            assert f"serve_stop engine_id='{engine_id}'" in text
            assert server.hung_up.wait(10)


async def test_a_request_ends_at_the_overall_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote, "REQUEST_DEADLINE_S", 1.0)
    with serving() as server:
        async with attached(tmp_path, server) as (c, engine_id):
            began = time.monotonic()
            text = await call_err(c, "infer_chat", model="fake", messages=say("drip"), max_tokens=5)
            assert time.monotonic() - began < HOLD_S / 2
            assert f"engine {engine_id}" in text and "within 1 s" in text, text
            assert server.hung_up.wait(10)


@pytest.mark.parametrize(
    ("mode", "said"),
    [("truncated", "without [DONE]"), ("nodata", "sent no chunk")],
)
async def test_a_stream_that_ends_before_its_end_is_an_error_not_a_partial_answer(
    tmp_path: Path, mode: str, said: str
) -> None:
    with serving() as server:
        async with attached(tmp_path, server) as (c, engine_id):
            text = await call_err(c, "infer_chat", model="fake", messages=say(mode), max_tokens=5)
            assert f"engine {engine_id}" in text and said in text and "incomplete" in text, text


async def test_a_finish_reason_completes_an_answer_without_done_and_json_is_read_as_a_completion(
    tmp_path: Path,
) -> None:
    with serving() as server:
        async with attached(tmp_path, server) as (c, _):
            res = await call_ok(c, "infer_chat", model="FAKE", messages=say("finished"), max_tokens=5)
            assert (res["text"], res["finish_reason"], res["model"]) == ("ok", "stop", "fake")  # its own spelling
            res = await call_ok(c, "infer_chat", model="fake", messages=say("json"), max_tokens=5)
            assert (res["text"], res["finish_reason"], res["prompt_tokens"]) == ("hello", "stop", 3)
            res = await call_ok(c, "infer_chat", model="fake", messages=say("lastline"), max_tokens=5)
            assert (res["text"], res["finish_reason"]) == ("ok", "stop")
            res = await call_ok(c, "infer_chat", model="fake", messages=say("filtered"), max_tokens=5)
            assert (res["text"], res["finish_reason"]) == ("I can", "content_filter")  # was reported as "stop"
            res = await call_ok(c, "infer_chat", model="fake", messages=say("surrogate"), max_tokens=5)
            assert res["text"] == "a\ufffdb"  # was a bare "Error executing tool": the answer could not be sent
            res = await call_ok(c, "infer_chat", model="fake", messages=say("bigjson"), max_tokens=5)
            assert res["finish_reason"] == "length" and len(res["text"]) < 5 * 1000, len(res["text"])


@pytest.mark.parametrize(
    ("mode", "quoted"),
    [
        ("list", "[1, 2]"),
        ("notjson", "{oops"),
        ("badcontent", '"content": 5'),
        ("strdelta", '"delta": "hi"'),
        ("badusage", '"completion_tokens": "many"'),
        ("error", "engine core died"),
    ],
)
async def test_a_malformed_chunk_is_a_gpubox_error_quoting_it(tmp_path: Path, mode: str, quoted: str) -> None:
    with serving() as server:
        async with attached(tmp_path, server) as (c, engine_id):
            text = await call_err(c, "infer_chat", model="fake", messages=say(mode), max_tokens=5)
            assert f"engine {engine_id}" in text and quoted in text, text


def test_lines_end_at_crlf_and_one_over_the_cap_is_refused() -> None:
    lines = client._Lines("engine x", "fix")
    assert lines.feed(b"data: 1\r\ndata: ") == [b"data: 1"]
    with pytest.raises(UpstreamError, match="engine x sent a line longer than 1 MB"):
        lines.feed(b"y" * client.MAX_LINE)


@pytest.mark.parametrize(
    ("models", "said"),
    [(({"data": "oops"}, 200), "did not return an OpenAI model list"), (({}, 401), "refused the API key")],
    ids=["malformed", "401"],
)
async def test_an_engine_whose_model_list_breaks_is_unhealthy_and_does_not_break_serve_list(
    tmp_path: Path, models: tuple[Any, int], said: str
) -> None:
    with serving() as good, serving() as bad:
        bad.models = ({"data": [{"id": "other"}]}, 200)
        async with attached(tmp_path, good) as (c, good_id):
            bad_id = (await call_ok(c, "serve_attach", base_url=bad.url))["id"]
            bad.models = models  # /health still answers 200
            st = await call_ok(c, "serve_status", engine_id=bad_id)
            assert not st["healthy"] and said in st["error"] and st["served_models"] == [], st
            listed = {e["id"]: e for e in (await call_ok(c, "serve_list"))["engines"]}
            assert listed[good_id]["healthy"] and listed[good_id]["served_models"] == ["fake"]
            assert not listed[bad_id]["healthy"] and said in listed[bad_id]["error"], listed[bad_id]
            # requests still go to it: its chat answers whatever its model list says
            assert (await call_ok(c, "infer_chat", model="other", messages=say("finished")))["text"] == "ok"


async def test_serve_list_lists_an_engine_whose_status_fails_with_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serving() as good, serving() as bad:
        bad.models = ({"data": [{"id": "other"}]}, 200)
        async with attached(tmp_path, good) as (c, good_id):
            bad_id = (await call_ok(c, "serve_attach", base_url=bad.url))["id"]
            status = EngineManager.status

            def failing(self: EngineManager, engine_id: str, include_log: bool = False) -> EngineStatus:
                if engine_id == bad_id:  # whatever gpubox error one engine's status meets
                    raise BusyError("its record is locked")
                return status(self, engine_id, include_log)

            monkeypatch.setattr(EngineManager, "status", failing)
            listed = {e["id"]: e for e in (await call_ok(c, "serve_list"))["engines"]}
            assert listed[good_id]["healthy"]
            assert not listed[bad_id]["healthy"] and listed[bad_id]["error"] == "its record is locked"


@requires_models
async def test_attaching_a_server_that_serves_a_local_models_name_says_where_requests_go(tmp_path: Path) -> None:
    """Requests by that name go to the attached server from then on; nothing said so, and a pinned local copy
    kept its memory while it could no longer be reached by name."""
    with serving() as server:
        mcp = build_server(Settings.load(state_dir=tmp_path / "state1"))
        try:
            async with Client(mcp) as c:  # 'fake' is no local model: nothing to say
                assert "local model" not in (
                    (await call_ok(c, "serve_attach", base_url=server.url)).get("next_step") or ""
                )
                server.models = ({"data": [{"id": "fake2"}, {"id": "SmolLM2-135M-Instruct"}]}, 200)
                att = await call_ok(c, "serve_attach", base_url=server.url)  # routed by its first model only
                assert "local model" not in (att.get("next_step") or ""), att
        finally:
            state_of(mcp).close()
    with serving() as server:
        server.models = ({"data": [{"id": "SmolLM2-135M-Instruct"}]}, 200)
        mcp = build_server(Settings.load(state_dir=tmp_path / "state2"))
        try:
            async with Client(mcp) as c:
                att = await call_ok(c, "serve_attach", base_url=server.url)
                assert "'SmolLM2-135M-Instruct' is also a local model" in att["next_step"], att
                assert f"serve_stop engine_id='{att['id']}'" in att["next_step"]
        finally:
            state_of(mcp).close()
