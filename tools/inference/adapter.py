"""Inference family: infer_models, infer_load, infer_unload, infer_chat, infer_complete, infer_benchmark."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Annotated, Any, Literal

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Resolve
from pydantic import Field

from gpubox import services
from gpubox.confirm import Confirmation, ask, go_ahead, require
from gpubox.errors import InvalidInputError
from gpubox.registry import COMPUTE, DESTRUCTIVE, READ_ONLY, STARTS, WRITES, app_state, gpubox_tool
from gpubox.services import models
from gpubox.state import AppState
from gpubox.tools.inference import service
from gpubox.tools.inference.backends import GenParams
from gpubox.tools.inference.manager import ModelManager, Resident
from gpubox.tools.inference.schemas import (
    BenchmarkResult,
    ChatMessage,
    GenerationResult,
    LoadResult,
    ModelList,
    ServedModel,
    UnloadResult,
)
from gpubox.tools.inference.specials import defuse, of_served
from gpubox.tools.serve.schemas import EngineRecord

if TYPE_CHECKING:
    from gpubox.tools.serve.liveness import Liveness

ModelName = Annotated[str | None, Field(description="Default: the loaded one, else the bundled SmolLM2")]
MaxTokens = Annotated[
    int | None,
    Field(
        ge=1,
        le=131_072,
        description="Default 256, lowered to the room the context leaves; a larger one given is refused",
    ),
]
log = logging.getLogger("gpubox.inference")
DEFAULT_MAX_TOKENS = 256
Temperature = Annotated[float, Field(ge=0, le=5, description="0 = greedy")]
TopP = Annotated[float, Field(gt=0, le=1)]
TopK = Annotated[int, Field(ge=0, le=1000, description="0 = off")]
Repeat = Annotated[float, Field(ge=0.5, le=3)]
# a stop string is at least one character (an empty one ends every output at once) and short: transformers builds
# its stop matcher in time that grows faster than linearly with the length, holding the model
Stop = Annotated[list[Annotated[str, Field(min_length=1, max_length=256)]] | None, Field(max_length=16)]
Seed = Annotated[int | None, Field(ge=0, le=2**32 - 1, description="llama.cpp takes 32 bits")]
Schema = Annotated[dict[str, Any] | None, Field(description="JSON schema the output must follow")]


def manager(state: AppState) -> ModelManager:
    return models(state)


async def manager_off_loop(ctx: Context) -> ModelManager:
    """The model manager, from a worker thread: its first build opens the box ledger (a file lock another gpubox
    server may hold, NVML), and a caller waits there while another caller builds it."""
    return await anyio.to_thread.run_sync(manager, app_state(ctx))


def unload_when_loaded(mgr: ModelManager, key: str) -> None:
    """For a cancelled infer_load: waits for the load of `key` to end (unload does), then unloads what it left."""
    try:
        mgr.unload(key, missing_ok=True, wait=False)
    except Exception:  # a thread of its own: nobody else would hear of it
        log.exception("unloading %s after its cancelled load", key)


def gen_params(max_tokens: int | None, *rest: Any) -> GenParams:
    """The request's GenParams; an unset max_tokens is the default, lowered to the room left (`fit`)."""
    return GenParams(max_tokens or DEFAULT_MAX_TOKENS, *rest, fit=max_tokens is None)


async def served(state: AppState, model: str | None) -> tuple[EngineRecord, Liveness] | None:
    """The engine serving `model`, when one does, and how a request watches it: its requests go there, never
    also in-process."""
    if model is None:
        return None

    def find() -> tuple[EngineRecord, Liveness] | None:
        engines = services.serve(state).engines
        rec = engines.serving(model)
        return None if rec is None else (rec, engines.liveness(rec))

    return await anyio.to_thread.run_sync(find)


# sampling settings tools/list folds into `more` (gpubox.arguments); temperature and max_tokens stay in view
# a benchmark above this many tokens in all is confirmed first: 10,000 requests of 8,192 tokens ran without a word
BENCH_ASK_TOKENS = 50_000


def confirm_benchmark(
    ctx: Context, model: str | None = None, requests: int = 8, prompt_tokens: int = 128, max_tokens: int = 64
) -> Any:
    tokens = requests * (prompt_tokens + max_tokens)
    if tokens <= BENCH_ASK_TOKENS:
        return go_ahead()
    return ask(
        ctx,
        f"Benchmark {model or 'the default model'} with {requests} requests, {tokens:,} tokens in all? Other requests "
        "to that model wait behind its requests one at a time.",
    )


SAMPLING_MORE = ("top_p", "top_k", "repeat_penalty", "stop", "seed")


def register(mcp: MCPServer[Any]) -> None:
    @gpubox_tool(mcp, annotations=READ_ONLY, title="Models")
    def infer_models(ctx: Context) -> ModelList:
        """Runnable models (bundled SmolLM2, GGUF files, HF folders, LoRA adapters) with size, quantisation,
        context and where each is loaded; `served`: models that engines serve."""
        state = app_state(ctx)
        result = manager(state).list()
        result.served = [  # a LoRA adapter an engine serves on its base is a model of its own to callers
            ServedModel(name=name, engine=r.engine, engine_id=r.id, base_url=r.base_url, state=r.state)
            for r in services.serve(state).engines.records()
            if r.state != "stopped"
            for name in (r.model, *r.aliases)
        ]
        return result

    @gpubox_tool(
        mcp,
        annotations=WRITES,
        title="Load a model",
        more=("n_gpu_layers", "kv_cache_type", "quantization", "keep_alive_s"),
    )
    async def infer_load(
        ctx: Context,
        name: Annotated[str, Field(description="Model or adapter from infer_models", min_length=1)],
        backend: Literal["auto", "llama.cpp", "transformers"] = "auto",
        context_length: Annotated[int | None, Field(ge=128, le=1_048_576)] = None,
        n_gpu_layers: Annotated[int | None, Field(ge=-1, le=1000, description="Override the plan; -1 = all")] = None,
        kv_cache_type: Literal["f16", "q8_0", "q4_0"] = "f16",
        quantization: Annotated[
            Literal["4bit", "8bit"] | None, Field(description="transformers backend (bitsandbytes)")
        ] = None,
        adapter: Annotated[str | None, Field(description="LoRA adapter to apply")] = None,
        keep_alive_s: Annotated[
            float | None, Field(ge=0, le=604_800, description="Idle seconds before unload; 0 = never")
        ] = None,
        pin: Annotated[bool, Field(description="Never evict or idle-unload")] = False,
    ) -> LoadResult:
        """Load a model with GPU layers and context planned for free memory; evicts idle models if that makes
        room, else refuses naming who holds the memory."""
        mgr = await manager_off_loop(ctx)
        key = (adapter or name).lower()
        held = key in await anyio.to_thread.run_sync(mgr.loaded)
        try:
            return await anyio.to_thread.run_sync(
                lambda: mgr.load(
                    name, backend, context_length, n_gpu_layers, kv_cache_type, quantization, adapter, keep_alive_s, pin
                ),
                abandon_on_cancel=True,  # a cancelled call answers at once (it waited for the whole load before)
            )
        except anyio.get_cancelled_exc_class():
            if not held:  # neither backend can stop a load midway: what it leaves is unloaded once it ends
                threading.Thread(target=unload_when_loaded, args=(mgr, key), daemon=True).start()
            raise

    @gpubox_tool(mcp, annotations=DESTRUCTIVE, title="Unload a model")
    async def infer_unload(ctx: Context, name: str) -> UnloadResult:
        """Free a loaded model's memory (after its running request)."""
        mgr = await manager_off_loop(ctx)
        result = await anyio.to_thread.run_sync(lambda: mgr.unload(name, wait=False))
        await service.unloaded(mgr, name, ctx.report_progress)
        return result

    @gpubox_tool(mcp, annotations=COMPUTE, title="Chat", more=SAMPLING_MORE)
    async def infer_chat(
        ctx: Context,
        messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=1000)],
        model: ModelName = None,
        max_tokens: MaxTokens = None,
        temperature: Temperature = 0.7,
        top_p: TopP = 0.95,
        top_k: TopK = 40,
        repeat_penalty: Repeat = 1.1,
        stop: Stop = None,
        seed: Seed = None,
        json_schema: Schema = None,
    ) -> GenerationResult:
        """Chat with a model using its chat template; text streams as progress. A served model's engine answers."""
        params = gen_params(max_tokens, temperature, top_p, top_k, repeat_penalty, stop or [], seed, json_schema)
        msgs = [m.model_dump() for m in messages]
        route = await served(app_state(ctx), model)
        if route is not None:
            from gpubox.tools.serve import remote  # httpx: loaded once an engine serves something

            engine, live = route
            if engine.engine == "vllm":  # vLLM, too, parses control tokens in the rendered chat (see specials)
                msgs = defuse(msgs, await anyio.to_thread.run_sync(of_served, engine.source))
            return await remote.generate(engine, msgs, None, params, ctx.report_progress, model=model, live=live)
        return await service.generate(await manager_off_loop(ctx), model, msgs, None, params, ctx.report_progress)

    @gpubox_tool(mcp, annotations=COMPUTE, title="Complete", more=SAMPLING_MORE)
    async def infer_complete(
        ctx: Context,
        prompt: Annotated[str, Field(min_length=1, max_length=4_000_000)],
        model: ModelName = None,
        max_tokens: MaxTokens = None,
        temperature: Temperature = 0.7,
        top_p: TopP = 0.95,
        top_k: TopK = 40,
        repeat_penalty: Repeat = 1.1,
        stop: Stop = None,
        seed: Seed = None,
        json_schema: Schema = None,
    ) -> GenerationResult:
        """Continue a raw prompt (no chat template); text streams as progress."""
        params = gen_params(max_tokens, temperature, top_p, top_k, repeat_penalty, stop or [], seed, json_schema)
        route = await served(app_state(ctx), model)
        if route is not None:
            from gpubox.tools.serve import remote

            engine, live = route
            return await remote.generate(engine, None, prompt, params, ctx.report_progress, model=model, live=live)
        return await service.generate(await manager_off_loop(ctx), model, None, prompt, params, ctx.report_progress)

    @gpubox_tool(mcp, annotations=STARTS, title="Benchmark")
    async def infer_benchmark(
        ctx: Context,
        ok: Annotated[Confirmation, Resolve(confirm_benchmark)],
        model: ModelName = None,
        requests: Annotated[int, Field(ge=1, le=10_000)] = 8,
        concurrency: Annotated[int, Field(ge=1, le=256, description="Requests in flight")] = 1,
        prompt_tokens: Annotated[int, Field(ge=8, le=131_072)] = 128,
        max_tokens: Annotated[int, Field(ge=1, le=8192, description="Per request")] = 64,
    ) -> BenchmarkResult:
        """Measure a model's prefill/decode tok/s, time to first token, latency percentiles and peak memory."""
        require(ok, "infer_benchmark")
        state = app_state(ctx)
        route = await served(state, model)
        if route is not None:
            engine, live = route
            held = await anyio.to_thread.run_sync(lambda: services.ledger(state).holding(f"engine {engine.id}"))
            memory = sum(held.devices.values()) if held else 0.0
            from gpubox.tools.serve import remote

            return await remote.benchmark(
                engine, requests, concurrency, prompt_tokens, max_tokens, memory, ctx.report_progress, live
            )

        def record(r: Resident, decode: float, prefill: float, peak_gb: float) -> service.Recorded:
            # the estimator's llama.cpp figures: a GGUF that transformers dequantised runs another way entirely
            if r.entry.format != "gguf" or r.plan.backend != "llama.cpp" or decode <= 0:
                return None
            from gpubox.tools.estimate.adapter import estimator
            from gpubox.tools.gpu.nvml import gpu_status

            gpus = gpu_status().gpus
            gpu = gpus[0].name if gpus and r.plan.device.startswith("cuda") else "cpu"
            from gpubox.tools.estimate.modelinfo import read_gguf

            try:
                m = estimator(state).record_inference(
                    gpu,
                    read_gguf(r.entry.path),
                    None,
                    decode,
                    prefill or None,
                    peak_gb,
                    r.plan.context_length,
                    note=f"infer_benchmark {r.backend.name} on {r.plan.device}",
                )
            except InvalidInputError as exc:  # outside the estimator's physical bounds: the figures still stand
                return exc
            return m.id, m.decode_efficiency

        mgr = await manager_off_loop(ctx)
        return await service.benchmark(
            mgr, model, requests, concurrency, prompt_tokens, max_tokens, record, ctx.report_progress
        )
