"""gpu://status: the same JSON as the gpu_status tool."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer

from gpubox.registry import gpubox_resource
from gpubox.tools.gpu.adapter import status_with_session


def register(mcp: MCPServer[Any]) -> None:
    @gpubox_resource(mcp, "gpu://status", name="gpu_status", title="GPU status")
    def gpu_status_resource() -> str:
        """Live GPU and host telemetry with the session meter (same as the gpu_status tool)."""
        return status_with_session(getattr(mcp, "state", None)).model_dump_json()
