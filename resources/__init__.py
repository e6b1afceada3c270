"""gpubox.resources: MCP resources, each backed by the same core code as the matching tool."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer

from gpubox.resources import bench, box, estimate, finetune, gpu, inference, search


def register(mcp: MCPServer[Any]) -> None:
    for module in (gpu, box, estimate, search, inference, finetune, bench):
        module.register(mcp)
