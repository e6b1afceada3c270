"""A max_tokens the caller gives that does not fit in a vLLM engine's context after the prompt is refused with the
context error infer_chat/infer_complete give for an in-process model (vLLM itself would quietly lower it): the
prompt is counted by the engine's /tokenize first. An unset max_tokens is not checked (vLLM lowers it); an engine
whose /tokenize cannot answer gets the request as before, and an attached server that is not vLLM is not asked.
The engine is test_misbehaving_server's fake, recorded as a vLLM engine gpubox runs."""

from __future__ import annotations

import contextlib
import io
import json
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from gpubox import services
from gpubox.app import build_server, state_of
from gpubox.settings import Settings
from gpubox.tools.serve import client
from tests.conftest import call_err, call_ok
from tests.serve.test_misbehaving_server import Fake, Server, say, serving

pytestmark = pytest.mark.anyio
N_CTX = 64
PROMPT = 10


@pytest.fixture
def tokenizing(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """The fake answers POST /tokenize as `server.tokenize` says (a code and a body) and a completion (no
    messages) with one 'ok'; every POST is recorded with its body."""
    posts: list[tuple[str, dict[str, Any]]] = []
    original = Fake.do_POST

    def do_post(self: Fake) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.loads(raw)
        posts.append((self.path, body))
        if self.path.endswith("/tokenize"):
            answer, code = getattr(self.server, "tokenize", ({"count": PROMPT, "max_model_len": N_CTX}, 200))
            self.reply(answer, code)
        elif "messages" not in body:  # a completion
            choice = {"text": "ok", "finish_reason": "stop", "index": 0}
            self.reply({"choices": [choice], "usage": {"prompt_tokens": PROMPT, "completion_tokens": 1}})
        else:
            self.rfile = io.BufferedReader(io.BytesIO(raw))  # type: ignore[assignment]  # read again by Fake's own
            original(self)

    monkeypatch.setattr(Fake, "do_POST", do_post)
    return posts


@contextlib.asynccontextmanager
async def attached(tmp_path: Path, server: Server) -> AsyncIterator[tuple[Client, str, Callable[..., None]]]:
    """The fake attached, recorded as an engine gpubox runs with vLLM (no pid: none is checked); the callable
    given sets it back to an attached server (False) or to vLLM again (True)."""
    mcp = build_server(Settings.load(state_dir=tmp_path / "state"))
    try:
        async with Client(mcp) as c:
            engine_id = (await call_ok(c, "serve_attach", base_url=server.url))["id"]

            def vllm(yes: bool, **more: Any) -> None:
                changes = {"engine": "vllm", "state": "ready"} if yes else {"engine": "openai", "state": "attached"}
                services.serve(state_of(mcp)).engines.store.set(engine_id, **{**changes, **more})

            vllm(True)
            yield c, engine_id, vllm
    finally:
        state_of(mcp).close()


def paths(posts: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [p for p, _ in posts]


async def test_a_max_tokens_beyond_the_engines_context_is_refused_with_the_context_error(
    tmp_path: Path, tokenizing: list[tuple[str, dict[str, Any]]]
) -> None:
    with serving() as server:
        async with attached(tmp_path, server) as (c, engine_id, vllm):
            text = await call_err(c, "infer_chat", model="fake", messages=say("finished"), max_tokens=N_CTX)
            assert "context length exceeded" in text, text
            assert f"the prompt is {PROMPT} tokens and max_tokens is {N_CTX} ({PROMPT + N_CTX} > {N_CTX})" in text
            assert f"serve_stop engine_id='{engine_id}'" in text and f"max_model_len={PROMPT + N_CTX}" in text, text
            assert "infer_load" not in text, text  # an engine is restarted, not reloaded
            assert tokenizing == [("/tokenize", {"model": "fake", "messages": say("finished")})]  # never sent

            tokenizing.clear()
            text = await call_err(c, "infer_complete", model="fake", prompt="Once upon", max_tokens=N_CTX - PROMPT + 1)
            assert f"({N_CTX + 1} > {N_CTX})" in text and f"engine_id='{engine_id}'" in text, text
            assert tokenizing == [("/tokenize", {"model": "fake", "prompt": "Once upon"})]

            # one that fits is sent, and the engine answers it
            tokenizing.clear()
            res = await call_ok(c, "infer_chat", model="fake", messages=say("finished"), max_tokens=N_CTX - PROMPT)
            assert res["text"] == "ok" and paths(tokenizing) == ["/tokenize", "/v1/chat/completions"], tokenizing
            res = await call_ok(c, "infer_complete", model="fake", prompt="Once upon", max_tokens=5)
            assert res["text"] == "ok" and tokenizing[-1][1]["max_tokens"] == 5, tokenizing

            # an unset max_tokens is vLLM's to lower: sent at once
            tokenizing.clear()
            assert (await call_ok(c, "infer_chat", model="fake", messages=say("finished")))["text"] == "ok"
            assert paths(tokenizing) == ["/v1/chat/completions"], tokenizing

            # an attached server that is not vLLM has no /tokenize: sent as it is, its own rule applies
            vllm(False)
            tokenizing.clear()
            res = await call_ok(c, "infer_chat", model="fake", messages=say("finished"), max_tokens=10 * N_CTX)
            assert res["text"] == "ok" and paths(tokenizing) == ["/v1/chat/completions"], tokenizing


@pytest.mark.parametrize(
    "tokenize",
    [({"detail": "Not Found"}, 404), ({"error": "boom"}, 500), ({"count": "many"}, 200), ([1, 2], 200)],
    ids=["404", "500", "malformed", "list"],
)
async def test_an_engine_whose_tokenize_does_not_answer_gets_the_request_as_before(
    tmp_path: Path, tokenizing: list[tuple[str, dict[str, Any]]], tokenize: tuple[Any, int]
) -> None:
    with serving() as server:
        server.tokenize = tokenize  # type: ignore[attr-defined]
        async with attached(tmp_path, server) as (c, _, _):
            res = await call_ok(c, "infer_chat", model="fake", messages=say("finished"), max_tokens=10 * N_CTX)
            assert res["text"] == "ok", res
            assert paths(tokenizing) == ["/tokenize", "/v1/chat/completions"], tokenizing
            assert tokenizing[-1][1]["max_tokens"] == 10 * N_CTX


async def test_the_count_is_read_through_the_pooled_client() -> None:
    """client.tokenize: the count and the context, or None when the check could not run."""
    with serving() as server:
        server.tokenize = ({"count": 3, "max_model_len": 9, "tokens": [1, 2, 3]}, 200)  # type: ignore[attr-defined]
        with pytest.MonkeyPatch.context() as mp:
            posts: list[str] = []

            def do_post(self: Fake) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                posts.append(self.path)
                self.reply(*self.server.tokenize)  # type: ignore[attr-defined]

            mp.setattr(Fake, "do_POST", do_post)
            body = {"model": "fake", "prompt": "hi"}
            assert await client.tokenize(server.url, None, body, 5.0) == (3, 9)
            server.tokenize = ({"count": 3}, 200)  # type: ignore[attr-defined]
            assert await client.tokenize(server.url, None, body, 5.0) is None
            assert posts == ["/tokenize", "/tokenize"]
    server_gone = Server()
    url = server_gone.url
    server_gone.server_close()
    assert await client.tokenize(url, None, {"model": "fake", "prompt": "hi"}, 5.0) is None


async def test_a_benchmark_checks_the_room_once_not_in_every_timed_request(
    tmp_path: Path, tokenizing: list[tuple[str, dict[str, Any]]]
) -> None:
    with serving() as server:
        async with attached(tmp_path, server) as (c, _engine_id, _vllm):
            args = {"model": "fake", "requests": 4, "concurrency": 2, "prompt_tokens": 8}
            text = await call_err(c, "infer_benchmark", max_tokens=N_CTX, **args)
            assert "context length exceeded" in text and paths(tokenizing) == ["/tokenize"], (text, tokenizing)
            tokenizing.clear()
            res = await call_ok(c, "infer_benchmark", max_tokens=4, **args)
            assert res["requests"] == 4  # one count before the clock starts, then the four timed requests only
            assert paths(tokenizing) == ["/tokenize"] + ["/v1/completions"] * 4, tokenizing


async def test_a_count_the_engine_never_answers_does_not_hold_the_request(
    tmp_path: Path, tokenizing: list[tuple[str, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hung /tokenize (the engine still passing its health probe) costs the count's limit, not the request's
    (600 s): the request is then sent as before, the benchmark's too."""
    from gpubox.tools.serve import remote

    monkeypatch.setattr(remote, "COUNT_S", 0.5)
    release = threading.Event()
    answering = Fake.do_POST

    def do_post(self: Fake) -> None:
        if self.path.endswith("/tokenize"):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            release.wait(120)  # held until the test ends: the count never comes in time
            return
        answering(self)

    monkeypatch.setattr(Fake, "do_POST", do_post)
    with serving() as server:
        try:
            async with attached(tmp_path, server) as (c, _, _):
                with anyio.fail_after(60):
                    res = await call_ok(c, "infer_complete", model="fake", prompt="Once upon", max_tokens=5)
                    assert res["text"] == "ok", res
                    args = {"model": "fake", "requests": 2, "concurrency": 1, "prompt_tokens": 8}
                    assert (await call_ok(c, "infer_benchmark", max_tokens=4, **args))["requests"] == 2
        finally:
            release.set()


async def test_the_restart_offered_stays_within_the_models_positions(
    tmp_path: Path, tokenizing: list[tuple[str, dict[str, Any]]]
) -> None:
    """vLLM refuses a max_model_len above the model's positions: the error offers at most that, or none."""
    from gpubox.tools.serve.schemas import ServePlan

    with serving() as server:
        async with attached(tmp_path, server) as (c, engine_id, vllm):
            for positions, expect in [
                (80, ["max_model_len=80 and ask for 70 or less"]),
                (N_CTX, ["the model reads at most 64 tokens: no larger context makes room for 110"]),
                (1000, ["max_model_len=110"]),
            ]:
                plan = ServePlan(device="cpu", dtype="bfloat16", max_model_len=N_CTX, model_max_len=positions,
                                 memory_gb={}, command=[], env={}, reasons=[])  # fmt: skip
                vllm(True, plan=plan)
                text = await call_err(c, "infer_complete", model="fake", prompt="Once upon", max_tokens=100)
                assert all(e in text for e in expect), (positions, text)
                assert (f"serve_stop engine_id='{engine_id}'" in text) == (positions != N_CTX), text


async def test_a_benchmark_on_an_engine_known_silent_fails_before_it_counts(
    tmp_path: Path, tokenizing: list[tuple[str, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The room check runs under the engine's watch, as each request does: an engine recorded unresponsive whose
    health probe still fails gets nothing sent, not a count first."""
    answering = Fake.do_GET

    def do_get(self: Fake) -> None:
        if self.path.endswith("/health"):
            self.reply({}, 503)
        else:
            answering(self)

    monkeypatch.setattr(Fake, "do_GET", do_get)
    with serving() as server:
        async with attached(tmp_path, server) as (c, _, vllm):
            vllm(True, state="unresponsive")
            args = {"model": "fake", "requests": 2, "concurrency": 1, "prompt_tokens": 8, "max_tokens": 4}
            text = await call_err(c, "infer_benchmark", **args)
            assert "stopped answering" in text and tokenizing == [], (text, tokenizing)
