"""Estimate family: estimate_inference, estimate_training, estimate_gpus, estimate_calibrations,
estimate_record_measurement. Thin adapters over gpubox.tools.estimate.service."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, TextContent
from pydantic import BaseModel, Field, ValidationError

from gpubox import services
from gpubox.errors import InvalidInputError
from gpubox.registry import COMPUTE, READ_ONLY, STARTS, app_state, gpubox_tool
from gpubox.state import AppState
from gpubox.tools.estimate.requests import QUOTED_MAX, QUOTED_MIN, Method, Optim, TrainingRequest
from gpubox.tools.estimate.schemas import (
    GpuCatalog,
    InferenceEstimate,
    Measurement,
    MeasurementList,
    TrainingEstimate,
)
from gpubox.tools.estimate.service import Estimator

ModelArg = Annotated[
    str,
    Field(
        description="Catalog name (e.g. 'Llama-3-8B') or path to a .gguf file or HF folder",
        min_length=1,
        max_length=4096,
    ),
]
GpuArg = Annotated[
    str,
    Field(
        description="'auto' (local, else all), 'local', 'all', 'cpu' or a catalog name, e.g. 'A10', 'H100-SXM'",
        min_length=1,
        max_length=100,
    ),
]


class TrainingQuery(TrainingRequest):
    """estimate_training's parameters: the request, and how much of the answer to return."""

    detail: bool = Field(default=False, description="Full breakdown for every GPU, not a ranking")


def estimator(state: AppState) -> Estimator:
    return services.estimator(state)


# parameters tools/list folds into `more` (gpubox.arguments): what most questions leave at the default
TRAINING_MORE = (
    "weight_format", "lora_alpha", "lora_dropout", "lora_target_modules", "per_device_train_batch_size",
    "gradient_accumulation_steps", "target_global_batch", "gradient_checkpointing", "optim", "bf16", "fp16",
    "num_train_epochs", "dataset_tokens", "headroom_pct", "tokens_per_s",
)  # fmt: skip
MEASUREMENT_MORE = (
    "prefill_tokens_per_s", "context_length", "max_length", "per_device_train_batch_size", "gradient_checkpointing",
    "lora_r", "lora_target_modules", "optim",
)  # fmt: skip


def register(mcp: MCPServer[Any]) -> None:
    @gpubox_tool(mcp, annotations=COMPUTE, title="Estimate inference", more=("kv_cache_type", "tokens_per_s"))
    def estimate_inference(
        ctx: Context,
        model: ModelArg,
        weight_format: Annotated[
            str | None,
            Field(
                max_length=64,
                description="e.g. bf16, q8_0, q4_k_m, any GGUF type, nf4, int8; default: the file's, else bf16",
            ),
        ] = None,
        context_length: Annotated[
            int | None,
            Field(ge=1, le=2_097_152, description="Default min(model max, 8192)"),
        ] = None,
        batch: Annotated[int, Field(ge=1, le=1024, description="Parallel sequences")] = 1,
        kv_cache_type: Literal["f16", "bf16", "q8_0", "q5_1", "q4_0", "f32"] = "f16",
        gpu: GpuArg = "auto",
        tokens_per_s: Annotated[
            float | None,
            Field(ge=QUOTED_MIN, le=QUOTED_MAX, allow_inf_nan=False, description="A quoted decode speed to check"),
        ] = None,
        detail: Annotated[bool, Field(description="Full breakdown for every GPU, not a ranking")] = False,
    ) -> Annotated[CallToolResult, InferenceEstimate]:
        """Will a model fit, how fast, at what cost: memory, max context, n_gpu_layers, tok/s, $ per million
        tokens. Several GPUs come as a ranking (detail=true: every breakdown)."""
        est = estimator(app_state(ctx)).inference(
            model, weight_format, context_length, batch, kv_cache_type, gpu, tokens_per_s, detail
        )
        return compact_result(est)

    def estimate_training(ctx: Context, **fields: Any) -> CallToolResult:
        """Memory, micro-batch and tokens/s of a fine-tune per GPU; time and cost once a dataset size or
        max_steps is given. Several GPUs come as a ranking (detail=true: every breakdown)."""
        detail = bool(fields.pop("detail", False))
        return compact_result(estimator(app_state(ctx)).training(build_request(TrainingRequest, fields), detail))

    flat_signature(estimate_training, TrainingQuery, Annotated[CallToolResult, TrainingEstimate])
    gpubox_tool(mcp, annotations=COMPUTE, title="Estimate training", more=TRAINING_MORE)(estimate_training)

    @gpubox_tool(mcp, annotations=READ_ONLY, title="GPU catalog")
    def estimate_gpus(
        ctx: Context,
        name_contains: Annotated[str | None, Field(description="e.g. 'H100'", max_length=100)] = None,
        detail: Annotated[bool, Field(description="Every field, sources and dated price")] = False,
    ) -> Annotated[CallToolResult, GpuCatalog]:
        """The GPU catalog: VRAM, bandwidth, BF16 TFLOPS and cheapest $/GPU-hour per GPU (detail=true: sources
        and every provider's dated price)."""
        return compact_result(estimator(app_state(ctx)).gpu_catalog(name_contains, detail))

    @gpubox_tool(mcp, annotations=READ_ONLY, title="Calibrations")
    def estimate_calibrations(
        ctx: Context,
        kind: Annotated[
            Literal["inference", "training", "device"] | None,
            Field(description="'device': device profiles"),
        ] = None,
        gpu: Annotated[str | None, Field(description="Catalog GPU id or 'cpu'", max_length=100)] = None,
        limit: Annotated[int, Field(ge=1, le=200, description="Runs listed, newest first")] = 20,
    ) -> MeasurementList:
        """Measured runs and device profiles that estimates use instead of defaults, newest first."""
        est = estimator(app_state(ctx))
        gpu_id = est.device_spec(gpu).id if gpu else None
        runs = [] if kind == "device" else est.store.list(kind=kind, gpu=gpu_id, limit=limit + 1)
        devices = est.store.devices(gpu=gpu_id) if kind in (None, "device") else []
        return MeasurementList(
            measurements=runs[:limit], more=len(runs) > limit, devices=devices, database=str(est.store.path)
        )

    @gpubox_tool(mcp, annotations=STARTS, title="Record a measurement", more=MEASUREMENT_MORE)
    def estimate_record_measurement(
        ctx: Context,
        kind: Literal["inference", "training"],
        gpu: Annotated[str, Field(description="Catalog id, NVML name or 'cpu'", min_length=1, max_length=100)],
        model: ModelArg,
        tokens_per_s: Annotated[float, Field(gt=0, description="Decode or training tok/s")],
        peak_memory_gb: Annotated[float | None, Field(gt=0)] = None,
        prefill_tokens_per_s: Annotated[float | None, Field(gt=0)] = None,
        weight_format: Annotated[str | None, Field(max_length=64)] = None,
        context_length: Annotated[int, Field(ge=0, le=2_097_152, description="Inference only")] = 0,
        method: Method = "qlora",
        max_length: Annotated[int, Field(ge=8, le=1_048_576)] = 512,
        per_device_train_batch_size: Annotated[int, Field(ge=1, le=4096)] = 1,
        gradient_checkpointing: bool = True,
        lora_r: Annotated[int, Field(ge=1, le=1024)] = 16,
        lora_target_modules: Annotated[
            list[str] | Literal["all-linear"] | None, Field(description="Default all-linear")
        ] = None,
        optim: Optim = "paged_adamw_8bit",
        note: Annotated[str | None, Field(max_length=500, description="Source of the figure")] = None,
    ) -> Measurement:
        """Store a measured run; later estimates on that GPU use it (training: for runs with the same method,
        lora_r, target modules, optim and checkpointing)."""
        est = estimator(app_state(ctx))
        if kind == "inference":
            return est.record_inference(
                gpu, model, weight_format, tokens_per_s, prefill_tokens_per_s, peak_memory_gb, context_length, note=note
            )
        return est.record_training(
            gpu,
            model,
            method,
            max_length,
            per_device_train_batch_size,
            gradient_checkpointing,
            tokens_per_s,
            peak_memory_gb,
            lora_r=lora_r,
            lora_target_modules=lora_target_modules,
            optim=optim,
            weight_format=weight_format,
            note=note,
        )


def compact_result(result: BaseModel) -> CallToolResult:
    """The result as structured content plus its JSON text without indentation (the SDK indents it, which
    spreads a ranking's rows over a line per value)."""
    data = result.model_dump(mode="json")
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)


def build_request(model_cls: type[TrainingRequest], fields: dict[str, Any]) -> TrainingRequest:
    """The request model from the tool's flat arguments; a cross-field error becomes an actionable message."""
    try:
        return model_cls(**fields)
    except ValidationError as exc:
        msgs = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'request'}: {e['msg']}" for e in exc.errors())
        raise InvalidInputError(msgs) from exc


def flat_signature(fn: Callable[..., Any], model_cls: type[BaseModel], returns: Any) -> None:
    """Give `fn(ctx, **fields)` one keyword parameter per field of `model_cls` (same names, types, bounds and
    descriptions), so the MCP tool schema and the request model cannot drift apart."""
    params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Context)]
    annotations: dict[str, Any] = {"ctx": Context}
    for name, f in model_cls.model_fields.items():
        ann = Annotated[(f.annotation, *f.metadata, Field(description=f.description))]  # type: ignore[valid-type]
        default = inspect.Parameter.empty if f.is_required() else f.default
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=ann, default=default))
        annotations[name] = ann
    annotations["return"] = returns
    fn.__signature__ = inspect.Signature(params, return_annotation=returns)  # type: ignore[attr-defined]
    fn.__annotations__ = annotations
