"""models://available: the inference registry."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer

from gpubox.tools.inference.adapter import manager


def register(mcp: MCPServer[Any]) -> None:
    @mcp.resource("models://available", name="models_available", mime_type="application/json", title="Models")
    def available() -> str:
        """Runnable models and what is loaded (same as infer_models)."""
        from gpubox.app import state_of

        return manager(state_of(mcp)).list().model_dump_json(indent=2)
