"""bench://runs (stored benchmark runs) and bench://runs/{run_id}/{file}: plots (PNG) and tables (JSON, CSV)."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError

from gpubox.errors import GpuboxError
from gpubox.registry import app_state
from gpubox.tools.bench.adapter import bench


def register(mcp: MCPServer[Any]) -> None:
    @mcp.resource("bench://runs", name="bench_runs", mime_type="application/json", title="Benchmark runs")
    def runs() -> str:
        """Stored bench_attention / bench_device runs, newest first (same as the bench_list tool)."""
        from gpubox.app import state_of

        # static resources get no Context in the SDK, so reach the process state through the server
        return bench(state_of(mcp)).list(limit=200).model_dump_json()

    def read(ctx: Context, run_id: str, name: str) -> bytes:
        try:
            return bench(app_state(ctx)).runs.read(run_id, name)[0]
        except GpuboxError as exc:
            raise ResourceNotFoundError(str(exc)) from exc

    @mcp.resource("bench://runs/{run_id}/{name}.png", name="bench_plot", mime_type="image/png")
    def plot(run_id: str, name: str, ctx: Context) -> bytes:
        """A run's plot: tflops, speedup, device, or a *_vs_earlier plot drawn by bench_plot."""
        return read(ctx, run_id, name + ".png")

    @mcp.resource("bench://runs/{run_id}/{name}.json", name="bench_table_json", mime_type="application/json")
    def table_json(run_id: str, name: str, ctx: Context) -> str:
        """A run's raw table (table.json) or its whole record (run.json)."""
        return read(ctx, run_id, name + ".json").decode()

    @mcp.resource("bench://runs/{run_id}/{name}.csv", name="bench_table_csv", mime_type="text/csv")
    def table_csv(run_id: str, name: str, ctx: Context) -> str:
        """A bench_attention run's table as CSV (table.csv)."""
        return read(ctx, run_id, name + ".csv").decode()
