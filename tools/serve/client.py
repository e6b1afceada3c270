"""An OpenAI-compatible engine over HTTP (vLLM, SGLang, llama.cpp's llama-server, Ollama's /v1): health, models,
Prometheus metrics, streamed chat/completions and vLLM's /tokenize. Plain httpx, so any such server is reached the
same way."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import ssl
import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

from gpubox.errors import BusyError, InvalidInputError, NotFoundError, UpstreamError
from gpubox.tools.serve.chunks import quote
from gpubox.tools.serve.schemas import EngineMetrics

# vLLM's Prometheus names (https://docs.vllm.ai/en/latest/design/metrics.html); KV usage was renamed in v1
METRICS = {
    "vllm:num_requests_running": "requests_running",
    "vllm:num_requests_waiting": "requests_waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:gpu_cache_usage_perc": "kv_cache_usage",
    "vllm:prompt_tokens_total": "prompt_tokens_total",
    "vllm:generation_tokens_total": "generation_tokens_total",
}


# /health, /models and /metrics answers are kilobytes (vLLM's metrics with many adapters: hundreds of KB)
MAX_BODY = 8 * 2**20
_WIRE_HEADERS = {"content-encoding", "content-length", "transfer-encoding"}


def verify(url: str) -> ssl.SSLContext | bool:
    """TLS verification for https engines, with one SSL context for the process: httpx builds one per client
    otherwise (~15 ms of CPU on the event loop per request, measured by bench/serve_bench.py); a loopback http://
    engine needs none."""
    return _ssl_context() if url.startswith("https://") else False


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    return ssl.create_default_context()


def headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _get(url: str, api_key: str | None, timeout: float) -> httpx.Response:
    """GET with a deadline for the whole exchange and a cap on the body. httpx's timeout bounds each read, so a
    server that sends a byte a second would hold the calling worker thread for good (and a cancelled MCP call
    cannot free a thread); here the request is cancelled at `timeout`, a reliable stop in async code. It runs an
    event loop of its own, so it blocks: call it from a worker thread."""
    try:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop in this thread (a worker thread): the usual case
            return anyio.run(_get_within, url, api_key, timeout)
        with concurrent.futures.ThreadPoolExecutor(1) as one:  # called on a loop's thread: its own thread then
            return one.submit(anyio.run, _get_within, url, api_key, timeout).result()
    except TimeoutError:
        raise httpx.ReadTimeout(f"no complete answer from {url} within {timeout:g} s") from None
    except (httpx.InvalidURL, UnicodeError, ValueError) as exc:  # a malformed URL or a key no header can carry
        raise InvalidInputError(f"cannot send a request to {url!r}: {exc}") from None


async def _get_within(url: str, api_key: str | None, timeout: float) -> httpx.Response:
    with anyio.fail_after(timeout):
        async with (
            httpx.AsyncClient(verify=verify(url), timeout=timeout) as c,
            c.stream("GET", url, headers=headers(api_key)) as r,
        ):
            body = bytearray()
            async for chunk in r.aiter_bytes():
                body += chunk
                if len(body) > MAX_BODY:
                    raise httpx.DecodingError(f"{url} answered more than {MAX_BODY // 2**20} MB")
            # the body is decoded already (gzip: prometheus_client's /metrics, proxies): without the headers that
            # describe the wire form, or the new Response would decode it a second time
            kept = [(k, v) for k, v in r.headers.multi_items() if k.lower() not in _WIRE_HEADERS]
            return httpx.Response(r.status_code, headers=kept, content=bytes(body), request=r.request)


def root_of(base_url: str) -> str:
    """The server root of an OpenAI base URL ('http://h:p/v1' -> 'http://h:p'), where vLLM serves /health."""
    return base_url[: -len("/v1")] if base_url.rstrip("/").endswith("/v1") else base_url.rstrip("/")


def healthy(base_url: str, api_key: str | None, timeout: float = 5.0) -> bool:
    """Whether the server answers: /health says 200, or (no such route: Ollama's 404, a gateway's 401/403/405 for a
    path it does not pass on, a base URL under a prefix) its model list does. A 5xx from /health is an engine that
    is up but broken (vLLM's engine core gone): not healthy."""
    try:
        r = _get(root_of(base_url) + "/health", api_key, timeout)
        if r.status_code != 200 and r.status_code < 500:
            r = _get(base_url.rstrip("/") + "/models", api_key, timeout)
        return r.status_code == 200
    except httpx.HTTPError:
        return False


def models(base_url: str, api_key: str | None, timeout: float = 5.0, attaching: bool = False) -> list[str]:
    """The ids /models lists. An answer that is not a model list is the caller's own base_url at fault while
    `attaching` (an InvalidInputError: no engine exists yet, and another URL is the fix), the server's once it was
    attached and answered one (an UpstreamError)."""
    try:
        r = _get(base_url.rstrip("/") + "/models", api_key, timeout)
    except httpx.HTTPError as exc:
        raise NotFoundError(f"no OpenAI-compatible server answers at {base_url}: {exc}") from None
    if r.status_code in (401, 403):
        raise InvalidInputError(f"{base_url} refused the API key (HTTP {r.status_code}); pass the server's key")
    if r.status_code != 200:
        raise NotFoundError(f"{base_url}/models answered HTTP {r.status_code}; is this an OpenAI-compatible base URL?")
    try:
        return [str(m["id"]) for m in r.json()["data"]]
    except (ValueError, KeyError, TypeError):
        sent = quote(r.content.decode("utf-8", "replace"))
        if attaching:
            raise InvalidInputError(
                f"{base_url} did not return an OpenAI model list at {base_url.rstrip('/')}/models; is this the "
                f"server's OpenAI-compatible base URL (usually ending in /v1)? It sent: {sent}"
            ) from None
        raise UpstreamError(
            f"the server at {base_url}",
            "did not return an OpenAI model list from /models",
            "check that this is its OpenAI-compatible base URL (vLLM's ends in /v1) and read the server's log; "
            "restart it, or serve_stop its engine_id to detach it",
            sent=sent,
        ) from None


def metrics(base_url: str, api_key: str | None, timeout: float = 5.0) -> EngineMetrics | None:
    try:
        r = _get(root_of(base_url) + "/metrics", api_key, timeout)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    found: dict[str, float] = {}
    for line in r.text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name_labels, _, value = line.rpartition(" ")
        field = METRICS.get(name_labels.split("{", 1)[0])
        if field is not None:
            try:
                found[field] = found.get(field, 0.0) + float(value)
            except ValueError:
                continue
    return EngineMetrics(**found) if found else None


async def stream(
    base_url: str,
    api_key: str | None,
    path: str,
    body: dict[str, Any],
    timeout: float,
    who: str | None = None,
    fix: str = "check the server",
) -> AsyncGenerator[dict[str, Any], None]:
    """POST with stream=true and yield each server-sent JSON chunk until [DONE]. What the server does wrong is an
    UpstreamError (a refused connection, a line that is not JSON or longer than MAX_LINE, an HTTP 5xx), a stream that
    ends without [DONE] a StreamEnded (one too); a timeout or an overload is a BusyError, an HTTP 4xx (the server
    refused the request's arguments) an InvalidInputError. `who` names the engine and `fix` says what to do."""
    who = who or f"the engine at {base_url}"
    try:
        # closed with this generator, not later by the interpreter's async-generator cleanup: the connection (and
        # the engine's work on the request) ends the moment the caller stops reading
        async with contextlib.aclosing(_stream(base_url, api_key, path, body, timeout, who, fix)) as chunks:
            async for chunk in chunks:
                yield chunk
    except httpx.TimeoutException as exc:  # slow, not wrong: the liveness watch tells a hung engine apart
        raise BusyError(f"{who} did not answer ({type(exc).__name__}: {exc}); serve_status shows its state") from None
    except httpx.RemoteProtocolError as exc:  # a crashed server's chunked answer ends mid-way: a cut stream
        raise StreamEnded(who, f"broke off its answer ({exc}): the answer is incomplete", f"retry, or {fix}") from None
    except httpx.HTTPError as exc:  # refused or reset connection, a body that does not decode
        raise UpstreamError(who, f"did not answer ({type(exc).__name__}: {exc})", fix) from None


# One pooled client per engine and event loop while requests to it are in flight: concurrent requests share
# keep-alive connections instead of each building a client (transport, pool) and opening a connection, the
# per-request cost that grows with concurrent clients (bench/serve_bench.py). The last request out closes it, so no
# socket outlives the calls that used it. A response closed before its end drops its connection, so a cancelled MCP
# call still makes vLLM abort the request. Keyed by loop: an httpx client is bound to the loop it first ran on.
# Idle connections expire before uvicorn's 5 s keep-alive closes them server-side (a reuse would race that close).
_LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=4.0)


@dataclass
class _Pool:
    client: httpx.AsyncClient
    users: int = 0


_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Pool]] = weakref.WeakKeyDictionary()


@contextlib.asynccontextmanager
async def _pooled(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    pools = _POOLS.setdefault(asyncio.get_running_loop(), {})
    tls: ssl.SSLContext | bool = False  # a loopback http:// engine needs none
    if base_url not in pools and base_url.startswith("https://"):
        # the first TLS context reads the system's CA bundle from disk: in a worker thread, not on the loop every
        # client shares (cached after), and that one context is the pool's; looked up again below, so no await lies
        # between the check and the insert
        tls = await anyio.to_thread.run_sync(_ssl_context)
    pool = pools.get(base_url)
    if pool is None:
        pool = pools[base_url] = _Pool(httpx.AsyncClient(limits=_LIMITS, verify=tls))
    pool.users += 1
    try:
        yield pool.client
    finally:
        pool.users -= 1
        if pool.users == 0:
            pools.pop(base_url, None)
            with anyio.CancelScope(shield=True):  # a cancelled call still closes the sockets it leaves
                await pool.client.aclose()


async def _stream(
    base_url: str, api_key: str | None, path: str, body: dict[str, Any], timeout: float, who: str, fix: str
) -> AsyncGenerator[dict[str, Any], None]:
    url, limit = base_url.rstrip("/") + path, httpx.Timeout(timeout, connect=10.0)
    async with (
        _pooled(base_url) as c,
        c.stream("POST", url, json={**body, "stream": True}, headers=headers(api_key), timeout=limit) as r,
    ):
        if r.status_code != 200:
            text = (await r.aread()).decode("utf-8", "replace")[:800]
            if r.status_code == 429 or r.status_code == 503:
                raise BusyError(f"{who} is overloaded (HTTP {r.status_code}): {text}")
            if r.status_code >= 500:  # the server failed, whatever the request held
                raise UpstreamError(who, f"failed the request (HTTP {r.status_code})", fix, sent=quote(text))
            raise InvalidInputError(f"{who} refused the request (HTTP {r.status_code}): {text}")
        if r.headers.get("content-type", "").startswith("application/json"):
            # a server that ignores stream=true answers one JSON completion: read as one chunk of a stream
            yield _as_chunk(await _read_capped(r, who, fix), who, fix)
            return
        events = 0
        async for line in _lines_of(r, who, fix):
            if not line.startswith(b"data:"):
                continue  # SSE comments (keep-alives), event names, blank separators
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            if not data:
                continue
            events += 1
            try:
                chunk = json.loads(data)
            except ValueError:
                sent = quote(data.decode("utf-8", "replace"))
                raise UpstreamError(who, "sent a chunk that is not JSON", fix, sent=sent) from None
            yield chunk
        what = f"closed its stream after {events} chunks without [DONE]" if events else "sent no chunk (no 'data:')"
        raise StreamEnded(who, f"{what}: the answer is incomplete", f"retry, or {fix}")


# A /tokenize answer lists the prompt's token ids: parsed in a worker thread past this size (a long prompt's list is
# megabytes), not on the loop every client shares
PARSE_ON_LOOP = 2**16


async def tokenize(base_url: str, api_key: str | None, body: dict[str, Any], timeout: float) -> tuple[int, int] | None:
    """vLLM's POST /tokenize (at the server root, beside /health): the prompt's token count as the engine counts it
    (`body` holds "messages" for a chat, its template applied as for /chat/completions, or "prompt") and the
    engine's max_model_len. None when the check could not run (no such route, an error, an answer without the two
    numbers): the request is then sent as before, since only the engine can refuse or lower it; a count must not
    fail a request the engine itself would answer."""
    url, limit = root_of(base_url) + "/tokenize", httpx.Timeout(timeout, connect=10.0)
    try:
        async with (
            _pooled(base_url) as c,
            c.stream("POST", url, json=body, headers=headers(api_key), timeout=limit) as r,
        ):
            if r.status_code != 200:
                return None
            raw = await _read_capped(r, f"the engine at {base_url}", "check the server")
        answer = json.loads(raw) if len(raw) <= PARSE_ON_LOOP else await anyio.to_thread.run_sync(json.loads, raw)
        count, n_ctx = answer["count"], answer["max_model_len"]
    except (httpx.HTTPError, UpstreamError, ValueError, KeyError, TypeError, IndexError):
        return None
    if type(count) is not int or type(n_ctx) is not int or count < 0 or n_ctx < 1:
        return None
    return count, n_ctx


class StreamEnded(UpstreamError):
    """The stream closed before [DONE]: an answer cut short (a crash, a proxy's timeout), unless a chunk had
    already given its finish_reason."""


# One server-sent line: a chunk of one token is a few hundred bytes. A server that sends a line without end
# (300 MB were seen) is refused here instead of held whole in memory.
MAX_LINE = 2**20


async def _lines_of(r: httpx.Response, who: str, fix: str) -> AsyncGenerator[bytes, None]:
    """The response's lines, the last one too when the stream ends without a newline (as aiter_lines gave it)."""
    lines = _Lines(who, fix)
    async for part in r.aiter_bytes():
        for line in lines.feed(part):
            yield line
    if lines.buf:
        yield bytes(lines.buf).rstrip(b"\r")


class _Lines:
    """Split a byte stream into lines with a cap on each (httpx's aiter_lines buffers a line whatever its size)."""

    def __init__(self, who: str, fix: str) -> None:
        self.buf = bytearray()
        self.who, self.fix = who, fix

    def feed(self, part: bytes) -> list[bytes]:
        self.buf += part
        out: list[bytes] = []
        start = 0
        while (end := self.buf.find(b"\n", start)) >= 0:
            self._check(start, end)
            out.append(bytes(self.buf[start:end]).rstrip(b"\r"))
            start = end + 1
        del self.buf[:start]
        self._check(0, len(self.buf))
        return out

    def _check(self, start: int, end: int) -> None:
        if end - start > MAX_LINE:
            raise UpstreamError(
                self.who,
                f"sent a line longer than {MAX_LINE // 2**20} MB, which no OpenAI-compatible stream does; the "
                "request was ended",
                self.fix,
                sent=_excerpt(self.buf[start:end]),
            )


def _excerpt(raw: bytes | bytearray) -> str:
    """The start of a long answer, with its size: the whole may be megabytes."""
    return quote(bytes(raw[:200]).decode("utf-8", "replace")) + f"... ({len(raw)} bytes)"


async def _read_capped(r: httpx.Response, who: str, fix: str) -> bytes:
    body = bytearray()
    async for part in r.aiter_bytes():
        body += part
        if len(body) > MAX_BODY:
            raise UpstreamError(who, f"answered more than {MAX_BODY // 2**20} MB to one request", fix, _excerpt(body))
    return bytes(body)


def _as_chunk(raw: bytes, who: str, fix: str) -> Any:
    """A whole completion as a stream's chunk: each chat choice's `message` becomes its `delta` (a completion's
    `text` is the same in both). Its shape is checked with every other chunk's (chunks.parse)."""
    try:
        answer = json.loads(raw)
    except ValueError:
        sent = quote(raw.decode("utf-8", "replace"))
        raise UpstreamError(who, "answered JSON that does not parse", fix, sent=sent) from None
    if isinstance(answer, dict) and isinstance(answer.get("choices"), list):
        answer["choices"] = [
            {**c, "delta": c.get("message")} if isinstance(c, dict) and "message" in c else c for c in answer["choices"]
        ]
    return answer
