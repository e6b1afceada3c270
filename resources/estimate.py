"""estimate://gpus and estimate://calibrations."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError

from gpubox.registry import app_state
from gpubox.tools.estimate.adapter import estimator
from gpubox.tools.estimate.schemas import MeasurementList


def register(mcp: MCPServer[Any]) -> None:
    @mcp.resource("estimate://gpus", name="estimate_gpus", mime_type="application/json", title="GPU catalog")
    def gpus() -> str:
        """GPU specs with sources and dated cloud prices (same as the estimate_gpus tool)."""
        from gpubox.app import state_of

        # static resources get no Context in the SDK, so reach the process state through the server
        return estimator(state_of(mcp)).gpu_catalog().model_dump_json(indent=2)

    @mcp.resource("estimate://calibrations/{kind}", name="estimate_calibrations", mime_type="application/json")
    def calibrations(kind: str, ctx: Context) -> str:
        """Measured runs of one kind ('inference', 'training' or 'all') used to calibrate estimates."""
        if kind not in ("inference", "training", "all"):
            raise ResourceError(f"unknown kind '{kind}'; use estimate://calibrations/inference, /training or /all")
        est = estimator(app_state(ctx))
        runs = est.store.list(kind=None if kind == "all" else kind)
        return MeasurementList(measurements=runs, database=str(est.store.path)).model_dump_json(indent=2)
