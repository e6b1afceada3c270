"""Requests for a model that is being (re)loaded wait on the event loop, not in worker threads
(tools/inference/service.loaded): forty of them held every thread of anyio's default pool, so every other tool
stalled until the load ended. (That their wait is cancellable follows from it being a plain await on the loop; the
client-side cancel below only ends the test's calls, it asserts nothing about the server.)"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from mcp import Client

from gpubox import services
from gpubox.app import build_server, state_of
from gpubox.settings import Settings
from tests.conftest import call_ok, wait_until

pytestmark = pytest.mark.anyio

MODEL = "smollm2-135m-instruct"
WAITERS = 45  # more than anyio's 40 default worker threads


async def test_requests_waiting_for_a_reload_do_not_stall_other_tools(tmp_path: Path) -> None:
    settings = Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path], infer_context_length=4096)
    server = build_server(settings)
    mgr = services.models(state_of(server))
    try:
        async with Client(server) as c:  # type: ignore[arg-type]
            await call_ok(c, "infer_load", name=MODEL, context_length=4096)
            streaming, long_done = anyio.Event(), anyio.Event()

            async def progress(_p: float, _t: float | None, _m: str | None) -> None:
                streaming.set()

            async def long_request() -> None:  # holds the model: the reload below waits for it to end
                await c.call_tool(
                    "infer_complete",
                    {"prompt": "0 0 0 0 0 0 0 0", "max_tokens": 3000, "temperature": 0, "repeat_penalty": 1.0},
                    progress_callback=progress,
                )
                long_done.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(long_request)
                await streaming.wait()
                tg.start_soon(c.call_tool, "infer_load", {"name": MODEL, "context_length": 2048})
                await wait_until(lambda: mgr.loading(MODEL), 30)
                with anyio.CancelScope() as waiters:
                    async with anyio.create_task_group() as w:
                        for i in range(WAITERS):  # naming the model, or leaving it to the server
                            named = {"model": MODEL} if i % 2 else {}
                            w.start_soon(c.call_tool, "infer_complete", {"prompt": "Hi", "max_tokens": 1, **named})
                        await anyio.wait_all_tasks_blocked()
                        await call_ok(c, "infer_models")  # another tool answers while the load waits
                        assert not long_done.is_set(), "the long request ended first: the test proved nothing"
                        waiters.cancel()
                assert not long_done.is_set()
                tg.cancel_scope.cancel()
    finally:
        state_of(server).close()
