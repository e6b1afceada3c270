"""GPU monitoring family: `gpu_status` with the session meter; starts the idle guard when configured."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer

from gpubox import services
from gpubox.registry import READ_ONLY, gpubox_tool
from gpubox.state import AppState
from gpubox.tools.gpu.nvml import gpu_status as read_gpu_status
from gpubox.tools.gpu.schemas import GpuStatus
from gpubox.tools.gpu.session import SessionMeter


def session_meter(state: AppState) -> SessionMeter:
    """This server's session meter (built with the server, so uptime counts from start)."""
    return services.session_meter(state)


def _indexing(state: AppState) -> bool:
    svc = services.search_if_built(state)
    return bool(svc is not None and svc.indexing())


def _finetuning(state: AppState) -> bool:
    # a job may outlive a server restart: the ledger restores its holding while its worker runs
    return bool(services.ledger(state).holders("finetune"))


def _inferring(state: AppState) -> bool:
    mgr = services.models_if_built(state)
    return bool(mgr is not None and mgr.busy_models())


def _benchmarking(state: AppState) -> bool:
    svc = services.bench_if_built(state)
    return svc is not None and svc.active is not None


def wire_probes(state: AppState, meter: SessionMeter) -> None:
    """Minutes per kind of work come from each family's own public probes, read by the meter's ticker."""
    meter.add_probe("inference", lambda: _inferring(state))
    meter.add_probe("indexing", lambda: _indexing(state))
    meter.add_probe("finetune", lambda: _finetuning(state))
    meter.add_probe("benchmark", lambda: _benchmarking(state))


def status_with_session(state: AppState | None) -> GpuStatus:
    status = read_gpu_status()
    if state is not None:
        status.session = session_meter(state).report()
        status.memory = services.ledger(state).state()
    return status


class _RequestMeter:
    """MCP middleware: every inbound request marks the box as in use (the idle guard's clock)."""

    async def __call__(self, ctx: Any, call_next: Any) -> Any:
        state = getattr(ctx, "lifespan_context", None)
        if isinstance(state, AppState):
            session_meter(state).touch(getattr(ctx, "session", None))
        return await call_next(ctx)


def register(mcp: MCPServer[Any]) -> None:
    state: AppState | None = getattr(mcp, "state", None)
    if state is not None:
        meter = session_meter(state)
        wire_probes(state, meter)
        if state.settings.idle_shutdown_minutes is not None:
            services.idle_guard(state).start()
    mcp.middleware.append(_RequestMeter())

    @gpubox_tool(mcp, annotations=READ_ONLY, title="GPU status")
    def gpu_status() -> GpuStatus:
        """Live GPU telemetry (memory, utilisation, temperature, power, processes), host CPU/RAM, memory
        gpubox has reserved, and this session's cost."""
        return status_with_session(state)
