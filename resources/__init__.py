"""gpubox.resources: MCP resources, each backed by the same core code as the matching tool."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer

from gpubox.resources import bench, box, estimate, finetune, gpu, inference, search

# resource module -> the families whose tools it goes with (served when any of them is exposed)
FOLLOWS = {gpu: {"gpu"}, box: {"gpu", "box"}, estimate: {"estimate"}, search: {"search"}, inference: {"infer"},
           finetune: {"finetune"}, bench: {"bench"}}  # fmt: skip


def register(mcp: MCPServer[Any], families: set[str] | None = None) -> None:
    for module, follows in FOLLOWS.items():
        if families is None or follows & families:
            module.register(mcp)
