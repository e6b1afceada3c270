"""gpubox.resources: MCP resources, each backed by the same core code as the matching tool."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer

from gpubox.resources import bench, estimate, gpu, inference, search


def register(mcp: MCPServer[Any]) -> None:
    for module in (gpu, estimate, search, inference, bench):
        module.register(mcp)
