"""search://indexes and search://indexes/{name}."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context, MCPServer

from gpubox.registry import app_state, gpubox_resource
from gpubox.tools.search.adapter import search_service


def register(mcp: MCPServer[Any]) -> None:
    @gpubox_resource(mcp, "search://indexes", name="search_indexes", title="Code indexes")
    def indexes() -> str:
        """Every code-search index with its state (same as search_list)."""
        from gpubox.app import state_of

        # static resources get no Context in the SDK, so reach the server's state through the server
        return search_service(state_of(mcp)).list().model_dump_json()

    @gpubox_resource(mcp, "search://indexes/{name}", name="search_index_info")
    def index_info(name: str, ctx: Context) -> str:
        """One code-search index: root, files, chunks, model, size, last indexed, state."""
        return search_service(app_state(ctx)).info(name).model_dump_json()
