"""One health probe in flight per engine (tools/serve/liveness.ProbeFlights): the requests of a hung engine share it."""

from __future__ import annotations

import threading

import anyio
import pytest

from gpubox.tools.serve.liveness import ProbeFlights

pytestmark = pytest.mark.anyio


class Probe:
    """A blocking probe that counts its calls and answers `ok` once released."""

    def __init__(self, ok: bool = True) -> None:
        self.ok, self.calls = ok, 0
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self) -> bool:
        self.calls += 1
        self.started.set()
        self.release.wait(30)
        return self.ok


async def wait_event(event: threading.Event) -> bool:
    return await anyio.to_thread.run_sync(event.wait, 30.0)


async def test_requests_that_ask_while_a_probe_runs_share_its_answer() -> None:
    flights, probe = ProbeFlights(), Probe(ok=False)
    answers: list[bool] = []

    async def ask() -> None:
        answers.append(await flights.answer("e1", probe))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            assert await wait_event(probe.started)
            for _ in range(20):
                tg.start_soon(ask)
            await anyio.wait_all_tasks_blocked()
            probe.release.set()
    assert probe.calls == 1 and answers == [False] * 21


async def test_a_waiter_probes_again_when_the_request_running_the_probe_is_cancelled() -> None:
    # the first request ends (its client went away) before its probe answers: the others must not read that as
    # "the engine did not answer" and end themselves
    flights, first, second = ProbeFlights(), Probe(ok=False), Probe(ok=True)
    answers: list[bool] = []

    async def follower() -> None:
        answers.append(await flights.answer("e1", second))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            leader = anyio.CancelScope()

            async def lead() -> None:
                with leader:
                    await flights.answer("e1", first)

            tg.start_soon(lead)
            assert await wait_event(first.started)
            tg.start_soon(follower)
            await anyio.wait_all_tasks_blocked()  # the follower waits on the leader's flight
            leader.cancel()
            assert await wait_event(second.started)  # so it probes itself
            second.release.set()
        first.release.set()
    assert first.calls == 1 and second.calls == 1 and answers == [True]


async def test_engines_are_probed_apart() -> None:
    flights, a, b = ProbeFlights(), Probe(ok=True), Probe(ok=False)
    answers: dict[str, bool] = {}

    async def ask(engine: str, probe: Probe) -> None:
        answers[engine] = await flights.answer(engine, probe)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, "a", a)
            tg.start_soon(ask, "b", b)
            assert await wait_event(a.started) and await wait_event(b.started)  # both in flight at once
            a.release.set()
            b.release.set()
    assert answers == {"a": True, "b": False}
