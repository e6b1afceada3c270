"""box://session: the session meter alone (cost so far, budget, GPU busy share, what used the GPU)."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer

from gpubox.errors import ConfigError
from gpubox.registry import gpubox_resource
from gpubox.tools.gpu.adapter import session_meter


def register(mcp: MCPServer[Any]) -> None:
    @gpubox_resource(mcp, "box://session", name="box_session", title="Box session", mime_type="application/json")
    def box_session() -> str:
        """This server session's cost and GPU use: price and its source, cost so far, budget left and when it
        runs out, GPU busy share and idle minutes, minutes per kind of work."""
        state = getattr(mcp, "state", None)
        if state is None:
            raise ConfigError("this server was not built by gpubox.app.build_server; it has no session meter")
        return session_meter(state).report().model_dump_json(indent=2)
