"""GPU monitoring family: `gpu_status`."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer

from gpubox.registry import READ_ONLY, gpubox_tool
from gpubox.tools.gpu.nvml import gpu_status as read_gpu_status
from gpubox.tools.gpu.schemas import GpuStatus


def register(mcp: MCPServer[Any]) -> None:
    @gpubox_tool(mcp, annotations=READ_ONLY, title="GPU status")
    def gpu_status() -> GpuStatus:
        """Live telemetry of every NVIDIA GPU (memory, utilisation, temperature, power, clocks, throttling,
        ECC, processes) plus host CPU/RAM. With no GPU or NVML, returns available=false and the reason."""
        return read_gpu_status()
