"""finetune://jobs, finetune://jobs/{job_id}, finetune://jobs/{job_id}/log and the loss curve PNG."""

from __future__ import annotations

import io
from typing import Any

from mcp.server.mcpserver import Context, MCPServer

from gpubox.errors import MissingExtraError, NotFoundError
from gpubox.registry import app_state, gpubox_resource
from gpubox.tools.finetune.adapter import finetuner
from gpubox.tools.finetune.jobs import log_tail


def loss_png(points: list[tuple[int, float]], title: str) -> bytes:
    """The loss curve as a PNG (matplotlib's Agg backend: no display needed)."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingExtraError("The loss-curve image", "train", "matplotlib") from exc
    fig = Figure(figsize=(6, 3.5), dpi=100)
    ax = fig.add_subplot()
    if points:
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def register(mcp: MCPServer[Any]) -> None:
    @gpubox_resource(mcp, "finetune://jobs", name="finetune_jobs", title="Fine-tuning jobs")
    def jobs() -> str:
        """Every fine-tuning job with its status (same as finetune_list)."""
        from gpubox.app import state_of

        # static resources get no Context in the SDK, so reach the server's state through the server
        return finetuner(state_of(mcp)).list().model_dump_json(indent=2)

    @gpubox_resource(mcp, "finetune://jobs/{job_id}", name="finetune_job")
    def job(job_id: str, ctx: Context) -> str:
        """One job's status as JSON (same as finetune_status)."""
        return finetuner(app_state(ctx)).status(job_id).model_dump_json(indent=2)

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
