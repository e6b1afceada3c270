"""models://available: the inference registry."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer

from gpubox.registry import gpubox_resource
from gpubox.tools.inference.adapter import manager


def register(mcp: MCPServer[Any]) -> None:
    @gpubox_resource(mcp, "models://available", name="models_available", title="Models")
    def available() -> str:
        """Runnable models and what is loaded (same as infer_models)."""
        from gpubox.app import state_of

        # static resources get no Context in the SDK, so reach the server's state through the server
        return manager(state_of(mcp)).list().model_dump_json()
