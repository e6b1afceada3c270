"""A bare MCPServer serving the same gpu_status function gpubox serves: the benchmark's baseline."""

from __future__ import annotations

import sys

from mcp.server.mcpserver import MCPServer

from gpubox.tools.gpu.nvml import gpu_status as read_gpu_status
from gpubox.tools.gpu.schemas import GpuStatus

mcp = MCPServer("bare")


@mcp.tool()
def gpu_status() -> GpuStatus:
    """Same core function as gpubox's tool."""
    return read_gpu_status()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        mcp.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
    else:
        mcp.run()
