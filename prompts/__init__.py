"""gpubox.prompts: MCP prompts that steer a client's model through gpubox tools."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer

from gpubox.prompts import bench, finetune, gpu, search


def register(mcp: MCPServer[Any]) -> None:
    for module in (gpu, search, finetune, bench):
        module.register(mcp)
