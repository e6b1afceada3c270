"""infer_benchmark / serve_benchmark's request driver: the first failure ends the run. Requests already past the
concurrency limit and queued on the model's lock used to run to their end after it (each one a full generation)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from gpubox.errors import BusyError
from gpubox.tools.inference.service import drive

pytestmark = pytest.mark.anyio


async def test_a_failed_request_cancels_those_queued_behind_it_and_is_raised_as_itself() -> None:
    model_lock = anyio.Lock()  # the benchmark's requests take the model one at a time
    ran: list[int] = []
    ended: list[int] = []  # the one granted the lock as the failure ends may start; it must not run to its end

    async def send(i: int) -> Any:
        async with model_lock:
            ran.append(i)
            if len(ran) == 1:
                raise BusyError("the first request failed")
            await anyio.sleep(0.01)  # a generation's first await
            ended.append(i)
            return object()

    with pytest.raises(BusyError, match="the first request failed"):
        await drive(8, 8, send, None)
    assert len(ran) <= 2 and ended == [], (ran, ended)


async def test_requests_that_succeed_are_all_counted() -> None:
    async def send(i: int) -> Any:
        await anyio.sleep(0)
        return i

    results, latencies, wall = await drive(6, 2, send, None)
    assert sorted(results) == list(range(6)) and len(latencies) == 6 and wall >= 0  # type: ignore[type-var]
