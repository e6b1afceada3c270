"""Whether a served engine still answers, for requests and for serve_status.

An engine that stops answering (a hung process, an attached server gone silent or unreachable) would otherwise
stay 'ready' and hold every request for the whole read timeout (600 s). A request watches its engine instead:
after `after_s` without a byte, the engine's health is probed with the probe start-up and serve_status use
(GET /health, else /v1/models). An engine that answers it is slow, not gone (a long prefill on a CPU, a queue
behind other requests), and the request keeps waiting; one that does not ends the request at once with what to do,
and its record turns 'unresponsive' until a probe is answered again.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import anyio

from gpubox.errors import UpstreamError
from gpubox.tools.serve.records import RecordStore
from gpubox.tools.serve.schemas import EngineRecord, EngineState

ANSWERING: tuple[EngineState, ...] = ("ready", "attached")
SERVING: tuple[EngineState, ...] = (*ANSWERING, "unresponsive")  # routed to, probed by serve_status
SILENT_ERROR = "stopped answering its health probe; requests to it end at once until it answers again"


def answering_state(rec: EngineRecord) -> EngineState:
    return "ready" if rec.engine == "vllm" else "attached"


def answered(store: RecordStore, rec: EngineRecord, ok: bool) -> EngineRecord:
    """Record a probe's answer: a ready or attached engine that did not answer turns 'unresponsive', and back once
    it does. Only from those states, so a stop (or a detach, which removes the record) is never undone; the
    records' lock is taken only for a change (most probes change nothing)."""
    current = store.read(store.file(rec.id))
    if current is None:
        return rec  # detached meanwhile: nothing to record
    if ok and current.state == "unresponsive":
        return store.move(rec.id, ("unresponsive",), state=answering_state(rec), error=None) or current
    if not ok and current.state in ANSWERING:
        return store.move(rec.id, ANSWERING, state="unresponsive", error=SILENT_ERROR) or current
    return current


def restart_hint(rec: EngineRecord) -> str:
    if rec.engine == "vllm":
        return (
            f"serve_status engine_id='{rec.id}' include_log=true shows whether it recovers; serve_stop "
            f"engine_id='{rec.id}' ends a hung engine, then serve_start it again"
        )
    return (
        f"restart the server at {rec.base_url} (serve_status engine_id='{rec.id}' turns it back to 'attached' once "
        f"it answers), or serve_stop engine_id='{rec.id}' to detach it"
    )


@dataclass
class _Flight:
    done: anyio.Event
    ok: bool | None = None  # None: the probe's request ended before it answered


class ProbeFlights:
    """One health probe at a time per engine. Every waiting request of a hung engine reaches its probe point
    together (they all went silent together); without this each ran a probe of its own, a worker thread each
    for up to the probe's timeout. A request that asks while a probe is in flight takes that probe's answer."""

    def __init__(self) -> None:
        self._flights: dict[str, _Flight] = {}

    async def answer(self, engine_id: str, probe: Callable[[], bool]) -> bool:
        while True:
            flight = self._flights.get(engine_id)
            if flight is None:
                flight = self._flights[engine_id] = _Flight(anyio.Event())
                try:
                    # abandoned, not awaited, when the request ends first: the probe is bounded by its own timeout
                    flight.ok = await anyio.to_thread.run_sync(probe, abandon_on_cancel=True)
                    return flight.ok
                finally:
                    del self._flights[engine_id]
                    flight.done.set()
            await flight.done.wait()
            if flight.ok is not None:
                return flight.ok
            # the request that ran it was cancelled before the answer: probe again, as the next in line


@dataclass(frozen=True)
class Liveness:
    """How a request watches the engine `rec`: `probe` blocks (an HTTP probe) and says whether the engine answered,
    one at a time per engine through `flights`; `record` writes an answer to the engine's record (blocking: the
    records' lock)."""

    rec: EngineRecord
    after_s: float
    probe: Callable[[], bool]
    record: Callable[[bool], object]
    flights: ProbeFlights = field(default_factory=ProbeFlights)  # shared by every request to the engine

    async def answers(self) -> bool:
        return await self.flights.answer(self.rec.id, self.probe)

    async def recorded(self, ok: bool) -> None:
        await anyio.to_thread.run_sync(self.record, ok)

    def stopped(self, waited: bool) -> UpstreamError:
        rec = self.rec
        why = f"nothing came for {self.after_s:g} s and " if waited else ""
        return UpstreamError(
            f"engine {rec.id} serving '{rec.model}' at {rec.base_url}",
            f"stopped answering: {why}its health probe failed, so the request was ended",
            restart_hint(rec),
        )


class _Watch:
    def __init__(self, live: Liveness) -> None:
        self.live = live
        self.last = anyio.current_time()
        self.silent = False

    def touch(self) -> None:
        self.last = anyio.current_time()

    async def run(self, scope: anyio.CancelScope) -> None:
        """Probe after each `after_s` of silence (counted from the last byte or the last answered probe); cancel
        `scope`, the request's, when a probe goes unanswered and nothing came meanwhile."""
        probed = self.last
        while True:
            await anyio.sleep_until(max(self.last, probed) + self.live.after_s)
            asked = anyio.current_time()
            if asked < self.last + self.live.after_s:
                continue  # a chunk came while this slept
            if await self.live.answers():
                probed = anyio.current_time()
                await self.live.recorded(True)  # back to ready/attached if a status probe had missed
            elif self.last < asked:
                # recorded only now: a chunk that came while the probe waited shows the engine answers, whatever a
                # probe slower than its timeout under load says
                await self.live.recorded(False)
                self.silent = True
                scope.cancel()
                return
            else:
                probed = anyio.current_time()


@contextlib.asynccontextmanager
async def watching(live: Liveness | None) -> AsyncIterator[Callable[[], None]]:
    """Run a request under a watch on its engine; the request calls the yielded `touch` for each chunk. Raises
    UpstreamError (the request cancelled) when the engine stops answering, at once when it is already known silent."""
    if live is None:
        yield lambda: None
        return
    if live.rec.state == "unresponsive":
        ok = await live.answers()
        await live.recorded(ok)
        if not ok:
            raise live.stopped(waited=False)
    watch = _Watch(live)
    finished = False
    error: BaseException | None = None
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch.run, tg.cancel_scope)
            try:
                yield watch.touch
                finished = True
            finally:
                tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        if len(group.exceptions) != 1:
            raise
        error = group.exceptions[0]
    if watch.silent and not finished:  # the request was cancelled by the watch (any error is from that)
        raise live.stopped(waited=True) from error
    if error is not None:
        # one error alone (the request's, or a probe's that could not record its answer), as if unwatched
        raise error
