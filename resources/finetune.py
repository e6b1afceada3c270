"""finetune://jobs, finetune://jobs/{job_id}, finetune://jobs/{job_id}/log and the loss curve PNG."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context, MCPServer

from gpubox.errors import NotFoundError
from gpubox.registry import app_state, gpubox_resource
from gpubox.tools.finetune.adapter import finetuner
from gpubox.tools.finetune.jobs import log_tail
from gpubox.tools.finetune.plot import loss_png


def register(mcp: MCPServer[Any]) -> None:
    @gpubox_resource(mcp, "finetune://jobs", name="finetune_jobs", title="Fine-tuning jobs")
    def jobs() -> str:
        """Every fine-tuning job with its status (same as finetune_list)."""
        from gpubox.app import state_of

        # static resources get no Context in the SDK, so reach the server's state through the server
        return finetuner(state_of(mcp)).list().model_dump_json()

    @gpubox_resource(mcp, "finetune://jobs/{job_id}", name="finetune_job")
    def job(job_id: str, ctx: Context) -> str:
        """One job's status as JSON (same as finetune_status)."""
        return finetuner(app_state(ctx)).status(job_id).model_dump_json()

    @gpubox_resource(mcp, "finetune://jobs/{job_id}/log", name="finetune_job_log", mime_type="text/plain")
    def job_log(job_id: str, ctx: Context) -> str:
        """The last lines of a job's log."""
        ft = finetuner(app_state(ctx))
        ft.row(job_id)
        return log_tail(ft.store.job_dir(job_id), lines=200)

    @gpubox_resource(mcp, "finetune://jobs/{job_id}/loss.png", name="finetune_loss_curve", mime_type="image/png")
    def loss_curve(job_id: str, ctx: Context) -> bytes:
        """The training-loss curve of a job as a PNG image."""
        points = finetuner(app_state(ctx)).curve(job_id)
        if not points:
            raise NotFoundError(f"job {job_id} has logged no loss yet; try again after its first step")
        return loss_png(points, f"job {job_id}")
