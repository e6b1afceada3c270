"""estimate://gpus and estimate://calibrations."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context, MCPServer

from gpubox.errors import UnknownNameError
from gpubox.registry import app_state, gpubox_resource
from gpubox.tools.estimate.adapter import estimator
from gpubox.tools.estimate.schemas import MeasurementList

KINDS = ("inference", "training", "all")


def register(mcp: MCPServer[Any]) -> None:
    @gpubox_resource(mcp, "estimate://gpus", name="estimate_gpus", title="GPU catalog")
    def gpus() -> str:
        """GPU specs with sources and dated cloud prices (estimate_gpus with detail=true)."""
        from gpubox.app import state_of

        # static resources get no Context in the SDK, so reach the server's state through the server
        return estimator(state_of(mcp)).gpu_catalog().model_dump_json()

    @gpubox_resource(mcp, "estimate://calibrations/{kind}", name="estimate_calibrations")
    def calibrations(kind: str, ctx: Context) -> str:
        """Measured runs of one kind ('inference', 'training' or 'all') used to calibrate estimates."""
        if kind not in KINDS:
            raise UnknownNameError("calibration kind", kind, KINDS, hint="e.g. estimate://calibrations/inference")
        est = estimator(app_state(ctx))
        runs = est.store.list(kind=None if kind == "all" else kind)
        return MeasurementList(measurements=runs, database=str(est.store.path)).model_dump_json()
