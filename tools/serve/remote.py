"""infer_chat / infer_complete for a model an engine serves: its OpenAI-compatible API, streamed as MCP progress.

Closing the stream (the MCP call was cancelled) makes vLLM abort the request; an engine that stops answering ends
it with what to do (liveness.py), not after the 600 s read timeout. A JSON schema goes as `response_format`
(vLLM's structured outputs) and the answer is still checked here, as on the local path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
import time
from collections.abc import Awaitable
from typing import Any

import anyio

from gpubox.errors import BusyError, UpstreamError
from gpubox.progress import Progress
from gpubox.tools.inference.backends import GenParams
from gpubox.tools.inference.context import context_error
from gpubox.tools.inference.output_check import check_output, not_json
from gpubox.tools.inference.schemas import BenchmarkResult, GenerationResult
from gpubox.tools.inference.service import FILLER, drive, timing
from gpubox.tools.serve import client
from gpubox.tools.serve.chunks import BadChunk, ReportedError, classify, parse, quote
from gpubox.tools.serve.liveness import Liveness, watching
from gpubox.tools.serve.schemas import EngineRecord

# An hour for one answer, whatever the server streams: a slow engine (a CPU, a queue) is waited on while it
# answers its health probe (liveness.py), but never without end. A module figure, not a Settings field (the
# settings module is not the serving family's to change).
REQUEST_DEADLINE_S = 3600.0
# The room check's count (/tokenize) is a check, not the answer: an engine that cannot count a prompt within this
# (a hung one that still passes its health probe) is sent the request as before, under the request's own watch
COUNT_S = 30.0
EVENT_MARGIN = 16
MAX_CHARS_PER_TOKEN = 256  # the longest tokens of common vocabularies (runs of spaces, '=') are far shorter


def _fix(rec: EngineRecord) -> str:
    """What to do about an engine that does not answer as an OpenAI-compatible server should."""
    if rec.engine == "vllm":
        return (
            f"serve_status engine_id='{rec.id}' include_log=true shows the engine's log; serve_stop "
            f"engine_id='{rec.id}' then serve_start restarts it"
        )
    return f"check the server at {rec.base_url} and its log, restart it, or serve_stop engine_id='{rec.id}' to detach"


async def check_room(
    rec: EngineRecord,
    messages: list[dict[str, str]] | None,
    prompt: str | None,
    p: GenParams,
    model: str,
    timeout: float,
) -> None:
    """A max_tokens the caller gave that does not fit after the prompt in a vLLM engine's context is refused with
    the context error of an in-process model (context.room_for), before anything is generated: vLLM would lower it
    without a word (its get_max_tokens takes min(max_model_len - prompt tokens, max_tokens)). The engine counts the
    prompt (/tokenize). An unset max_tokens (`p.fit`) is vLLM's to lower, as the rule asks: its answer then ends
    with finish_reason "length". An attached server is not asked: the OpenAI API has no /tokenize, so each server's
    own rule applies to a max_tokens beyond its context (refused, lowered or cut, as that server does). A /tokenize
    that cannot answer leaves the request as it was."""
    if rec.engine != "vllm" or p.fit:
        return
    body = {"model": model, **({"messages": messages} if messages is not None else {"prompt": prompt})}
    counted, limit = None, min(timeout, COUNT_S)
    with anyio.move_on_after(limit):  # the whole count: httpx's timeout is per read
        counted = await client.tokenize(rec.base_url, rec.api_key, body, limit)
    if counted is not None and counted[0] + p.max_tokens > counted[1]:
        count, n_ctx = counted
        raise context_error(
            count,
            p.max_tokens,
            n_ctx,
            lambda n: (
                f"restart the engine with a larger context: serve_stop engine_id='{rec.id}', then serve_start the "
                f"same model with name='{rec.model}' max_model_len={n}"
            ),
            n_max=rec.plan.model_max_len if rec.plan else None,  # vLLM refuses a max_model_len above it
        )


def served_as(rec: EngineRecord, model: str | None) -> str:
    """The engine's own spelling of `model`: routing ignores case, but vLLM checks a request's model name as
    written."""
    if model is None:
        return rec.model
    return next((n for n in (rec.model, *rec.aliases) if n.lower() == model.lower()), model)


def request_body(
    rec: EngineRecord, messages: list[dict[str, str]] | None, prompt: str | None, p: GenParams, model: str | None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": served_as(rec, model),  # a LoRA adapter the engine serves is asked for by its own name
        "max_tokens": p.max_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "stream_options": {"include_usage": True},
    }
    body.update({"messages": messages} if messages is not None else {"prompt": prompt})
    if p.stop:
        body["stop"] = p.stop
    if p.seed is not None:
        body["seed"] = p.seed
    if rec.engine == "vllm":  # vLLM's sampling extensions; other servers may reject unknown fields
        body.update(top_k=p.top_k if p.top_k > 0 else -1, repetition_penalty=p.repeat_penalty)
    if p.json_schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": p.json_schema}}
    return body


async def generate(
    rec: EngineRecord,
    messages: list[dict[str, str]] | None,
    prompt: str | None,
    p: GenParams,
    report: Progress | None,
    timeout: float = 600.0,
    model: str | None = None,
    live: Liveness | None = None,
) -> GenerationResult:
    path = "/chat/completions" if messages is not None else "/completions"
    t0 = time.perf_counter()
    first: float | None = None
    text: list[str] = []
    finish: str | None = None  # complete only with a finish_reason or [DONE]: else the stream was cut short
    usage: dict[str, int] = {}
    chunks = events = size = 0
    body = request_body(rec, messages, prompt, p, model)
    who, fix = f"engine {rec.id} ('{rec.model}' at {rec.base_url})", _fix(rec)
    # a server that streams past max_tokens is not read on: each token is one event on every known server (a
    # margin for the role, finish and usage events), and the text no more than MAX_CHARS_PER_TOKEN a token
    max_events = p.max_tokens + max(EVENT_MARGIN, p.max_tokens // 4)
    max_chars = p.max_tokens * MAX_CHARS_PER_TOKEN
    deadline = REQUEST_DEADLINE_S
    try:
        with anyio.fail_after(deadline):
            # closed on the spot when the MCP call is cancelled (even while a progress report is being sent): the
            # engine sees its connection drop and aborts the request
            async with (
                watching(live) as touch,
                contextlib.aclosing(client.stream(rec.base_url, rec.api_key, path, body, timeout, who, fix)) as sse,
            ):
                await check_room(rec, messages, prompt, p, body["model"], timeout)  # under the watch and the deadline
                t0 = time.perf_counter()  # the answer's times start at its request, after the count
                try:
                    async for raw in sse:
                        touch()
                        events += 1
                        try:
                            chunk = parse(raw, chat=messages is not None)
                        except BadChunk as exc:
                            raise UpstreamError(who, f"sent a malformed chunk ({exc})", fix, sent=quote(raw)) from None
                        except ReportedError as exc:  # an error the engine reports: the request's, an overload's
                            raise classify(exc.error, who, fix) from None
                        usage = chunk.usage or usage
                        for whole in chunk.pieces:
                            piece = whole[: max(0, max_chars + 1 - size)]  # a whole JSON answer is cut too
                            first = first or time.perf_counter()
                            text.append(piece)
                            chunks += 1
                            size += len(piece)
                            if report is not None:
                                await report(float(chunks), float(p.max_tokens), piece)
                        finish = chunk.finish or finish
                        if events > max_events or size > max_chars:
                            finish = "length"  # the server went on past max_tokens: the connection is dropped
                            break
                except client.StreamEnded:
                    if finish is None:
                        raise
    except TimeoutError:
        raise BusyError(
            f"{who} did not finish its answer within {deadline:g} s (max_tokens={p.max_tokens}); lower max_tokens, "
            f"or {fix}"
        ) from None
    finish = finish or "stop"  # [DONE] came: a server that gives no finish_reason ended the answer itself
    end = time.perf_counter()
    out = "".join(text)
    completion = usage.get("completion_tokens") or chunks
    decode = (completion - 1) / (end - first) if first and completion > 1 and end > first else None
    parsed = None
    if p.json_schema is not None and finish == "stop":
        schema = p.json_schema

        def checked() -> Any:
            try:
                value = json.loads(out)
            except json.JSONDecodeError as exc:
                raise not_json("the engine's", exc, p.stop) from exc
            check_output(schema, value, out)
            return value

        # parsed in a worker thread too: max_tokens allows an answer of tens of MB, too long a parse for the loop
        # every client shares
        parsed = await anyio.to_thread.run_sync(checked)
    return GenerationResult(
        model=served_as(rec, model),
        text=out,
        finish_reason=finish if finish in ("length", "content_filter") else "stop",
        prompt_tokens=usage.get("prompt_tokens") or 0,
        completion_tokens=completion,
        time_to_first_token_s=round(first - t0, 4) if first else None,
        prefill_tokens_per_s=None,
        decode_tokens_per_s=round(decode, 2) if decode else None,
        total_seconds=round(end - t0, 4),
        parsed_json=parsed,
    )


async def benchmark(
    rec: EngineRecord,
    requests: int,
    concurrency: int,
    prompt_tokens: int,
    max_tokens: int,
    memory_gb: float,
    report: Progress | None,
    live: Liveness | None = None,
) -> BenchmarkResult:
    """N requests, `concurrency` in flight, against the engine: what continuous batching gives many clients."""
    words = (FILLER * (prompt_tokens // 16 + 2))[: prompt_tokens * 4]  # about 4 characters a token
    params = GenParams(max_tokens=max_tokens, temperature=0.0, top_k=1, repeat_penalty=1.0)
    # the room is checked once, on the longest prompt, not in every timed request: the engine's latency is measured,
    # not a /tokenize round trip per request (the requests then go as `fit`: nothing left to check)
    async with watching(live):  # an engine known silent fails here, as a request would
        await check_room(rec, None, f"{requests - 1}. {words}", params, rec.model, COUNT_S)
    params = dataclasses.replace(params, fit=True)

    def send(i: int) -> Awaitable[GenerationResult]:
        return generate(rec, None, f"{i}. {words}", params, None, live=live)

    results, latencies, wall = await drive(requests, concurrency, send, report)
    decode = [x.decode_tokens_per_s for x in results if x.decode_tokens_per_s]
    return BenchmarkResult(
        model=rec.model,
        backend=rec.engine,
        device=rec.plan.device if rec.plan else "remote",
        requests=requests,
        concurrency=concurrency,
        max_tokens=max_tokens,
        prefill_tokens_per_s=0.0,  # the engine does not report prefill time per request
        decode_tokens_per_s=round(statistics.mean(decode), 2) if decode else 0.0,
        **timing(results, latencies, wall),
        peak_memory_gb=round(memory_gb, 3),
        calibration_note="served by an engine: not stored as a llama.cpp calibration",
    )
