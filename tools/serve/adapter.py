"""Serving-engines family: serve_start, serve_status, serve_list, serve_stop, serve_attach (thin adapters)."""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any, Literal

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Resolve
from pydantic import Field

from gpubox import services
from gpubox.confirm import Confirmation, ask, go_ahead, require
from gpubox.errors import GpuboxError, NotFoundError
from gpubox.registry import DESTRUCTIVE, READ_ONLY, WRITES, app_state, gpubox_tool
from gpubox.settings import Settings
from gpubox.tools.inference.catalog import ModelCatalog
from gpubox.tools.serve.plan import Overrides
from gpubox.tools.serve.schemas import EngineList, EngineRecord, EngineStatus
from gpubox.toolsets import Toolset

EngineId = Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[a-f0-9]+$")]

log = logging.getLogger("gpubox.serve")


async def confirm_serve(
    ctx: Context,
    model: str,
    max_model_len: int | None = None,
    dtype: str | None = None,
    tensor_parallel_size: int | None = None,
    pipeline_parallel_size: int | None = None,
    nodes: int = 1,
    gpu_memory_utilization: float | None = None,
    kv_cache_space_gb: int | None = None,
) -> Any:
    """Ask the user (when the client can) with the memory the engine would hold with these flags, before it
    starts; a plan that fails is reported by the tool body with its reason."""
    svc = await anyio.to_thread.run_sync(services.serve, app_state(ctx))  # first use builds it: file locks
    o = Overrides(
        max_model_len, dtype, tensor_parallel_size, pipeline_parallel_size, gpu_memory_utilization,
        kv_cache_space_gb, None, nodes,
    )  # fmt: skip
    try:
        _base, plan, _args = await anyio.to_thread.run_sync(lambda: svc.plan(model, o))
    except GpuboxError:
        return go_ahead()
    held = ", ".join(f"{gb:.1f} GB on {d}" for d, gb in plan.memory_gb.items())
    return ask(ctx, f"Start a vLLM engine for {model}: it holds {held} until serve_stop; start-up takes minutes.")


# status calls probe engines over HTTP, each blocking a worker thread up to serve_probe_timeout_s: many of them on a
# hung engine took all of anyio's 40 shared threads, and every other client's tool waited. They queue here instead.
PROBES = anyio.CapacityLimiter(4)


def shadowed_local(settings: Settings, routed: list[str]) -> list[str]:
    """The names this engine takes requests for that are also local models (the names routing matches)."""
    try:
        local = ModelCatalog(settings).discovered()
    except Exception:  # a note only: an unreadable model dir must not fail an attach that succeeded
        log.warning("reading the model dirs for serve_attach's note", exc_info=True)
        return []
    return [m for m in routed if m.lower() in local]


def shadow_note(names: list[str], engine_id: str) -> str:
    shown = ", ".join(f"'{n}'" for n in names)
    return (
        f"{shown} is also a local model: infer_chat/infer_complete with that name now go to this server "
        f"(model omitted: the local one); serve_stop engine_id='{engine_id}' routes it back."
    )


def register(mcp: MCPServer[Any]) -> None:
    @gpubox_tool(
        mcp,
        annotations=WRITES,
        title="Serve a model with vLLM",
        more=("dtype", "pipeline_parallel_size", "nodes", "gpu_memory_utilization", "kv_cache_space_gb", "port"),
    )
    async def serve_start(
        ctx: Context,
        model: Annotated[str, Field(min_length=1, max_length=4096, description="infer_models name or HF folder")],
        ok: Annotated[Confirmation, Resolve(confirm_serve)],
        name: Annotated[str | None, Field(max_length=128, description="Served name; default: the model's")] = None,
        max_model_len: Annotated[int | None, Field(ge=128, le=1_048_576)] = None,
        dtype: Annotated[Literal["auto", "bfloat16", "float16", "float32"] | None, Field()] = None,
        tensor_parallel_size: Annotated[int | None, Field(ge=1, le=64)] = None,
        pipeline_parallel_size: Annotated[int | None, Field(ge=1, le=64)] = None,
        nodes: Annotated[int, Field(ge=1, le=64, description="Ray cluster nodes")] = 1,
        gpu_memory_utilization: Annotated[float | None, Field(gt=0, le=1)] = None,
        kv_cache_space_gb: Annotated[int | None, Field(ge=1, le=4096, description="CPU KV-cache space")] = None,
        enforce_eager: Annotated[bool | None, Field(description="Skip graph capture/compilation")] = None,
        port: Annotated[int | None, Field(ge=1024, le=65535, description="Default: a free one")] = None,
    ) -> EngineStatus:
        """Serve a model with vLLM so many clients share it; flags are planned for free memory (each
        overridable). Returns at once; poll serve_status."""
        require(ok, f"serving {model}")
        svc = await anyio.to_thread.run_sync(services.serve, app_state(ctx))
        o = Overrides(
            max_model_len, dtype, tensor_parallel_size, pipeline_parallel_size, gpu_memory_utilization,
            kv_cache_space_gb, enforce_eager, nodes,
        )  # fmt: skip
        return await anyio.to_thread.run_sync(lambda: svc.start(model, name, o, port))

    @gpubox_tool(mcp, annotations=READ_ONLY, title="Engine status")
    async def serve_status(
        ctx: Context,
        engine_id: EngineId,
        wait_seconds: Annotated[float, Field(ge=0, le=120, description="Wait this long for start-up")] = 0,
        include_log: Annotated[bool, Field(description="Add the log tail")] = False,
    ) -> EngineStatus:
        """An engine's state, health, URL and key, metrics and memory; the log tail if it failed."""
        engines = (await anyio.to_thread.run_sync(services.serve, app_state(ctx))).engines
        st = await anyio.to_thread.run_sync(engines.status, engine_id, include_log, limiter=PROBES)
        deadline = time.monotonic() + wait_seconds
        while st.state in ("preparing", "starting") and time.monotonic() < deadline:
            await ctx.report_progress(0, None, f"{st.state}: {time.monotonic() - deadline + wait_seconds:.0f} s")
            await anyio.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
            st = await anyio.to_thread.run_sync(engines.status, engine_id, include_log, limiter=PROBES)
        return st

    @gpubox_tool(mcp, annotations=READ_ONLY, title="Engines")
    async def serve_list(ctx: Context) -> EngineList:
        """Every engine gpubox runs or has attached, with its state and health."""
        engines = (await anyio.to_thread.run_sync(services.serve, app_state(ctx))).engines

        def all_status() -> EngineList:
            return EngineList(engines=[st for r in engines.records() if r.state != "stopped" and (st := one(r))])

        def one(rec: EngineRecord) -> EngineStatus | None:
            """One engine's status; one that cannot be read is listed with why, so it cannot fail the list."""
            try:
                return engines.status(rec.id)
            except NotFoundError:
                return None  # detached or swept since the records were read
            except GpuboxError as exc:
                return EngineStatus(
                    id=rec.id, engine=rec.engine, model=rec.model, state=rec.state, healthy=False,
                    base_url=rec.base_url, error=str(exc), next_step=f"serve_status engine_id='{rec.id}' shows it",
                )  # fmt: skip

        return await anyio.to_thread.run_sync(all_status, limiter=PROBES)

    @gpubox_tool(mcp, annotations=DESTRUCTIVE, title="Stop an engine")
    async def serve_stop(ctx: Context, engine_id: EngineId) -> EngineStatus:
        """Stop an engine and free its memory; an attached server is only detached."""
        engines = (await anyio.to_thread.run_sync(services.serve, app_state(ctx))).engines
        rec = await anyio.to_thread.run_sync(engines.stop, engine_id)
        return EngineStatus(
            id=rec.id, engine=rec.engine, model=rec.model, state="stopped", healthy=False, base_url=rec.base_url
        )

    @gpubox_tool(mcp, annotations=WRITES, title="Attach an OpenAI-compatible server")
    async def serve_attach(
        ctx: Context,
        base_url: Annotated[
            str, Field(max_length=2048, pattern=r"^https?://", description="e.g. http://127.0.0.1:8000/v1")
        ],
        api_key: Annotated[str | None, Field(max_length=4096)] = None,
        name: Annotated[str | None, Field(max_length=256, description="Served model; default: the first")] = None,
    ) -> EngineStatus:
        """Route infer_chat/infer_complete to a running OpenAI-compatible server; gpubox never stops it."""
        state = app_state(ctx)
        engines = (await anyio.to_thread.run_sync(services.serve, state)).engines
        rec = await anyio.to_thread.run_sync(lambda: engines.attach(base_url, api_key, name))
        status = await anyio.to_thread.run_sync(engines.status, rec.id, limiter=PROBES)
        if Toolset(state.settings.tools).exposes_tool("infer_chat"):
            shadowed = await anyio.to_thread.run_sync(shadowed_local, state.settings, [rec.model, *rec.aliases])
            if shadowed:  # requests by that name go to the attached server from now on; the local copy stays
                status.next_step = " ".join(filter(None, [status.next_step, shadow_note(shadowed, rec.id)]))
        return status
