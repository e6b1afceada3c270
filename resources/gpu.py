"""gpu://status: the same JSON as the gpu_status tool."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer

from gpubox.tools.gpu.nvml import gpu_status


def register(mcp: MCPServer[Any]) -> None:
    @mcp.resource("gpu://status", name="gpu_status", mime_type="application/json", title="GPU status")
    def gpu_status_resource() -> str:
        """Live GPU and host telemetry (same as the gpu_status tool)."""
        return gpu_status().model_dump_json(indent=2)
