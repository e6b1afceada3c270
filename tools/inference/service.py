"""Generation with streaming progress and prompt cancellation; the benchmark that feeds the estimator."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import psutil

from gpubox.errors import InvalidInputError
from gpubox.progress import Progress
from gpubox.tools.inference.backends import GenOutput, GenParams
from gpubox.tools.inference.grammar import check_schema
from gpubox.tools.inference.manager import ModelManager, Resident
from gpubox.tools.inference.output_check import check_output, not_json
from gpubox.tools.inference.schemas import BenchmarkResult, GenerationResult
from gpubox.tools.inference.specials import defuse, specials_of

# what recording a benchmark as a calibration gave: (row id, decode efficiency), why it was refused, or nothing
Recorded = tuple[int, float | None] | InvalidInputError | None
T = TypeVar("T")
LOAD_POLL_S = 0.05
FILLER = "The quick brown fox jumps over the lazy dog while the GPU box answers questions about code. "


async def generate(
    mgr: ModelManager,
    model: str | None,
    messages: list[dict[str, str]] | None,
    prompt: str | None,
    params: GenParams,
    report: Progress | None,
) -> GenerationResult:
    """Run one request in a worker thread; stream text as progress; stop the model when the caller cancels.

    Nothing here blocks the event loop: acquiring (maybe loading) the model, generating and releasing it all
    happen in worker threads. The model is released by whichever side owns it last: the worker thread once
    generation ends (even after the caller gave up on it), or this coroutine if the worker never started.
    """
    if params.json_schema is not None:  # refuse a schema with no valid output before loading anything
        await anyio.to_thread.run_sync(check_schema, params.json_schema)
    await loaded(mgr, model)
    # a cancel must not lose an acquired model (it would stay busy forever)
    r: Resident = await shielded(mgr.acquire, model)
    pieces: queue.SimpleQueue[str] = queue.SimpleQueue()
    cancel = threading.Event()
    box: dict[str, Any] = {}
    done = anyio.Event()
    claim = threading.Lock()
    owner: list[str] = []  # "worker" once the thread started, "caller" if the caller released first

    def work() -> GenOutput | None:
        with claim:
            if owner:
                return None
            owner.append("worker")
        try:
            with r.lock:  # one request at a time per model; other models and tools keep running
                if cancel.is_set():  # the caller left while it waited: its prompt is not evaluated for nothing
                    return GenOutput("", "cancelled", 0, 0, None, None, None, 0.0)
                chat = None if messages is None else defuse(messages, specials_of(r.backend))
                return r.backend.generate(chat, prompt, params, pieces.put, cancel)
        finally:
            mgr.release(r)

    async def runner() -> None:
        try:
            # waits its turn for the model on the event loop (r.turn), then takes a worker thread
            box["out"] = await anyio.to_thread.run_sync(work, abandon_on_cancel=True, limiter=r.turn)
        except Exception as exc:  # re-raised below, outside the task group
            box["err"] = exc
        finally:
            done.set()

    streamed = 0
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner)
            while not done.is_set():
                with anyio.move_on_after(0.1):
                    await done.wait()
                text = "".join(iter_queue(pieces))
                if text and report is not None:
                    streamed += 1
                    await report(float(streamed), float(params.max_tokens), text)
    finally:
        cancel.set()  # a cancelled call stops the model at its next token
        with claim:  # held for an instant only
            mine = not owner
            if mine:
                owner.append("caller")
        if mine:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(mgr.release, r)
    if "err" in box:
        raise box["err"]
    out: GenOutput = box["out"]
    parsed = None
    if params.json_schema is not None and out.finish_reason == "stop":
        try:
            parsed = json.loads(out.text)
        except json.JSONDecodeError as exc:
            raise not_json("the model's", exc, params.stop) from exc
        await anyio.to_thread.run_sync(check_output, params.json_schema, parsed, out.text)
    return GenerationResult(
        model=r.name,
        text=out.text,
        finish_reason=out.finish_reason,
        prompt_tokens=out.prompt_tokens,  # type: ignore[arg-type]
        completion_tokens=out.completion_tokens,
        time_to_first_token_s=_r(out.ttft_s),
        prefill_tokens_per_s=_r(out.prefill_tps),
        decode_tokens_per_s=_r(out.decode_tps),
        total_seconds=round(out.total_s, 4),
        parsed_json=parsed,
    )


async def loaded(mgr: ModelManager, model: str | None) -> None:
    """Wait while `model` is being loaded (a reload can wait minutes for a long request to end) here on the event
    loop, cancellable, not in acquire's worker thread: forty such waiters held every thread of the default pool, so
    every other tool of the server stalled until the load ended, and a cancel did not end their wait."""
    while mgr.loading(model):
        await anyio.sleep(LOAD_POLL_S)  # the load ends in a worker thread: no loop event to wait on


async def unloaded(mgr: ModelManager, name: str, report: Progress | None) -> None:
    """Wait, on the event loop and cancellable, for the requests still running on an unloaded `name` to end (the
    last one closes it, caller or not): a worker thread waiting for a long generation held one of the pool's
    threads, and a cancel did not end its wait."""
    said = False
    while mgr.closing(name):
        if report is not None and not said:
            said = True
            await report(0.0, None, f"waiting for the running requests of {name} to end")
        await anyio.sleep(LOAD_POLL_S)  # the last request's end closes it in a thread: no loop event


async def shielded(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a worker thread, finished even if the caller is cancelled meanwhile."""
    with anyio.CancelScope(shield=True):
        return await anyio.to_thread.run_sync(fn, *args)
    raise AssertionError("unreachable: a shielded scope is not cancelled")  # for the type checker


def iter_queue(q: queue.SimpleQueue[str]) -> list[str]:
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out


def _r(x: float | None) -> float | None:
    return round(x, 4) if x is not None else None


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


async def benchmark(
    mgr: ModelManager,
    model: str | None,
    requests: int,
    concurrency: int,
    prompt_tokens: int,
    max_tokens: int,
    record: Callable[[Resident, float, float, float], Recorded],
    report: Progress | None,
) -> BenchmarkResult:
    def prepare() -> tuple[Resident, str]:
        r = mgr.acquire(model)
        try:
            words = FILLER * (prompt_tokens // 10 + 2)
            # trim the filler to the requested prompt length in tokens (tokenisers differ)
            while r.backend.count(words) > prompt_tokens and len(words) > 20:
                words = words[: int(len(words) * 0.9)]
            return r, words
        finally:
            mgr.release(r)

    await loaded(mgr, model)
    r, words = await shielded(prepare)
    params = GenParams(max_tokens=max_tokens, temperature=0.0, top_k=1, repeat_penalty=1.0)
    pids = [os.getpid(), *([pid] if isinstance(pid := getattr(r.backend, "pid", None), int) else [])]

    def rss() -> int:  # the server's and, where the model runs in a process of its own (llama_process), that one's
        total = 0
        for p in pids:
            with contextlib.suppress(psutil.Error):  # a child that just ended: the request reports it
                total += psutil.Process(p).memory_info().rss
        return total

    peaks = [rss()]

    # the model runs one request at a time (r.lock): all of this benchmark's requests queued at its turn put every
    # other client's request behind them (concurrency 256 kept a chat waiting 238 s); queued here they wait as long,
    # and a request of anyone else waits for one of them
    ours = anyio.Lock()

    async def send(i: int) -> GenerationResult:
        async with ours:
            return await generate(mgr, r.name, None, f"{i}. {words}", params, None)

    results, latencies, wall = await drive(requests, concurrency, send, report, lambda: peaks.append(rss()))
    peak = max(peaks)
    prefill = statistics.mean([x.prefill_tokens_per_s for x in results if x.prefill_tokens_per_s] or [0.0])
    decode = statistics.mean([x.decode_tokens_per_s for x in results if x.decode_tokens_per_s] or [0.0])
    share = None

    def finish() -> tuple[float, Recorded]:  # NVML and the calibration store: off the loop
        peak_gb = peak / 1e9
        if r.plan.device.startswith("cuda"):
            from gpubox.tools.gpu.nvml import gpu_status

            st = gpu_status()
            if st.gpus:
                peak_gb = max(peak_gb, st.gpus[0].memory_used_mib * 2**20 / 1e9)
        return peak_gb, record(r, decode, prefill, peak_gb)

    peak_gb, calib = await anyio.to_thread.run_sync(finish)
    refused = f"not stored as a calibration: {calib}" if isinstance(calib, InvalidInputError) else None
    calib = None if isinstance(calib, InvalidInputError) else calib
    if r.plan.device.startswith("cuda") and calib is not None:
        share = calib[1]  # decode efficiency = achieved bytes/s over the GPU's bandwidth
    return BenchmarkResult(
        model=r.name,
        backend=r.backend.name,
        device=r.plan.device,
        requests=requests,
        concurrency=concurrency,
        max_tokens=max_tokens,
        prefill_tokens_per_s=round(prefill, 2),
        decode_tokens_per_s=round(decode, 2),
        **timing(results, latencies, wall),
        peak_memory_gb=round(peak_gb, 3),
        bandwidth_share=share,
        calibration_id=calib[0] if calib else None,
        calibration_note=refused,
    )


async def drive(
    requests: int,
    concurrency: int,
    send: Callable[[int], Awaitable[GenerationResult]],
    report: Progress | None,
    after: Callable[[], object] | None = None,
) -> tuple[list[GenerationResult], list[float], float]:
    """Send `requests` requests, `concurrency` in flight: (results, latency of each, wall seconds). The first
    failure cancels the rest, those already sent too, and is raised as itself (outside the task group, so the
    client reads it unwrapped)."""
    results: list[GenerationResult] = []
    latencies: list[float] = []
    failures: list[Exception] = []
    limiter = anyio.CapacityLimiter(concurrency)
    t0 = time.perf_counter()

    async def one(i: int, scope: anyio.CancelScope) -> None:
        async with limiter:
            start = time.perf_counter()
            try:
                res = await send(i)
            except Exception as exc:
                failures.append(exc)
                scope.cancel()  # requests queued behind this one (on the model's lock) ran to the end before
                return
            latencies.append(time.perf_counter() - start)
            results.append(res)
            if after is not None:
                after()
            if report is not None:
                await report(float(len(results)), float(requests), f"request {len(results)}/{requests}")

    async with anyio.create_task_group() as tg:
        for i in range(requests):
            tg.start_soon(one, i, tg.cancel_scope)
    if failures:
        raise failures[0]
    return results, latencies, time.perf_counter() - t0


def timing(results: list[GenerationResult], latencies: list[float], wall: float) -> dict[str, Any]:
    """The BenchmarkResult fields every path measures the same way."""
    ttft = [x.time_to_first_token_s for x in results if x.time_to_first_token_s is not None]
    return {
        "prompt_tokens": results[0].prompt_tokens if results else 0,
        "time_to_first_token_s_p50": round(statistics.median(ttft), 4) if ttft else 0.0,
        "latency_s_p50": round(pct(latencies, 0.5), 4),
        "latency_s_p95": round(pct(latencies, 0.95), 4),
        "latency_s_p99": round(pct(latencies, 0.99), 4),
        "requests_per_s": round(len(results) / wall, 3),
        "aggregate_tokens_per_s": round(sum(x.completion_tokens for x in results) / wall, 2),
    }
