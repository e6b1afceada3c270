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
from gpubox.errors import BusyError, GpuboxError, InvalidInputError
from gpubox.registry import COMPUTE, DESTRUCTIVE, READ_ONLY, STARTS, WRITES, app_state, gpubox_tool
from gpubox.state import AppState
from gpubox.tools.finetune.merge import BYTES, Dtype, GgufOut, MergeResult
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
MERGE_RUNTIME_GB = 0.6  # torch, transformers and peft in the merge process
# finetune_plan's parameters that tools/list folds into `more` (gpubox.arguments): most plans set none of them
PLAN_MORE = (
    "weight_format", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "per_device_train_batch_size",
    "gradient_accumulation_steps", "target_global_batch", "gradient_checkpointing", "optim", "bf16", "fp16",
    "num_processes", "headroom_pct", "lr_scheduler_type", "warmup_ratio", "weight_decay", "seed", "packing",
    "use_liger_kernel", "eval_split", "eval_steps", "logging_steps", "save_steps", "save_total_limit", "probe_steps",
)  # fmt: skip
JobId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-f0-9]+$")]


def finetuner(state: AppState) -> Finetuner:
    return services.finetuner(state)


def as_result(st: JobStatus, extra: list[Any] | None = None) -> CallToolResult:
    """The status as structured content plus its JSON text, as a plain `-> JobStatus` tool returns it."""
    content: list[Any] = [TextContent(type="text", text=st.model_dump_json()), *(extra or [])]
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


def confirm_resume(ctx: Context, job_id: str) -> Any:
    """Training restarts from its checkpoint for the rest of its steps (a job may have been cancelled on purpose)."""
    try:
        row = finetuner(app_state(ctx)).row(job_id)
    except GpuboxError:
        return go_ahead()
    if row["state"] not in ("cancelled", "failed"):
        return go_ahead()  # the tool body says why it does not resume
    return ask(
        ctx,
        f"Resume fine-tuning job {row['id']} ({row['adapter_name']}, {row['state']}) from its latest checkpoint? "
        "It runs in the background until done or cancelled.",
    )


def confirm_merge(ctx: Context, job: str, gguf: str = "none") -> Any:
    state = app_state(ctx)
    try:  # an unknown or unfinished job: the tool body says so, the user is not asked about a merge that cannot run
        row = services.merger(state).resolve_job(finetuner(state), job)
    except GpuboxError:
        return go_ahead()
    extra = f" and write a {gguf} GGUF" if gguf != "none" else ""
    return ask(
        ctx,
        f"Merge adapter '{row['adapter_name']}' (job {row['id']}) into a 16-bit copy of its base model{extra} "
        "(minutes, disk space).",
    )


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
        """Check every dataset row and plan a fine-tune for this device: micro-batch, accumulation, memory, time.
        Returns a plan_id for finetune_launch."""
        state = app_state(ctx)
        return finetuner(state).plan(build_request(request), services.estimator(state))

    finetune_plan.__signature__ = _plan_signature()  # type: ignore[attr-defined]
    gpubox_tool(mcp, annotations=COMPUTE, title="Plan a fine-tune", more=PLAN_MORE)(finetune_plan)

    @gpubox_tool(mcp, annotations=STARTS, title="Launch a fine-tune")
    def finetune_launch(
        ctx: Context,
        plan_id: Annotated[str, Field(min_length=1, max_length=64, description="From finetune_plan")],
        ok: Annotated[Confirmation, Resolve(confirm_launch)],
        queue: Annotated[bool, Field(description="Wait for memory instead of refusing")] = False,
    ) -> JobStatus:
        """Start a planned fine-tune in the background; returns its job_id at once. Poll finetune_status."""
        require(ok, f"fine-tune plan {plan_id}")
        return finetuner(app_state(ctx)).launch(plan_id, queue=queue)

    @gpubox_tool(mcp, annotations=READ_ONLY, title="Fine-tune status")
    async def finetune_status(
        ctx: Context,
        job_id: JobId,
        wait_seconds: Annotated[float, Field(ge=0, le=60, description="Wait this long for progress")] = 0,
        include_log: Annotated[bool, Field(description="Add the log tail")] = False,
        include_plot: Annotated[bool, Field(description="Add the loss curve image")] = False,
    ) -> Annotated[CallToolResult, JobStatus]:
        """A job's state, step, loss, tokens/s, ETA, memory, checkpoints and events (log tail if it failed)."""
        # the first call builds the service (opens the jobs database, reconciles jobs): off the event loop
        ft = await anyio.to_thread.run_sync(finetuner, app_state(ctx))
        st = await anyio.to_thread.run_sync(ft.status, job_id, include_log)
        deadline = time.monotonic() + wait_seconds
        start = (st.state, st.step)
        while st.state in (*ACTIVE, "queued") and (st.state, st.step) == start and time.monotonic() < deadline:
            await anyio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            st = await anyio.to_thread.run_sync(ft.status, job_id, include_log)
            await ctx.report_progress(st.step, st.total_steps, f"{st.state}: step {st.step}/{st.total_steps}")
        return await with_plot(ft, st) if include_plot else as_result(st)

    @gpubox_tool(mcp, annotations=READ_ONLY, title="Fine-tune jobs")
    def finetune_list(ctx: Context, limit: Annotated[int, Field(ge=1, le=1000)] = 20) -> JobList:
        """Fine-tuning jobs on this box, newest first, with their status."""
        return finetuner(app_state(ctx)).list(limit)

    @gpubox_tool(mcp, annotations=DESTRUCTIVE, title="Cancel a fine-tune")
    def finetune_cancel(ctx: Context, job_id: JobId) -> JobStatus:
        """Stop a job cleanly, saving a checkpoint that finetune_resume continues from."""
        return finetuner(app_state(ctx)).cancel(job_id)

    @gpubox_tool(mcp, annotations=STARTS, title="Resume a fine-tune")
    def finetune_resume(ctx: Context, job_id: JobId, ok: Annotated[Confirmation, Resolve(confirm_resume)]) -> JobStatus:
        """Continue a cancelled or failed job from its latest checkpoint."""
        require(ok, f"resuming job {job_id}")
        return finetuner(app_state(ctx)).resume(job_id)

    @gpubox_tool(
        mcp, annotations=WRITES, title="Merge a fine-tuned adapter (and export GGUF)", more=("dtype", "time_limit_s")
    )
    async def finetune_merge(
        ctx: Context,
        job: Annotated[
            str,
            Field(min_length=1, max_length=64, description="job_id or adapter_name"),
        ],
        ok: Annotated[Confirmation, Resolve(confirm_merge)],
        output_name: Annotated[
            str | None,
            Field(pattern=NAME_PATTERN, description="Default '<adapter_name>-merged'"),
        ] = None,
        dtype: Annotated[
            Dtype,
            Field(description="'auto': bf16 for a bf16 base, else fp16"),
        ] = "auto",
        gguf: Annotated[
            GgufOut,
            Field(description="Also write a GGUF (needs a GGUF base)"),
        ] = "none",
        time_limit_s: Annotated[float, Field(ge=10, le=86_400)] = 3600,
    ) -> MergeResult:
        """Merge a finished adapter into a 16-bit copy of its base, saved as a model infer_load serves."""
        require(ok, f"merging '{job}'")
        state = app_state(ctx)
        # building the services the first time opens databases and files: off the event loop
        merger, ft, ledger = await anyio.to_thread.run_sync(
            lambda: (services.merger(state), finetuner(state), services.ledger(state))
        )
        spec = await anyio.to_thread.run_sync(merger.prepare, ft, job, output_name, dtype, gguf)
        # the merge process holds the base and the merged weights at once, plus a torch runtime: reserved first
        owner = f"merge {spec['name']}"
        needs = {"host": 2 * spec["parameters"] * BYTES[spec["dtype"]] / 1e9 + MERGE_RUNTIME_GB}

        def reserve() -> None:
            if ledger.holding(owner) is not None:  # it said "release it first": nothing the caller holds
                raise BusyError(
                    f"a merge to '{spec['name']}' is running; wait for it to end or choose another output_name"
                )
            ledger.reserve(owner, "finetune", needs, "waiting for the merge to end")

        await anyio.to_thread.run_sync(reserve)
        try:
            return await merger.run(spec, time_limit_s, ctx.report_progress)
        finally:
            with anyio.CancelScope(shield=True):  # a file lock and a write: off the event loop, even when cancelled
                await anyio.to_thread.run_sync(ledger.release, owner)
