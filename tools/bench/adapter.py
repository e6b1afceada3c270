"""Bench family: bench_attention, bench_device, bench_list, bench_plot. Thin adapters over BenchService."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.resolve import Resolve
from mcp.types import CallToolResult, TextContent
from pydantic import BaseModel, Field

from gpubox import services
from gpubox.confirm import Confirmation, ask, require
from gpubox.errors import InvalidInputError
from gpubox.registry import READ_ONLY, WRITES, app_state, gpubox_tool
from gpubox.state import AppState
from gpubox.tools.bench.plots import Plot
from gpubox.tools.bench.schemas import AttentionBench, Backend, DeviceBench, PlotResult, RunList
from gpubox.tools.bench.service import BenchService

SeqLen = Annotated[int, Field(ge=1, le=262_144)]
HeadDim = Annotated[int, Field(ge=1, le=4096)]
DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
DeviceArg = Annotated[
    Literal["auto", "cuda", "cpu"], Field(description="'auto': the GPU when torch sees one, else the CPU")
]
Queue = Annotated[
    bool, Field(description="When memory or the device is taken, wait in line (progress reports the position)")
]
TimeLimit = Annotated[
    float, Field(ge=1, le=3600, description="Seconds before the worker process is killed; results so far are kept")
]


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
    content: list[Any] = [TextContent(type="text", text=headline + "\n" + result.model_dump_json(indent=1))]
    content += [Image(data=p.png, format="png").to_image_content() for p in figs]
    return CallToolResult(content=content, structured_content=result.model_dump(mode="json"))


def register(mcp: MCPServer[Any]) -> None:
    @gpubox_tool(mcp, annotations=WRITES, title="Benchmark attention kernels")
    async def bench_attention(
        ctx: Context,
        ok: Annotated[Confirmation, Resolve(confirm_attention)],
        batch: Annotated[int, Field(ge=1, le=256, description="Batch size B")] = 1,
        heads: Annotated[int | None, Field(ge=1, le=1024, description="Heads H; default 48 (GPU) / 4 (CPU)")] = None,
        seq_len: Annotated[
            SeqLen | list[SeqLen] | None,
            Field(description="Sequence length N, one or a list (≤ 16); default 8192 (GPU) / 256 (CPU)"),
        ] = None,
        head_dim: Annotated[
            HeadDim | list[HeadDim] | None,
            Field(
                description="Head dimension D, one or a list (≤ 64); default on a GPU 64, 128 and 320…1024 in "
                "steps of 64 (the FFPA sweep); on the CPU 32 and 64"
            ),
        ] = None,
        dtype: Annotated[
            Literal["auto", "fp16", "bf16", "fp32"], Field(description="'auto': fp16 on a GPU, fp32 on the CPU")
        ] = "auto",
        causal: Annotated[bool, Field(description="Causal mask (halves the FLOP count)")] = False,
        backward: Annotated[bool, Field(description="Time forward + backward (×2.5 FLOPs)")] = False,
        backends: Annotated[
            list[Backend] | None,
            Field(
                description="Backends to time; default all: SDPA math/efficient/flash/cuDNN (forced through "
                "torch.nn.attention.sdpa_kernel), FFPA (ffpa-attn), flash-attn",
                max_length=6,
            ),
        ] = None,
        baseline: Annotated[
            Literal["auto"] | Backend,
            Field(
                description="Speedups are against this backend; 'auto': sdpa_efficient on a GPU, sdpa_math on "
                "the CPU (PyTorch has no CPU efficient-attention kernel)"
            ),
        ] = "auto",
        warmup: Annotated[int, Field(ge=0, le=100, description="Untimed calls per backend and shape")] = 3,
        iterations: Annotated[int, Field(ge=1, le=1000, description="Timed calls (median and spread)")] = 10,
        tolerance: Annotated[
            float | None, Field(gt=0, le=1, description="Max abs error vs the fp32 math reference; default by dtype")
        ] = None,
        device: DeviceArg = "auto",
        time_limit_s: TimeLimit = 600,
        queue: Queue = False,
    ) -> Annotated[CallToolResult, AttentionBench]:
        """Which attention kernel is fastest on this box for these shapes? Times each backend per (D, N) in a
        worker process (CUDA events, L2 flushed, median of `iterations`), checks every output against an fp32
        math reference, and returns per shape: time, TFLOPS, speedup vs the baseline, max error, peak memory, the
        winner; backends that cannot run a shape are listed as skipped with the library's reason. Returns the
        TFLOPS-vs-D and speedup plots as images (also at bench://runs/{run_id}/...). Compare runs with
        bench_list / bench_plot."""
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
        result, figs = await bench(app_state(ctx)).attention(params, baseline, time_limit_s, ctx.report_progress, queue)
        won = ", ".join(f"D={w.head_dim} N={w.seq_len}: {w.backend}" for w in result.winners if w.backend)
        return with_images(result, figs, f"bench_attention {result.run_id} ({result.status}); winners: {won or 'none'}")

    @gpubox_tool(mcp, annotations=WRITES, title="Benchmark the device")
    async def bench_device(
        ctx: Context,
        ok: Annotated[Confirmation, Resolve(confirm_device)],
        device: DeviceArg = "auto",
        iterations: Annotated[
            int | None, Field(ge=1, le=100, description="Timed repeats; default 10 GPU / 5 CPU")
        ] = None,
        matmul_size: Annotated[
            int | None, Field(ge=128, le=32768, description="Square matmul size; default 8192 GPU / 1024 CPU")
        ] = None,
        buffer_mb: Annotated[
            int | None, Field(ge=16, le=16384, description="Bandwidth buffer size, MiB; default 1024 GPU / 256 CPU")
        ] = None,
        time_limit_s: TimeLimit = 300,
        queue: Queue = False,
    ) -> DeviceBench:
        """What does this box really deliver? Device memory bandwidth (copy, triad), matmul TFLOPS per dtype
        (fp32, tf32, bf16, fp16, fp8 where supported) and pinned host<->device bandwidth; on the CPU, RAM bandwidth
        and BLAS GFLOPS (fp32/fp64). Each figure vs the estimator catalog's datasheet value (ratio). The result is
        stored as a calibration, so later estimate_* calls on this device use the measured figures."""
        require(ok, "bench_device")
        params = {"device": device, "iterations": iterations, "matmul_size": matmul_size, "buffer_mb": buffer_mb}
        return await bench(app_state(ctx)).device(params, time_limit_s, ctx.report_progress, queue)

    @gpubox_tool(mcp, annotations=READ_ONLY, title="Past benchmark runs")
    def bench_list(
        ctx: Context, limit: Annotated[int, Field(ge=1, le=500, description="Newest runs to list")] = 20
    ) -> RunList:
        """Stored bench_attention / bench_device runs, newest first, with device, library/driver versions, date,
        a one-line summary and the bench:// URIs of their tables and plots. Re-plot one with bench_plot."""
        return bench(app_state(ctx)).list(limit)

    @gpubox_tool(mcp, annotations=WRITES, title="Re-plot a benchmark run")
    def bench_plot(
        ctx: Context,
        run_id: Annotated[str, Field(min_length=1, max_length=64, description="A run id from bench_list")],
        against: Annotated[
            str | None,
            Field(
                max_length=64,
                description="An earlier run of the same kind to draw on the same axes (e.g. before a driver upgrade)",
            ),
        ] = None,
    ) -> Annotated[CallToolResult, PlotResult]:
        """Re-draw a stored run's plots, optionally against an earlier run; returns the PNGs as images and keeps
        them at bench://runs/{run_id}/...png."""
        result, figs = bench(app_state(ctx)).replot(run_id, against)
        return with_images(result, figs, f"bench_plot {run_id}" + (f" vs {against}" if against else ""))
