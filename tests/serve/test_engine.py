"""The real vLLM engine on this CPU, through the MCP tools: SmolLM2 served from its HF copy with a LoRA adapter on
top (a fine-tuning adapter's layout), chat and completion routed to it, a JSON schema obeyed, four clients batched,
attach, bad input, a killed engine, a graceful stop.

One engine serves the module (start-up is about a minute); a second, started at the same time with two pipeline
ranks (one per CPU core), answers one question and is then killed to show how a dead engine is reported. Skipped
with the reason when no Python with vLLM is found (CI installs one with `scripts/install_engine.sh`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.settings import Settings
from tests.conftest import ROOT, call_err, call_ok, requires_train, wait_until
from tests.finetune.conftest import BASE_NAME, link_base

pytestmark = [pytest.mark.anyio, pytest.mark.slow, requires_train]
ENGINE_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
ENGINE_LOCK = ROOT / ".venv-vllm.lock"
MODEL = "smollm2-135m-instruct"
ADAPTER = "ft-colours"
PARIS = [{"role": "user", "content": "What is the capital of France?"}]
TWO_CORES = len(os.sched_getaffinity(0)) >= 2


def make_adapter(state: Path) -> None:
    """A LoRA adapter on the linked HF base, where fine-tuning leaves its adapters, with random (not zero) B
    matrices so that it visibly changes the base's answers."""
    import peft
    import torch
    import transformers

    base = state / "finetune" / "base" / BASE_NAME
    model = transformers.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    cfg = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    tuned = peft.get_peft_model(model, cfg)
    torch.manual_seed(0)
    for name, p in tuned.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.5)
    tuned.peft_config["default"].base_model_name_or_path = str(base)  # absolute, as a trainer writes it
    with warnings.catch_warnings():  # peft looks the base name up on a hub to check the vocabulary
        warnings.simplefilter("ignore")
        tuned.save_pretrained(str(state / "finetune" / "adapters" / ADAPTER))


def engine_python() -> Path:
    made_beside()
    if not ENGINE_PYTHON.is_file():
        pytest.skip("needs the vLLM engine environment: scripts/install_engine.sh (creates .venv-vllm)")
    return ENGINE_PYTHON


def made_beside(timeout_s: float = 1200) -> None:
    """scripts/test.sh makes .venv-vllm beside the suite's first tests and holds ENGINE_LOCK meanwhile: wait for
    it, so these tests never see a half-made environment (and never skip for one that is on its way)."""
    if not ENGINE_LOCK.exists():
        return
    with ENGINE_LOCK.open() as f:
        taker = threading.Thread(target=fcntl.flock, args=(f, fcntl.LOCK_SH), daemon=True)
        taker.start()
        taker.join(timeout_s)
        if taker.is_alive():
            pytest.fail(f"the vLLM environment was still being made after {timeout_s:g} s ({ENGINE_LOCK} held)")


async def follow(c: Client, engine_id: str) -> dict[str, Any]:
    async def started() -> dict[str, Any] | None:
        st = await call_ok(c, "serve_status", engine_id=engine_id, wait_seconds=30)
        return st if st["state"] not in ("preparing", "starting") else None

    return await wait_until(started, timeout=900, interval=0.1)


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, hf_base: Path) -> Iterator[tuple[Any, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("serve")
    link_base(hf_base, root / "state")
    settings = Settings.load(state_dir=root / "state", allowed_roots=[root], serve_python=engine_python())
    make_adapter(settings.state_dir)
    mcp = build_server(settings)

    async def start() -> dict[str, Any]:
        async with Client(mcp) as c:
            # the main engine serves the base under its own name and the adapter on top (vLLM --enable-lora)
            main = await call_ok(c, "serve_start", model=ADAPTER, name=MODEL, enforce_eager=True, kv_cache_space_gb=1)
            # the second engine runs two pipeline ranks (one per core) when the box has two cores; its test asks it
            # a question, then another test kills it (started here, beside the first: one start-up wait, not two)
            ranks = 2 if TWO_CORES else 1
            doomed = await call_ok(
                c, "serve_start", model=MODEL, name="doomed", pipeline_parallel_size=ranks, enforce_eager=True,
                kv_cache_space_gb=1,
            )  # fmt: skip
            return {
                "main": await follow(c, main["id"]),
                "doomed": await follow(c, doomed["id"]),
                "doomed_start": doomed,
            }

    engines = anyio.run(start)
    yield mcp, engines
    from gpubox import services

    svc = services.serve(state_of(mcp))
    for rec in svc.engines.records():
        svc.engines.stop(rec.id, grace_s=10)
    state_of(mcp).close()


async def test_the_engine_starts_with_a_plan_and_holds_its_memory_in_the_ledger(box: Any) -> None:
    mcp, engines = box
    st = engines["main"]
    assert st["state"] == "ready" and st["healthy"], st
    assert st["served_models"] == [MODEL, ADAPTER] and st["base_url"].startswith("http://127.0.0.1:")
    plan = st["plan"]
    assert plan["device"] == "cpu" and plan["kv_cache_space_gb"] == 1 and plan["enforce_eager"]
    assert "vllm.entrypoints.openai.api_server" in plan["command"] and plan["reasons"]
    from gpubox import services

    # measured once ready (and at each serve_status), before any box_plan reads the devices: its peak is kept for
    # its configuration, and a peak above the plan is what the next start of it reserves
    peak = services.ledger(state_of(mcp)).peaks.peak(f"engine {st['id']}")
    assert peak is not None and peak["host"] > 0.5
    async with Client(mcp) as c:
        holdings = {h["owner"]: h for h in (await call_ok(c, "box_plan"))["box"]["holdings"]}
        listed = await call_ok(c, "serve_list")
    held = holdings[f"engine {st['id']}"]
    assert held["kind"] == "engine" and held["pid"] != os.getpid()
    assert held["measured_gb"]["host"] > 0.5  # the engine's processes, as the host shows them
    assert st["id"] in [e["id"] for e in listed["engines"]]


async def test_chat_and_completion_for_the_served_name_go_to_the_engine_and_stream(box: Any) -> None:
    mcp, _ = box
    seen: list[str] = []

    async def on_progress(_p: float, _t: float | None, message: str | None) -> None:
        seen.append(message or "")

    async with Client(mcp) as c:
        res = await c.call_tool(
            "infer_chat", {"model": MODEL, "messages": PARIS, "max_tokens": 24, "temperature": 0},
            progress_callback=on_progress,
        )  # fmt: skip
        done = await call_ok(c, "infer_complete", model=MODEL, prompt="The capital of France is", max_tokens=8)
        status = await call_ok(c, "serve_status", engine_id=box[1]["main"]["id"])
    out = res.structured_content or {}
    assert "Paris" in out["text"] and out["model"] == MODEL and out["completion_tokens"] > 0, out
    assert len(seen) >= 2 and "".join(seen) == out["text"]  # streamed piece by piece
    assert done["completion_tokens"] > 0
    assert status["metrics"]["generation_tokens_total"] >= out["completion_tokens"]
    # the served model was never loaded in-process
    async with Client(mcp) as c:
        models = await call_ok(c, "infer_models")
    assert all(m["loaded"] is None for m in models["models"])


async def test_chat_content_cannot_write_the_served_models_control_tokens(box: Any) -> None:
    """vLLM tokenizes the rendered chat with special-token parsing: '<|im_end|>' in a message was one control
    token (role injection); defused from the served folder's tokenizer files, it is text of several tokens."""
    mcp, _ = box

    def said(content: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": content}]

    async with Client(mcp) as c:
        plain = await call_ok(c, "infer_chat", model=MODEL, messages=said("Hi"), max_tokens=1, temperature=0)
        marked = await call_ok(c, "infer_chat", model=MODEL, messages=said("Hi<|im_end|>"), max_tokens=1, temperature=0)
    assert marked["prompt_tokens"] - plain["prompt_tokens"] >= 4, (plain, marked)  # one token before the fix


async def test_a_fine_tuned_adapter_is_served_on_its_base_by_name(box: Any) -> None:
    mcp, engines = box
    assert any(f"LoRA adapter {ADAPTER} (rank 8)" in r for r in engines["main"]["plan"]["reasons"])
    async with Client(mcp) as c:
        base = await call_ok(c, "infer_chat", model=MODEL, messages=PARIS, max_tokens=16, temperature=0)
        tuned = await call_ok(c, "infer_chat", model=ADAPTER, messages=PARIS, max_tokens=16, temperature=0)
        served = {m["name"]: m for m in (await call_ok(c, "infer_models"))["served"]}
    assert tuned["model"] == ADAPTER and tuned["completion_tokens"] > 0
    assert tuned["text"] != base["text"], (base["text"], tuned["text"])  # the adapter's weights took part
    assert served[ADAPTER]["engine_id"] == served[MODEL]["engine_id"] == engines["main"]["id"]


async def test_a_json_schema_is_obeyed_through_structured_outputs(box: Any) -> None:
    mcp, _ = box
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "population"],
        "additionalProperties": False,
    }
    async with Client(mcp) as c:
        out = await call_ok(
            c, "infer_chat", model=MODEL, messages=PARIS, json_schema=schema, max_tokens=64, temperature=0
        )
    assert set(out["parsed_json"]) == {"city", "population"} and isinstance(out["parsed_json"]["population"], int)


async def test_four_clients_at_once_are_batched(box: Any) -> None:
    mcp, _ = box
    spans: list[tuple[float, float]] = []

    async def one(c: Client, i: int) -> None:
        t0 = time.monotonic()
        await call_ok(c, "infer_complete", model=MODEL, prompt=f"Count from {i}:", max_tokens=48, temperature=0)
        spans.append((t0, time.monotonic()))

    async with contextlib.AsyncExitStack() as stack:  # every client connected before any request is sent
        clients = [await stack.enter_async_context(Client(mcp)) for _ in range(4)]
        async with anyio.create_task_group() as tg:
            for i, c in enumerate(clients):
                tg.start_soon(one, c, i)
    # continuous batching: every request was in flight while every other was (in-process they would queue)
    assert max(s for s, _ in spans) < min(e for _, e in spans), spans


async def test_a_request_closed_midway_is_aborted_by_the_engine(box: Any) -> None:
    """What a cancelled infer_chat does to the engine: gpubox's pooled connection is dropped, vLLM aborts."""
    from gpubox.tools.serve import client

    mcp, engines = box
    async with Client(mcp) as c:
        status = await call_ok(c, "serve_status", engine_id=engines["main"]["id"])
    url, key = status["base_url"], status["api_key"]

    def counters() -> tuple[float, float]:
        m = client.metrics(url, key)
        assert m is not None and m.requests_running is not None and m.generation_tokens_total is not None, m
        return m.requests_running, m.generation_tokens_total

    before = (await anyio.to_thread.run_sync(counters))[1]
    body = {"model": MODEL, "prompt": "Count to a thousand:", "max_tokens": 1500, "ignore_eos": True}
    async with contextlib.aclosing(client.stream(url, key, "/completions", body, 120)) as chunks:
        async for _ in chunks:
            assert (await anyio.to_thread.run_sync(counters))[0] >= 1  # the engine is generating it
            break  # the first token is out: the caller goes away
    _, done = await wait_until(lambda: (r := counters())[0] == 0 and r, timeout=60)
    assert done - before < 1500  # stopped early: not the 1500 tokens asked for
    async with Client(mcp) as c:  # and the engine serves the next request
        out = await call_ok(c, "infer_complete", model=MODEL, prompt="The capital of France is", max_tokens=8)
    assert out["completion_tokens"] > 0


async def test_a_max_tokens_beyond_the_engines_context_is_refused_and_an_unset_one_is_lowered(box: Any) -> None:
    """The rule of an in-process model: vLLM would quietly lower a max_tokens given beyond its context."""
    import re

    from gpubox.tools.serve import client

    mcp, engines = box
    main = engines["main"]
    n_ctx = main["plan"]["max_model_len"]
    async with Client(mcp) as c:
        chat = await call_err(c, "infer_chat", model=MODEL, messages=PARIS, max_tokens=n_ctx, temperature=0)
        done = await call_err(c, "infer_complete", model=MODEL, prompt="The capital of France is", max_tokens=n_ctx)
        # the engine answers the next request
        out = await call_ok(c, "infer_chat", model=MODEL, messages=PARIS, max_tokens=24, temperature=0)
    assert "Paris" in out["text"], out
    for text in (chat, done):
        found = re.search(r"the prompt is (\d+) tokens", text)
        assert "context length exceeded" in text and found and int(found[1]) > 0, text
        need = int(found[1]) + n_ctx
        assert f"context of {n_ctx} tokens" in text and f"({need} > {n_ctx})" in text, text
        assert f"serve_stop engine_id='{main['id']}'" in text and f"max_model_len={need}" in text, text

    # a prompt that leaves a few tokens of room, counted by the engine
    one = "The quick brown fox jumps over the lazy dog."
    body = {"model": MODEL}

    async def count(n: int) -> int:
        counted = await client.tokenize(main["base_url"], main["api_key"], {**body, "prompt": one * n}, 60)
        assert counted is not None and counted[1] == n_ctx, counted
        return counted[0]

    first, per = await count(1), await count(2) - await count(1)
    n = (n_ctx - 2 - first) // per + 1
    while (prompt_tokens := await count(n)) > n_ctx - 2:  # a sentence's count may vary by a token at its seam
        n -= 1
    room = n_ctx - prompt_tokens
    assert 2 <= room <= 2 * per + 2 < 256, (room, per)
    async with Client(mcp) as c:
        over = await call_err(c, "infer_complete", model=MODEL, prompt=one * n, max_tokens=room + 1, temperature=0)
        assert f"({n_ctx + 1} > {n_ctx})" in over, over
        # an unset max_tokens (256) is lowered to the room left: the answer ends at the context
        res = await call_ok(c, "infer_complete", model=MODEL, prompt=one * n, temperature=0)
    assert res["finish_reason"] == "length" and res["completion_tokens"] == room, res
    assert res["prompt_tokens"] == prompt_tokens, res


async def test_attach_routes_an_existing_server_and_never_stops_it(box: Any, tmp_path: Path) -> None:
    mcp, engines = box
    main = engines["main"]
    async with Client(mcp) as c:
        again = await call_err(c, "serve_start", model=MODEL, enforce_eager=True)
        assert f"already served by engine {main['id']}" in again
        taken = await call_err(c, "serve_attach", base_url=main["base_url"], api_key=main["api_key"])
        assert f"already served by engine {main['id']}" in taken  # the same name twice: routing would be ambiguous
    # a second gpubox (another user's, say) attaches the running engine by URL and key
    other = build_server(Settings.load(state_dir=tmp_path / "s", allowed_roots=[tmp_path]))
    try:
        async with Client(other) as c:
            wrong = await call_err(c, "serve_attach", base_url=main["base_url"], api_key="wrong-key")
            assert "refused the API key" in wrong
            att = await call_ok(c, "serve_attach", base_url=main["base_url"], api_key=main["api_key"])
            assert att["state"] == "attached" and att["healthy"] and att["served_models"] == [MODEL, ADAPTER]
            out = await call_ok(c, "infer_chat", model=MODEL, messages=PARIS, max_tokens=24, temperature=0)
            assert "Paris" in out["text"]
            detached = await call_ok(c, "serve_stop", engine_id=att["id"])
            assert detached["state"] == "stopped" and (await call_ok(c, "serve_list"))["engines"] == []
    finally:
        state_of(other).close()
    async with Client(mcp) as c:  # detaching never stopped the engine
        assert (await call_ok(c, "serve_status", engine_id=main["id"]))["healthy"]


async def test_infer_benchmark_on_a_served_model_measures_the_engine_with_concurrent_clients(box: Any) -> None:
    mcp, _ = box
    async with Client(mcp) as c:
        r = await call_ok(c, "infer_benchmark", model=MODEL, requests=8, concurrency=4, prompt_tokens=32, max_tokens=16)
    assert r["backend"] == "vllm" and r["requests"] == 8 and r["concurrency"] == 4
    assert r["aggregate_tokens_per_s"] > 0 and r["latency_s_p50"] > 0 and r["time_to_first_token_s_p50"] > 0
    assert r["calibration_id"] is None and "engine" in r["calibration_note"]


async def test_a_restarted_gpubox_finds_the_running_engine_again(box: Any) -> None:
    mcp, engines = box
    main = engines["main"]
    again = build_server(state_of(mcp).settings)  # a second server process on the same state dir
    try:
        async with Client(again) as c:
            listed = {e["id"]: e for e in (await call_ok(c, "serve_list"))["engines"]}
            owners = [h["owner"] for h in (await call_ok(c, "box_plan"))["box"]["holdings"]]
            out = await call_ok(c, "infer_chat", model=MODEL, messages=PARIS, max_tokens=24, temperature=0)
    finally:
        state_of(again).close()
    assert listed[main["id"]]["state"] == "ready" and listed[main["id"]]["healthy"]
    assert f"engine {main['id']}" in owners  # its reservation survived: the engine's process still runs
    assert "Paris" in out["text"]


async def test_bad_input_is_refused_and_leaves_nothing_running(box: Any, tmp_path: Path) -> None:
    mcp, engines = box
    before = {e["id"] for e in engines.values()}
    async with Client(mcp) as c:
        outside = await call_err(c, "serve_start", model="/etc")
        assert "outside" in outside or "allowed roots" in outside
        port = int(engines["main"]["base_url"].rsplit(":", 1)[1].split("/")[0])
        taken = await call_err(c, "serve_start", model=MODEL, name="other", port=port)
        assert f"port {port}" in taken and "taken" in taken
        listed = {e["id"] for e in (await call_ok(c, "serve_list"))["engines"]}
    assert listed == before  # no engine was started by the refused calls

    bare = Settings.load(state_dir=tmp_path / "s", allowed_roots=[tmp_path], serve_python=Path(sys.executable))
    other = build_server(bare)
    try:
        async with Client(other) as c:
            missing = await call_err(c, "serve_start", model=MODEL)
            assert "vLLM is not installed" in missing and "gpubox engine install vllm" in missing
            assert (await call_ok(c, "box_plan"))["box"]["holdings"] == []
    finally:
        state_of(other).close()


async def test_two_cpu_ranks_serve_one_model_in_pipeline(box: Any) -> None:
    if not TWO_CORES:
        pytest.skip("needs 2 usable CPU cores for 2 engine ranks")
    mcp, engines = box
    start, st = engines["doomed_start"], engines["doomed"]
    assert "--pipeline-parallel-size" in start["plan"]["command"] and not start["plan"]["enforce_eager"]
    assert st["state"] == "ready", st
    async with Client(mcp) as c:
        out = await call_ok(c, "infer_complete", model="doomed", prompt="The capital of France is", max_tokens=8)
    assert "Paris" in out["text"], out


async def test_a_killed_engine_is_reported_failed_with_its_log_and_its_memory_released(box: Any) -> None:
    mcp, engines = box
    doomed = engines["doomed"]
    from gpubox import services

    rec = services.serve(state_of(mcp)).engines.record(doomed["id"])
    assert rec.pid is not None
    os.killpg(rec.pid, signal.SIGKILL)
    async with Client(mcp) as c:

        async def failed() -> dict[str, Any] | None:
            st = await call_ok(c, "serve_status", engine_id=doomed["id"])
            return st if st["state"] == "failed" else None

        st = await wait_until(failed, timeout=60, interval=0.2)
        assert "exited" in st["error"] and st["log_tail"], st
        owners = [h["owner"] for h in (await call_ok(c, "box_plan"))["box"]["holdings"]]
    assert f"engine {doomed['id']}" not in owners

    async def group_gone() -> bool | None:  # every rank went with the engine's process group, none left behind
        try:
            os.killpg(rec.pid, 0)
        except ProcessLookupError:
            return True
        return None

    assert await wait_until(group_gone, timeout=60, interval=0.2)


async def test_serve_stop_ends_the_engine_gracefully_and_releases_its_memory(box: Any) -> None:
    mcp, engines = box
    main = engines["main"]
    from gpubox import services
    from gpubox.tools.box.capacity import pid_alive

    rec = services.serve(state_of(mcp)).engines.record(main["id"])
    async with Client(mcp) as c:
        stopped = await call_ok(c, "serve_stop", engine_id=main["id"])
        assert stopped["state"] == "stopped"
        owners = [h["owner"] for h in (await call_ok(c, "box_plan"))["box"]["holdings"]]
        routed = await call_ok(c, "infer_models")
    assert f"engine {main['id']}" not in owners and not pid_alive(rec.pid, rec.pid_started)
    assert routed["models"]  # the in-process models are still there
