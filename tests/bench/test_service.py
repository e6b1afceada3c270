"""The bench service around the worker: its lock and reservation, progress, and results a broken kernel produces."""

from __future__ import annotations

import errno
import json
import math
import threading
from typing import Any

import anyio
import pytest
from mcp import Client

from gpubox import services
from gpubox.app import state_of
from gpubox.tools.bench import service as service_module
from gpubox.tools.bench.service import BenchService
from gpubox.tools.bench.worker import WorkerOutcome
from tests.bench.conftest import SMALL
from tests.conftest import call_err, call_ok, wait_until

pytestmark = pytest.mark.anyio
ONE = {**SMALL, "head_dim": 16, "backends": ["sdpa_math"]}  # the smallest real run: one backend, one shape


def bench_service(server: Any) -> BenchService:
    return services.bench(state_of(server))


async def test_a_failing_ledger_write_at_the_end_still_frees_the_lock_and_the_reservation(
    bench_client: Client, server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = bench_service(server)

    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(svc.ledger, "update", disk_full)  # recording the worker's peak memory fails
    first = await call_ok(bench_client, "bench_attention", **ONE)
    assert first["status"] == "complete"  # only the peak is lost: the measurements stand
    assert svc.ledger.holders("benchmark") == [] and not svc._lock.locked() and svc.active is None
    second = await call_ok(bench_client, "bench_attention", **ONE)  # not "another benchmark is running"
    assert second["status"] == "complete"


async def test_a_caller_refused_while_the_first_reserves_is_told_which_benchmark_runs(
    bench_client: Client, server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = bench_service(server)
    reserve, entered, go_on = svc.ledger.reserve, threading.Event(), threading.Event()

    def slow_reserve(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        go_on.wait(timeout=60)
        return reserve(*args, **kwargs)

    monkeypatch.setattr(svc.ledger, "reserve", slow_reserve)
    done: list[dict[str, Any]] = []
    text = ""
    async with anyio.create_task_group() as tg:

        async def first() -> None:
            done.append(await call_ok(bench_client, "bench_attention", **ONE))

        tg.start_soon(first)
        try:
            await wait_until(entered.is_set, timeout=30)
            text = await call_err(bench_client, "bench_attention", **ONE)
        finally:
            go_on.set()  # the first call goes on, whatever the second was told
    assert "another benchmark (attention) is running" in text
    assert done[0]["status"] == "complete"


async def test_progress_counts_every_backend_when_none_are_named(bench_client: Client) -> None:
    seen: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total))

    args = {**SMALL, "head_dim": [16, 32]}  # no backends: all six, each a row or a skip per shape
    result = await bench_client.call_tool("bench_attention", args, progress_callback=on_progress)
    assert not result.is_error, result.content
    counted = [(p, t) for p, t in seen if p > 0]
    assert counted and {t for _, t in counted} == {12.0}  # 2 shapes x 6 backends
    assert all(p <= t for p, t in counted if t is not None)
    assert counted[-1][0] == 12.0  # a backend missing here is one skip for both shapes: counted twice


def broken_kernel_events() -> list[dict[str, Any]]:
    """A worker's events (through JSON, as the worker sends them) for a kernel that wrote NaN, one whose timing
    came out NaN, and a sound one."""
    env = {"type": "env", "device": "cpu", "device_name": "test cpu", "dtype": "float32", "heads": 2}
    env |= {"tolerance": 2e-4, "timing": "perf_counter", "versions": {"torch": "0"}}
    sound = {"type": "row", "backend": "sdpa_math", "head_dim": 16, "seq_len": 64, "time_ms": 1.0}
    sound |= {"time_ms_min": 0.9, "time_ms_max": 1.1, "spread_pct": 5.0, "tflops": 0.01, "max_abs_error": 0.0}
    sound |= {"within_tolerance": True, "peak_memory_mb": None}
    wrote_nan = sound | {"backend": "sdpa_flash", "max_abs_error": math.nan, "within_tolerance": False}
    timed_nan = sound | {"backend": "ffpa", "time_ms": math.nan, "tflops": math.inf}
    events = [env, sound, wrote_nan, timed_nan, {"type": "done", "peak_memory_mb": 10.0}]
    return [json.loads(json.dumps(e)) for e in events]


async def test_a_kernel_that_wrote_nan_is_out_of_tolerance_and_the_result_still_valid(
    bench_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def worker(task: str, params: dict[str, Any], limit: float, on_event: Any = None) -> WorkerOutcome:
        return WorkerOutcome(status="complete", events=broken_kernel_events(), elapsed_s=1.0)

    monkeypatch.setattr(service_module, "run_worker", worker)  # stands in for a broken kernel on a real GPU
    data = await call_ok(bench_client, "bench_attention", **{**SMALL, "head_dim": 16})
    rows = {r["backend"]: r for r in data["rows"]}
    assert set(rows) == {"sdpa_math", "sdpa_flash"}
    assert rows["sdpa_flash"]["max_abs_error"] is None and rows["sdpa_flash"]["within_tolerance"] is False
    assert [w["backend"] for w in data["winners"]] == ["sdpa_math"]
    (skip,) = [s for s in data["skipped"] if s["backend"] == "ffpa"]
    assert "not a finite number" in skip["reason"] and "time_ms" in skip["reason"]
