"""Bench family: bench_attention, bench_device, bench_list, bench_plot. Thin adapters over BenchService."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import anyio
from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.resolve import Resolve
from mcp.types import CallToolResult, TextContent
from pydantic import BaseModel, Field

from gpubox import services
from gpubox.confirm import Confirmation, ask, require
from gpubox.errors import InvalidInputError
from gpubox.registry import READ_ONLY, STARTS, WRITES, app_state, gpubox_tool
from gpubox.state import AppState
from gpubox.tools.bench.plots import Plot
from gpubox.tools.bench.schemas import AttentionBench, Backend, DeviceBench, PlotResult, RunList
from gpubox.tools.bench.service import BenchService

SeqLen = Annotated[int, Field(ge=1, le=262_144)]
HeadDim = Annotated[int, Field(ge=1, le=4096)]
# the lengths bounded in the schema, not only after it: a list of 20,000 bad values would otherwise be checked
# (and each error formatted) item by item on the event loop before any check of ours runs
SeqLens = Annotated[list[SeqLen], Field(min_length=1, max_length=16)]  # [] was confirmed, then refused
HeadDims = Annotated[list[HeadDim], Field(min_length=1, max_length=64)]
DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
DeviceArg = Literal["auto", "cuda", "cpu"]
Queue = Annotated[bool, Field(description="Wait if the device is busy")]
TimeLimit = Annotated[float, Field(ge=1, le=3600, description="Results so far are kept")]


def bench(state: AppState) -> BenchService:
    return services.bench(state)


def confirm_attention(ctx: Context, time_limit_s: float = 600) -> Any:
    return ask(ctx, f"Benchmark attention kernels for up to {time_limit_s:.0f} s, holding the device alone?")


def confirm_device(ctx: Context, time_limit_s: float = 300) -> Any:
    return ask(ctx, f"Benchmark this device for up to {time_limit_s:.0f} s, holding it alone?")


def as_list(value: int | list[int] | None, what: str) -> list[int] | None:
    if value is None:
        return None
    values = [value] if isinstance(value, int) else list(dict.fromkeys(value))
    if not values:
        raise InvalidInputError(f"{what} is an empty list; give at least one value or leave it out for the default")
    return values


def with_images(result: BaseModel, figs: list[Plot], headline: str) -> CallToolResult:
    """Structured result plus the plots as MCP image content, so a client can show them inline."""
    content: list[Any] = [TextContent(type="text", text=headline + "\n" + result.model_dump_json())]
    content += [Image(data=p.png, format="png").to_image_content() for p in figs]
    return CallToolResult(content=content, structured_content=result.model_dump(mode="json"))


def register(mcp: MCPServer[Any]) -> None:
    @gpubox_tool(
        mcp,
        annotations=STARTS,
        title="Benchmark attention kernels",
        more=(
            "batch",
            "heads",
            "backward",
            "backends",
            "baseline",
            "warmup",
            "iterations",
            "tolerance",
            "time_limit_s",
        ),
    )
    async def bench_attention(
        ctx: Context,
        ok: Annotated[Confirmation, Resolve(confirm_attention)],
        batch: Annotated[int, Field(ge=1, le=256)] = 1,
        heads: Annotated[int | None, Field(ge=1, le=1024, description="Default 48 GPU / 4 CPU")] = None,
        seq_len: Annotated[
            SeqLen | SeqLens | None, Field(description="Up to 16 values; default 8192 GPU / 256 CPU")
        ] = None,
        head_dim: Annotated[
            HeadDim | HeadDims | None,
            Field(description="Up to 64 values; default a 64-1024 sweep GPU / 32, 64 CPU"),
        ] = None,
        dtype: Annotated[Literal["auto", "fp16", "bf16", "fp32"], Field(description="'auto': fp16 GPU, fp32 CPU")] = (
            "auto"
        ),
        causal: bool = False,
        backward: Annotated[bool, Field(description="Also time the backward pass")] = False,
        backends: Annotated[list[Backend] | None, Field(description="Default: all", max_length=6)] = None,
        baseline: Annotated[Literal["auto"] | Backend, Field(description="Reference for speedups")] = "auto",
        warmup: Annotated[int, Field(ge=0, le=100)] = 3,
        iterations: Annotated[int, Field(ge=1, le=1000)] = 10,
        tolerance: Annotated[float | None, Field(gt=0, le=1, description="Max abs error vs fp32")] = None,
        device: DeviceArg = "auto",
        time_limit_s: TimeLimit = 600,
        queue: Queue = False,
    ) -> Annotated[CallToolResult, AttentionBench]:
        """Which attention kernel is fastest here? Times each backend per head_dim and seq_len, checks outputs
        against fp32, returns the winner per shape and plots."""
        require(ok, "bench_attention")
        seq_lens, head_dims = as_list(seq_len, "seq_len"), as_list(head_dim, "head_dim")
        if len(seq_lens or []) > 16 or len(head_dims or []) > 64:
            raise InvalidInputError("at most 16 seq_len and 64 head_dim values per run; split the sweep")
        if baseline != "auto" and backends and baseline not in backends:
            backends = [baseline, *backends]
        params = {
            "batch": batch,
            "heads": heads,
            "seq_lens": seq_lens,
            "head_dims": head_dims,
            "dtype": DTYPES.get(dtype),
            "causal": causal,
            "backward": backward,
            "backends": list(dict.fromkeys(backends)) if backends else None,
            "warmup": warmup,
            "iterations": iterations,
            "tolerance": tolerance,
            "device": device,
        }
        svc = await anyio.to_thread.run_sync(bench, app_state(ctx))  # a first build opens the ledger: off the loop
        result, figs = await svc.attention(params, baseline, time_limit_s, ctx.report_progress, queue)
        won = ", ".join(f"D={w.head_dim} N={w.seq_len}: {w.backend}" for w in result.winners if w.backend)
        return with_images(result, figs, f"bench_attention {result.run_id} ({result.status}); winners: {won or 'none'}")

    @gpubox_tool(
        mcp,
        annotations=STARTS,
        title="Benchmark the device",
        more=("iterations", "matmul_size", "buffer_mb", "time_limit_s"),
    )
    async def bench_device(
        ctx: Context,
        ok: Annotated[Confirmation, Resolve(confirm_device)],
        device: DeviceArg = "auto",
        iterations: Annotated[int | None, Field(ge=1, le=100, description="Default 10 GPU / 5 CPU")] = None,
        matmul_size: Annotated[int | None, Field(ge=128, le=32768, description="Default 8192 GPU / 1024 CPU")] = None,
        buffer_mb: Annotated[int | None, Field(ge=16, le=16384, description="Default 1024 GPU / 256 CPU")] = None,
        time_limit_s: TimeLimit = 300,
        queue: Queue = False,
    ) -> DeviceBench:
        """Measure memory bandwidth and matmul TFLOPS per dtype against the datasheet; estimates then use them."""
        require(ok, "bench_device")
        params = {"device": device, "iterations": iterations, "matmul_size": matmul_size, "buffer_mb": buffer_mb}
        svc = await anyio.to_thread.run_sync(bench, app_state(ctx))  # a first build opens the ledger: off the loop
        return await svc.device(params, time_limit_s, ctx.report_progress, queue)

    @gpubox_tool(mcp, annotations=READ_ONLY, title="Past benchmark runs")
    def bench_list(ctx: Context, limit: Annotated[int, Field(ge=1, le=500)] = 20) -> RunList:
        """Stored benchmark runs, newest first, with a summary and plot URIs."""
        return bench(app_state(ctx)).list(limit)

    @gpubox_tool(mcp, annotations=WRITES, title="Re-plot a benchmark run")
    def bench_plot(
        ctx: Context,
        run_id: Annotated[str, Field(min_length=1, max_length=64, description="From bench_list")],
        against: Annotated[str | None, Field(max_length=64, description="An earlier run of the same kind")] = None,
    ) -> Annotated[CallToolResult, PlotResult]:
        """Re-draw a benchmark run's plots, optionally against an earlier run."""
        result, figs = bench(app_state(ctx)).replot(run_id, against)
        return with_images(result, figs, f"bench_plot {run_id}" + (f" vs {against}" if against else ""))
