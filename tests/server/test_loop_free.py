"""Nothing blocking runs on the event loop: while one client's async tool is held in a blocking step (a service
built the first time, the merge's file work, the ledger's lock), a second client's gpu_status still answers.

Each test holds the real step on a Gate (a threading.Event, with a safety timeout): run on the event loop, the gate
would stall the loop, so the second call could only finish once the gate gave up, which the test reports. Only the
blocking step is wrapped or faked; the tool's own path runs.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.types import CallToolResult

from gpubox.app import state_of
from gpubox.settings import Settings
from gpubox.tools.bench import service as bench_service
from gpubox.tools.bench.service import BenchService
from gpubox.tools.bench.worker import WorkerOutcome
from gpubox.tools.box.ledger import Ledger
from gpubox.tools.finetune import merge
from gpubox.tools.finetune.merge import Merger
from gpubox.tools.finetune.service import Finetuner
from gpubox.tools.search.service import SearchService
from tests.conftest import call_ok

pytestmark = pytest.mark.anyio

HOLD_S = 30.0  # a gate never released gives up after this long (so a broken fix fails instead of hanging)
WAIT_S = 20.0


class Gate:
    """A blocking step held until `release` is set; `entered` is set once the step is reached."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.on_loop = False
        self.gave_up = False

    def hold(self) -> None:
        try:
            asyncio.get_running_loop()
            self.on_loop = True  # called from the event loop's own thread
        except RuntimeError:
            pass
        self.entered.set()
        if not self.release.wait(HOLD_S):
            self.gave_up = True

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def held(*args: Any, **kwargs: Any) -> Any:
            self.hold()
            return fn(*args, **kwargs)

        return held


async def while_held(mcp: Any, gate: Gate, first: Callable[[Client], Awaitable[Any]]) -> Any:
    """Run `first` through one client; once it is held at `gate`, a second client's gpu_status must answer; then
    the gate opens and `first`'s answer is returned."""
    answer: list[Any] = []
    try:
        async with Client(mcp) as a, Client(mcp) as b, anyio.create_task_group() as tg:

            async def run_first() -> None:
                answer.append(await first(a))

            tg.start_soon(run_first)
            with anyio.fail_after(WAIT_S):
                await anyio.to_thread.run_sync(gate.entered.wait, WAIT_S, abandon_on_cancel=True)
            assert gate.entered.is_set(), "the tool never reached its blocking step"
            with anyio.fail_after(WAIT_S):
                status = await call_ok(b, "gpu_status")
            assert "memory" in status
            assert not gate.on_loop, "the blocking step ran on the event loop"
            assert not gate.gave_up, "the second client's call waited for the first one's blocking step"
            gate.release.set()
    finally:
        gate.release.set()
    return answer[0] if answer else None


def text(result: CallToolResult) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


async def test_finetune_status_builds_the_finetuner_off_the_loop(server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = Gate()
    monkeypatch.setattr(Finetuner, "__init__", gate.wrap(Finetuner.__init__))
    result = await while_held(server, gate, lambda c: c.call_tool("finetune_status", {"job_id": "abc123"}))
    assert result.is_error and "abc123" in text(result)  # the real status path ran: no such job


async def test_finetune_merge_builds_its_services_off_the_loop(server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = Gate()
    monkeypatch.setattr(Finetuner, "__init__", gate.wrap(Finetuner.__init__))
    result = await while_held(server, gate, lambda c: c.call_tool("finetune_merge", {"job": "nosuchjob"}))
    assert result.is_error and "nosuchjob" in text(result)


async def test_a_merge_does_its_file_work_off_the_loop(
    server: Any, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The merge process is faked (it needs a trained job); staging, the result, sizing the output (held here)
    and the cleanup run as in a real merge."""
    models = settings.state_dir / "models"
    spec = {
        "job_id": "j1", "adapter_name": "a1", "method": "lora", "name": "m1", "base_hf": "base", "dtype": "fp16",
        "parameters": 1000, "gguf": "none", "tmp_dir": str(settings.state_dir / "finetune" / "merge-tmp" / "m1"),
        "hf_out": str(models / "m1"), "gguf_out": None, "disk_free_gb": 1.0, "disk_needed_gb": 0.1,
    }  # fmt: skip

    async def child(self: Merger, tmp: Path, time_limit_s: float, progress: Any) -> list[str]:
        (models / "m1").mkdir(parents=True)
        (models / "m1" / "model.safetensors").write_bytes(b"0" * 1000)
        (tmp / "result.json").write_text(json.dumps({"hf_path": str(models / "m1")}))
        return []

    gate = Gate()
    monkeypatch.setattr(Merger, "prepare", lambda self, *args: spec)
    monkeypatch.setattr(Merger, "_child", child)
    monkeypatch.setattr(merge, "_size", gate.wrap(merge._size))
    result = await while_held(server, gate, lambda c: c.call_tool("finetune_merge", {"job": "j1"}))
    assert not result.is_error, text(result)
    assert result.structured_content is not None and result.structured_content["hf_size_gb"] == 0.0
    assert not Path(spec["tmp_dir"]).exists()  # cleaned up
    assert state_of(server).peek("ledger").holding("merge m1") is None  # released


async def test_search_index_builds_the_search_service_off_the_loop(
    server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate()
    monkeypatch.setattr(SearchService, "__init__", gate.wrap(SearchService.__init__))
    outside = tmp_path / "outside"
    outside.mkdir()
    result = await while_held(server, gate, lambda c: c.call_tool("search_index", {"path": str(outside)}))
    # the real checks ran after the build: the path (or, on a core-only install, the missing embedding model)
    assert result.is_error and ("allowed" in text(result) or "gpubox[models]" in text(result)), text(result)


async def test_bench_builds_its_service_off_the_loop(server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = Gate()
    monkeypatch.setattr(BenchService, "__init__", gate.wrap(BenchService.__init__))
    monkeypatch.setattr(bench_service, "is_available", lambda module: False)  # stops before a torch worker
    result = await while_held(server, gate, lambda c: c.call_tool("bench_device", {}))
    assert result.is_error and "bench" in text(result)


async def test_a_queued_benchmark_reads_its_queue_place_off_the_loop(
    server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue's place is read under the ledger's lock, which threads hold while they write its file."""
    gate = Gate()
    monkeypatch.setattr(Ledger, "position", gate.wrap(Ledger.position))
    monkeypatch.setattr(bench_service, "is_available", lambda module: True)

    async def worker(*args: Any, **kwargs: Any) -> WorkerOutcome:  # no torch process: the queue is under test
        return WorkerOutcome(status="failed", message="no worker in this test")

    monkeypatch.setattr(bench_service, "run_worker", worker)
    # it waits in the queue (something disturbs the timing) until its place was read
    monkeypatch.setattr(BenchService, "contention", lambda self: [] if gate.entered.is_set() else ["a test"])
    result = await while_held(server, gate, lambda c: c.call_tool("bench_device", {"queue": True, "device": "cpu"}))
    assert not result.is_error, text(result)
    assert state_of(server).peek("ledger").holders("benchmark") == []  # released


async def test_a_slow_service_build_holds_up_only_that_service(server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sync tool runs in a worker thread; while it builds the fine-tuning service, other services (the ledger
    gpu_status reads) are still handed out."""
    gate = Gate()
    monkeypatch.setattr(Finetuner, "__init__", gate.wrap(Finetuner.__init__))
    result = await while_held(server, gate, lambda c: c.call_tool("finetune_list", {}))
    assert not result.is_error and result.structured_content is not None
