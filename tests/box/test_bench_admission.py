"""Benchmarks in the box ledger: each call's reservation is its own, so a second client's queued run of the same
benchmark that gives up (its MCP call cancelled) or loses the race never frees the running one's memory."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from gpubox.settings import Settings
from gpubox.tools.bench import service as bench_service
from gpubox.tools.bench.service import BenchService
from gpubox.tools.box.capacity import Reading
from gpubox.tools.box.ledger import Ledger

pytestmark = pytest.mark.anyio


def two_devices(_pids: object) -> dict[str, Reading]:
    return {"host": Reading(total_gb=64.0, used_gb=2.0), "cuda:0": Reading(total_gb=80.0, used_gb=0.0)}


async def test_a_cancelled_queued_run_leaves_the_running_one_its_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench_service, "active_finetune_jobs", lambda _settings: [])
    settings = Settings.load(state_dir=tmp_path / "state")
    ledger = Ledger(settings, read=two_devices)
    bench = BenchService(settings, ledger, busy_models=lambda: [])
    needs = {"cuda:0": 10.0}
    running = await bench._admit("attention", needs, False, None)  # client A: admitted, its worker runs
    queued: list[str] = []

    async def client_b() -> None:  # queued behind A (one benchmark at a time), then its call is cancelled
        with anyio.move_on_after(30) as scope:
            await bench._admit("attention", needs, True, None)
        queued.append("timed out" if scope.cancelled_caught else "admitted")

    async with anyio.create_task_group() as tg:
        tg.start_soon(client_b)
        with anyio.fail_after(30):
            while not ledger.state().queued:
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()  # B's client goes away while it waits in line
    held = ledger.holding(running)
    assert held is not None and held.devices == needs  # A still holds its 10 GB
    assert [d.reserved_gb for d in ledger.state().devices if d.device == "cuda:0"] == [10.0]
    assert not queued  # B never got in, and left the line
    await anyio.to_thread.run_sync(bench._release, running, None)
    assert ledger.holding(running) is None and not bench._lock.locked()
