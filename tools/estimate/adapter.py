"""Estimate family: estimate_inference, estimate_training, estimate_gpus, estimate_calibrations,
estimate_record_measurement. Thin adapters over gpubox.tools.estimate.service."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel, Field, ValidationError

from gpubox import services
from gpubox.errors import InvalidInputError
from gpubox.registry import COMPUTE, READ_ONLY, WRITES, app_state, gpubox_tool
from gpubox.state import AppState
from gpubox.tools.estimate.requests import Method, Optim, TrainingRequest
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
        description="Catalog name (e.g. 'Llama-3-8B', 'Mistral-7B-Instruct-v0.3', 'Qwen2.5-Coder-7B') or a path "
        "inside the allowed roots/model dirs to a .gguf file or a Hugging Face folder with config.json",
        min_length=1,
        max_length=4096,
    ),
]
GpuArg = Annotated[
    str,
    Field(
        description="'auto' (local GPUs if any, else all), 'local' (the GPUs CUDA would use, described from NVML and "
        "planned on free memory; without a GPU, the CPU and its RAM), "
        "'all' (ranked comparison of every catalogued GPU), 'cpu' (host RAM) or a catalog name such as 'A10', "
        "'A100 40GB SXM' or 'H100-SXM' (exact names and aliases only; 'A100' alone is ambiguous)",
        min_length=1,
        max_length=100,
    ),
]


def estimator(state: AppState) -> Estimator:
    return services.estimator(state)


def register(mcp: MCPServer[Any]) -> None:
    @gpubox_tool(mcp, annotations=COMPUTE, title="Estimate inference")
    def estimate_inference(
        ctx: Context,
        model: ModelArg,
        weight_format: Annotated[
            str | None,
            Field(
                description="f16, bf16, f32, q8_0, q6_k, q5_k_m, q4_k_m, q4_0, q3_k_m, q2_k, any GGUF type "
                "(iq2_xxs, iq3_s, iq4_xs, tq2_0, ...), nf4, nf4_dq, int8; default: the GGUF file's own format, "
                "else bf16"
            ),
        ] = None,
        context_length: Annotated[
            int | None,
            Field(ge=1, le=2_097_152, description="Tokens of context; default min(model max, 8192)"),
        ] = None,
        batch: Annotated[int, Field(ge=1, le=1024, description="Parallel sequences sharing the GPU")] = 1,
        kv_cache_type: Annotated[
            Literal["f16", "bf16", "q8_0", "q5_1", "q4_0", "f32"], Field(description="KV-cache element type")
        ] = "f16",
        gpu: GpuArg = "auto",
        tokens_per_s: Annotated[
            float | None,
            Field(
                gt=0,
                description="A quoted decode speed (tok/s) to check: flagged when above the GPU's bandwidth "
                "ceiling or when the model does not fit; when plausible it prices the tokens",
            ),
        ] = None,
    ) -> InferenceEstimate:
        """Will this model fit, how fast, how much? VRAM breakdown (weights, KV cache from the real layer/head
        shape, compute buffers, overhead), fit and margin, largest context that fits, n_gpu_layers for a partial
        offload, decode and prefill tokens/s, and $ per million generated tokens per provider (with price dates).
        gpu='all' returns a ranked comparison. Uses measured calibrations for the GPU when they exist."""
        return estimator(app_state(ctx)).inference(
            model, weight_format, context_length, batch, kv_cache_type, gpu, tokens_per_s
        )

    def estimate_training(ctx: Context, **fields: Any) -> TrainingEstimate:
        """Memory, batch plan, time and cost of a fine-tune before anything is loaded: memory breakdown (weights
        by format, trainable params, gradients, optimizer state by `optim`, activations with/without
        checkpointing, logits, overhead), the largest micro-batch under the headroom, gradient accumulation,
        tokens/s from FLOPs and MFU; wall time, cost per provider and local electricity when a dataset size or
        max_steps is given (null otherwise). Arguments are trl/peft/transformers names (lora_r,
        lora_target_modules, max_length, per_device_train_batch_size, gradient_checkpointing, optim, ...)."""
        return estimator(app_state(ctx)).training(build_request(TrainingRequest, fields))

    flat_signature(estimate_training, TrainingRequest, TrainingEstimate)
    gpubox_tool(mcp, annotations=COMPUTE, title="Estimate training")(estimate_training)

    @gpubox_tool(mcp, annotations=READ_ONLY, title="GPU catalog")
    def estimate_gpus(
        ctx: Context,
        name_contains: Annotated[str | None, Field(description="Filter, e.g. 'H100' or 'RTX'", max_length=100)] = None,
    ) -> GpuCatalog:
        """The GPU catalog: VRAM, bandwidth, BF16/FP32 TFLOPS, TDP with sources, and $/GPU-hour per provider
        with the date each price was observed."""
        return estimator(app_state(ctx)).gpu_catalog(name_contains)

    @gpubox_tool(mcp, annotations=READ_ONLY, title="Calibrations")
    def estimate_calibrations(
        ctx: Context,
        kind: Annotated[
            Literal["inference", "training", "device"] | None,
            Field(description="Filter: measured runs of a kind, or 'device' for measured device profiles"),
        ] = None,
        gpu: Annotated[str | None, Field(description="Filter by catalog GPU id (or 'cpu')", max_length=100)] = None,
    ) -> MeasurementList:
        """Measured runs (benchmarks, fine-tuning jobs, recorded measurements) and measured device profiles
        (memory bandwidth, TFLOPS per dtype) that estimates use instead of defaults, newest first."""
        est = estimator(app_state(ctx))
        gpu_id = est.device_spec(gpu).id if gpu else None
        runs = [] if kind == "device" else est.store.list(kind=kind, gpu=gpu_id)
        devices = est.store.devices(gpu=gpu_id) if kind in (None, "device") else []
        return MeasurementList(measurements=runs, devices=devices, database=str(est.store.path))

    @gpubox_tool(mcp, annotations=WRITES, title="Record a measurement")
    def estimate_record_measurement(
        ctx: Context,
        kind: Annotated[Literal["inference", "training"], Field(description="What was measured")],
        gpu: Annotated[
            str, Field(description="Catalog GPU id, a local GPU's NVML name, or 'cpu'", min_length=1, max_length=100)
        ],
        model: ModelArg,
        tokens_per_s: Annotated[float, Field(gt=0, description="Decode tok/s (inference) or training tok/s")],
        peak_memory_gb: Annotated[float | None, Field(gt=0, description="Peak GPU memory of the run, GB")] = None,
        prefill_tokens_per_s: Annotated[float | None, Field(gt=0, description="Inference prefill tok/s")] = None,
        weight_format: Annotated[str | None, Field(description="Weight format of the run")] = None,
        context_length: Annotated[int, Field(ge=0, le=2_097_152, description="Inference: context in use")] = 0,
        method: Annotated[Method, Field(description="Training method")] = "qlora",
        max_length: Annotated[int, Field(ge=8, le=1_048_576, description="Training sequence length")] = 512,
        per_device_train_batch_size: Annotated[int, Field(ge=1, le=4096, description="Training micro-batch")] = 1,
        gradient_checkpointing: Annotated[bool, Field(description="Training used checkpointing")] = True,
        lora_r: Annotated[int, Field(ge=1, le=1024, description="LoRA rank of the run")] = 16,
        lora_target_modules: Annotated[
            list[str] | Literal["all-linear"] | None,
            Field(description="LoRA target modules of the run (default all-linear)"),
        ] = None,
        optim: Annotated[Optim, Field(description="Optimizer of the run (TrainingArguments.optim)")] = (
            "paged_adamw_8bit"
        ),
        note: Annotated[str | None, Field(max_length=500, description="Where the figure came from")] = None,
    ) -> Measurement:
        """Store a measured run so later estimates for the same GPU use its efficiency/MFU and memory factor
        (derived from the model's real shape). Training calibrations apply only to comparable runs: same
        method, lora_r, lora_target_modules, optim and gradient_checkpointing. Returns the stored row."""
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


def build_request(model_cls: type[TrainingRequest], fields: dict[str, Any]) -> TrainingRequest:
    """The request model from the tool's flat arguments; a cross-field error becomes an actionable message."""
    try:
        return model_cls(**fields)
    except ValidationError as exc:
        msgs = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'request'}: {e['msg']}" for e in exc.errors())
        raise InvalidInputError(msgs) from exc


def flat_signature(fn: Callable[..., Any], model_cls: type[BaseModel], returns: type[BaseModel]) -> None:
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
