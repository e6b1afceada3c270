"""box://session: the session meter (cost so far, budget, GPU busy share, what used the GPU) and the box ledger
(memory reserved per device, by whom, next to what the device shows)."""

from __future__ import annotations

import json
from typing import Any

from mcp.server.mcpserver import MCPServer

from gpubox import services
from gpubox.errors import ConfigError
from gpubox.registry import gpubox_resource
from gpubox.tools.gpu.adapter import session_meter


def register(mcp: MCPServer[Any]) -> None:
    @gpubox_resource(mcp, "box://session", name="box_session", title="Box session", mime_type="application/json")
    def box_session() -> str:
        """This server session's cost and GPU use: price and its source, cost so far, budget left and when it
        runs out, GPU busy share and idle minutes, minutes per kind of work; under `memory`, the box ledger."""
        state = getattr(mcp, "state", None)
        if state is None:
            raise ConfigError("this server was not built by gpubox.app.build_server; it has no session meter")
        report = session_meter(state).report().model_dump(mode="json")
        report["memory"] = services.ledger(state).state().model_dump(mode="json")
        return json.dumps(report, separators=(",", ":"))
