"""A model other clients are using: infer_unload of it while it generates (manager.py `unload(wait=False)`,
service.unloaded) takes no new request at once, waits for the running ones on the event loop holding no worker
thread, and the last of them closes it even if the unload's caller gave up; a benchmark of it does not put every
other client's request behind all of its own (service.benchmark)."""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from gpubox import services
from gpubox.app import build_server, state_of
from gpubox.settings import Settings
from tests.conftest import call_ok, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

MODEL = "smollm2-135m-instruct"


async def quiet(c: Client, tool: str, **args: Any) -> None:
    await c.call_tool(tool, args)


async def test_an_unload_behind_a_running_request_holds_no_thread_and_the_request_closes_the_model(
    tmp_path: Path,
) -> None:
    server = build_server(Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path]))
    mgr = services.models(state_of(server))
    pool = anyio.to_thread.current_default_thread_limiter()
    try:
        async with Client(server) as c:  # type: ignore[arg-type]
            for cancelled in (True, False):
                await call_ok(c, "infer_load", name=MODEL, context_length=512)
                backend = mgr.resident[MODEL].backend
                started, go, real = threading.Event(), threading.Event(), backend.generate

                def held(*args: Any, _real: Any = real, _started: Any = started, _go: Any = go) -> Any:
                    _started.set()
                    _go.wait(120)
                    return _real(*args)

                backend.generate = held  # type: ignore[method-assign]
                async with anyio.create_task_group() as tg:
                    tg.start_soon(functools.partial(quiet, c, "infer_complete", model=MODEL, prompt="Hi", max_tokens=2))
                    await anyio.to_thread.run_sync(started.wait, 60)
                    threads = pool.borrowed_tokens  # the generation's own
                    answers: list[dict[str, Any]] = []
                    scopes: list[anyio.CancelScope] = []
                    tg.start_soon(collect, c, answers, scopes)
                    await wait_until(lambda: mgr.closing(MODEL) == 1, 30)
                    assert MODEL not in mgr.resident and not answers  # no new request finds it; still waiting
                    assert pool.borrowed_tokens == threads  # before the fix a thread waited in the unload
                    if cancelled:
                        scopes[0].cancel()
                    go.set()
                assert answers == ([] if cancelled else [{"name": MODEL, "unloaded": True}])
                await wait_until(lambda: mgr.closing(MODEL) == 0, 60)  # the request closed it, caller or not
                assert (await call_ok(c, "box_plan"))["box"]["holdings"] == []
    finally:
        state_of(server).close()


async def collect(c: Client, answers: list[dict[str, Any]], scopes: list[anyio.CancelScope]) -> None:
    with anyio.CancelScope() as scope:
        scopes.append(scope)
        answers.append(await call_ok(c, "infer_unload", name=MODEL))


async def test_a_chat_during_a_benchmark_waits_for_one_of_its_requests_not_all(tmp_path: Path) -> None:
    """infer_benchmark queued all its requests at the model's turn at once: concurrency 256 kept another client's
    chat waiting 238 s, behind every one of them."""
    server = build_server(Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path]))
    requests, done_at_chat = 8, []
    try:
        async with Client(server) as bench, Client(server) as chat:  # type: ignore[arg-type]
            await call_ok(bench, "infer_load", name=MODEL, context_length=512)
            finished, first = [0], anyio.Event()

            async def progress(done: float, total: float | None, message: str | None) -> None:
                finished[0] = int(done)
                first.set()

            async def chat_when_first_ends() -> None:
                await first.wait()
                await call_ok(chat, "infer_complete", model=MODEL, prompt="Hi", max_tokens=2)
                done_at_chat.append(finished[0])

            async with anyio.create_task_group() as tg:
                tg.start_soon(chat_when_first_ends)
                args = {"requests": requests, "concurrency": requests, "prompt_tokens": 16, "max_tokens": 16}
                result = await bench.call_tool("infer_benchmark", args, progress_callback=progress)
                assert not result.is_error, result
    finally:
        state_of(server).close()
    assert done_at_chat and done_at_chat[0] <= 3, done_at_chat  # before the fix: all 8 first
