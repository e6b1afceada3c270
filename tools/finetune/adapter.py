"""Fine-tuning family: finetune_plan, finetune_launch, finetune_status, finetune_list, finetune_cancel,
finetune_resume, finetune_merge. Thin adapters over gpubox.tools.finetune.service and .merge.

finetune_plan's flat parameters are generated from FinetuneRequest's fields (same names, types, bounds and
descriptions), so the tool schema and the request model cannot drift apart.
"""

from __future__ import annotations

import inspect
import time
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.resolve import Resolve
from mcp.types import CallToolResult, TextContent
from pydantic import Field, ValidationError

from gpubox import services
from gpubox.confirm import Confirmation, ask, go_ahead, require
from gpubox.errors import GpuboxError, InvalidInputError
from gpubox.registry import COMPUTE, DESTRUCTIVE, READ_ONLY, WRITES, app_state, gpubox_tool
from gpubox.state import AppState
from gpubox.tools.finetune.merge import Dtype, GgufOut, MergeResult
from gpubox.tools.finetune.plot import loss_png
from gpubox.tools.finetune.schemas import (
    ACTIVE,
    NAME_PATTERN,
    FinetunePlan,
    FinetuneRequest,
    JobList,
    JobStatus,
)
from gpubox.tools.finetune.service import Finetuner

# Filled in by the plan from the dataset and the device present, not by the caller.
PLAN_ONLY = {"dataset_samples", "dataset_tokens", "gpu", "tokens_per_s"}
JobId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-f0-9]+$", description="Job id")]


def finetuner(state: AppState) -> Finetuner:
    return services.finetuner(state)


def as_result(st: JobStatus, extra: list[Any] | None = None) -> CallToolResult:
    """The status as structured content plus its JSON text, as a plain `-> JobStatus` tool returns it."""
    content: list[Any] = [TextContent(type="text", text=st.model_dump_json(indent=1)), *(extra or [])]
    return CallToolResult(content=content, structured_content=st.model_dump(mode="json"))


async def with_plot(ft: Finetuner, st: JobStatus) -> CallToolResult:
    """The status plus the loss curve as MCP image content (as bench_plot returns its plots)."""
    points = await anyio.to_thread.run_sync(ft.curve, st.job_id)
    if not points:
        note = TextContent(type="text", text=f"no loss logged yet for job {st.job_id}; no plot until the first step")
        return as_result(st, [note])
    png = await anyio.to_thread.run_sync(loss_png, points, f"job {st.job_id} ({st.adapter_name})")
    return as_result(st, [Image(data=png, format="png").to_image_content()])


def confirm_launch(ctx: Context, plan_id: str) -> Any:
    """Ask the user (when the client can) with the plan's time and memory before a job starts."""
    try:
        plan = finetuner(app_state(ctx)).load_plan(plan_id)
    except GpuboxError:  # the tool body reports a bad plan_id; nothing to confirm
        return go_ahead()
    hours = f"about {plan.estimated_hours:.2f} h" if plan.estimated_hours else "an unknown time"
    mem = f"about {plan.estimated_memory_gb:.1f} GB" if plan.estimated_memory_gb else "unknown memory"
    return ask(
        ctx,
        f"Start fine-tuning {plan.base.name} ({plan.request.method}, {plan.total_steps} steps) on {plan.device}: "
        f"{hours}, {mem}. It runs in the background until done or cancelled.",
    )


def confirm_merge(ctx: Context, job: str, gguf: str = "none") -> Any:
    extra = f" and write a {gguf} GGUF" if gguf != "none" else ""
    return ask(ctx, f"Merge the adapter of '{job}' into a 16-bit copy of its base model{extra} (minutes, disk space).")


def build_request(fields: dict[str, Any]) -> FinetuneRequest:
    """The request from the tool's flat arguments. The SDK checks each argument's type and bounds; the request's
    own validators (per_device_train_batch_size's range, lora_target_modules' count) run here, in the tool body,
    where a ValidationError would reach the client as a bare "Error executing tool", so it becomes an input error
    naming the field."""
    try:
        return FinetuneRequest(**fields)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(map(str, e['loc'])) or 'request'}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        ]
        raise InvalidInputError("; ".join(problems[:5]) + "; fix these arguments and plan again") from None


def _plan_signature() -> inspect.Signature:
    params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Context)]
    for name, fi in FinetuneRequest.model_fields.items():
        if name in PLAN_ONLY:
            continue
        annotation = Annotated[fi.annotation, *fi.metadata, Field(description=fi.description)]  # type: ignore[valid-type]
        default = inspect.Parameter.empty if fi.is_required() else fi.get_default(call_default_factory=True)
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation))
    return inspect.Signature(params, return_annotation=FinetunePlan)


def register(mcp: MCPServer[Any]) -> None:
    def finetune_plan(ctx: Context, **request: Any) -> FinetunePlan:
        """Plan a LoRA/QLoRA/full fine-tune before launching it: validates every dataset row (chat 'messages',
        prompt/completion or 'text'; the first bad row is named), summarises the data (rows, token length
        percentiles, rows truncated at max_length), resolves the base model, and picks the micro-batch, gradient
        accumulation and checkpointing for the device present (GPU, or host RAM on CPU) from the estimator's memory
        planner, with estimated tokens/s and time. Returns a plan_id: pass it to finetune_launch."""
        state = app_state(ctx)
        return finetuner(state).plan(build_request(request), services.estimator(state))

    finetune_plan.__signature__ = _plan_signature()  # type: ignore[attr-defined]
    gpubox_tool(mcp, annotations=COMPUTE, title="Plan a fine-tune")(finetune_plan)

    @gpubox_tool(mcp, annotations=WRITES, title="Launch a fine-tune")
    def finetune_launch(
        ctx: Context,
        plan_id: Annotated[str, Field(min_length=1, max_length=64, description="plan_id from finetune_plan")],
        ok: Annotated[Confirmation, Resolve(confirm_launch)],
        queue: Annotated[
            bool, Field(description="When memory or the training slot is taken, wait in line instead of refusing")
        ] = False,
    ) -> JobStatus:
        """Start the planned job in a background worker process (trl SFTTrainer + peft) and return at once with
        its job_id, its memory reserved in the box ledger (box_plan). One job runs at a time; a launch that does
        not fit is refused naming who holds the memory, or with queue=true waits (state 'queued', queue_position)
        and starts when memory frees. On an out-of-memory error the worker halves the micro-batch and doubles
        accumulation (logged in events). Poll with finetune_status(job_id, wait_seconds=60)."""
        require(ok, f"fine-tune plan {plan_id}")
        return finetuner(app_state(ctx)).launch(plan_id, queue=queue)

    @gpubox_tool(mcp, annotations=READ_ONLY, title="Fine-tune status")
    async def finetune_status(
        ctx: Context,
        job_id: JobId,
        wait_seconds: Annotated[
            float, Field(ge=0, le=60, description="Long-poll: wait up to this long for the step or state to change")
        ] = 0,
        include_log: Annotated[bool, Field(description="Include the last lines of the job log")] = False,
        include_plot: Annotated[
            bool, Field(description="Also return the training-loss curve as a PNG image (MCP image content)")
        ] = False,
    ) -> Annotated[CallToolResult, JobStatus]:
        """State, step/total, epoch, latest and smoothed loss, eval loss, learning rate, tokens/s, elapsed and
        ETA, peak memory, checkpoints, adapter path, decisions taken (events) and, for failed jobs, the log tail.
        With wait_seconds it returns as soon as the step or state changes (progress notifications meanwhile).
        With include_plot the loss curve comes back as an image too (also at finetune://jobs/{job_id}/loss.png)."""
        ft = finetuner(app_state(ctx))
        st = await anyio.to_thread.run_sync(ft.status, job_id, include_log)
        deadline = time.monotonic() + wait_seconds
        start = (st.state, st.step)
        while st.state in (*ACTIVE, "queued") and (st.state, st.step) == start and time.monotonic() < deadline:
            await anyio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            st = await anyio.to_thread.run_sync(ft.status, job_id, include_log)
            await ctx.report_progress(st.step, st.total_steps, f"{st.state}: step {st.step}/{st.total_steps}")
        return await with_plot(ft, st) if include_plot else as_result(st)

    @gpubox_tool(mcp, annotations=READ_ONLY, title="Fine-tune jobs")
    def finetune_list(
        ctx: Context, limit: Annotated[int, Field(ge=1, le=1000, description="Most jobs to return")] = 20
    ) -> JobList:
        """Fine-tuning jobs on this box, newest first, with their status."""
        return finetuner(app_state(ctx)).list(limit)

    @gpubox_tool(mcp, annotations=DESTRUCTIVE, title="Cancel a fine-tune")
    def finetune_cancel(ctx: Context, job_id: JobId) -> JobStatus:
        """Stop a running job cleanly: it saves a checkpoint at the end of the current step and exits (waits up
        to a minute). finetune_resume continues it from that checkpoint."""
        return finetuner(app_state(ctx)).cancel(job_id)

    @gpubox_tool(mcp, annotations=WRITES, title="Resume a fine-tune")
    def finetune_resume(ctx: Context, job_id: JobId) -> JobStatus:
        """Restart a cancelled or failed job with the same configuration from its latest checkpoint, in a new
        background worker. Poll with finetune_status."""
        return finetuner(app_state(ctx)).resume(job_id)

    @gpubox_tool(mcp, annotations=WRITES, title="Merge a fine-tuned adapter (and export GGUF)")
    async def finetune_merge(
        ctx: Context,
        job: Annotated[
            str,
            Field(min_length=1, max_length=64, description="A completed job's job_id, or its adapter_name"),
        ],
        ok: Annotated[Confirmation, Resolve(confirm_merge)],
        output_name: Annotated[
            str | None,
            Field(
                pattern=NAME_PATTERN,
                description="Name of the merged model in infer_models; default '<adapter_name>-merged'",
            ),
        ] = None,
        dtype: Annotated[
            Dtype,
            Field(
                description="Dtype the base is loaded and saved in; 'auto': bf16 for a bf16 original, else fp16. "
                "Never 4-bit: QLoRA jobs are merged into a 16-bit reload of the base"
            ),
        ] = "auto",
        gguf: Annotated[
            GgufOut,
            Field(
                description="Also write a GGUF for llama.cpp: f16, q8_0 (8-bit, about half the size) or f32; "
                "possible when the base came from a GGUF (the bundled model does)"
            ),
        ] = "none",
        time_limit_s: Annotated[
            float, Field(ge=10, le=86_400, description="Seconds before the merge process is stopped")
        ] = 3600,
    ) -> MergeResult:
        """Fold a finished LoRA/QLoRA adapter into a 16-bit copy of its base (peft merge_and_unload) and save it
        as an HF folder (safetensors + tokenizer) in the state dir's models folder, where infer_models lists it
        and infer_load serves it without peft. With gguf='f16'|'q8_0'|'f32' it also writes a GGUF that llama.cpp
        serves. Runs in a separate process with progress notifications; checks free disk first. Returns the
        paths and the names to pass to infer_load."""
        require(ok, f"merging '{job}'")
        state = app_state(ctx)
        merger = services.merger(state)
        spec = await anyio.to_thread.run_sync(merger.prepare, finetuner(state), job, output_name, dtype, gguf)
        return await merger.run(spec, time_limit_s, ctx.report_progress)
