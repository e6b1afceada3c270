"""Estimate family: estimate_inference, estimate_training, estimate_gpus, estimate_calibrations,
estimate_record_measurement. Thin adapters over gpubox.tools.estimate.service."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from pydantic import Field

from gpubox.registry import COMPUTE, READ_ONLY, WRITES, app_state, gpubox_tool
from gpubox.state import AppState
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
        description="'auto' (local GPUs if any, else all), 'local' (GPUs NVML sees, planned on free memory), "
        "'all' (ranked comparison of every catalogued GPU) or a catalog name such as 'A10' or 'H100-SXM'",
        min_length=1,
        max_length=100,
    ),
]


def estimator(state: AppState) -> Estimator:
    return state.service("estimate", Estimator)


def register(mcp: MCPServer[Any]) -> None:
    @gpubox_tool(mcp, annotations=COMPUTE, title="Estimate inference")
    def estimate_inference(
        ctx: Context,
        model: ModelArg,
        weight_format: Annotated[
            str | None,
            Field(
                description="f16, bf16, f32, q8_0, q6_k, q5_k_m, q4_k_m, q4_0, q4_1, q3_k_m, q2_k, nf4, nf4_dq, "
                "int8; default: the GGUF file's own format, else bf16"
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
    ) -> InferenceEstimate:
        """Will this model fit, how fast, how much? VRAM breakdown (weights, KV cache from the real layer/head
        shape, compute buffers, overhead), fit and margin, largest context that fits, n_gpu_layers for a partial
        offload, decode and prefill tokens/s, and $ per million generated tokens per provider (with price dates).
        gpu='all' returns a ranked comparison. Uses measured calibrations for the GPU when they exist."""
        return estimator(app_state(ctx)).inference(model, weight_format, context_length, batch, kv_cache_type, gpu)

    @gpubox_tool(mcp, annotations=COMPUTE, title="Estimate training")
    def estimate_training(
        ctx: Context,
        model: ModelArg,
        method: Annotated[Literal["full", "lora", "qlora"], Field(description="Fine-tuning method")] = "qlora",
        lora_rank: Annotated[int, Field(ge=1, le=1024, description="LoRA rank r")] = 16,
        lora_target_modules: Annotated[
            list[str] | None,
            Field(
                description="Projections to adapt: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj, or "
                "['all-linear'] (default)",
                max_length=7,
            ),
        ] = None,
        max_length: Annotated[int, Field(ge=8, le=1_048_576, description="Training sequence length")] = 512,
        micro_batch: Annotated[
            int | None,
            Field(ge=1, le=4096, description="Per-device micro-batch; omit for the planner's choice"),
        ] = None,
        gradient_checkpointing: Annotated[bool, Field(description="Recompute activations in backward")] = True,
        optimizer: Annotated[
            Literal["adamw", "adamw_8bit", "paged_adamw_8bit", "sgd"], Field(description="Optimizer")
        ] = "paged_adamw_8bit",
        weight_format: Annotated[
            str | None,
            Field(description="qlora: nf4_dq (default) or nf4; lora/full: bf16 (default), fp16, fp32"),
        ] = None,
        dataset_samples: Annotated[
            int | None, Field(ge=1, description="Training samples (x max_length tokens)")
        ] = None,
        dataset_tokens: Annotated[int | None, Field(ge=1, description="Training tokens (overrides samples)")] = None,
        num_train_epochs: Annotated[float, Field(gt=0, le=1000, description="Epochs")] = 1.0,
        target_global_batch: Annotated[
            int | None, Field(ge=1, le=1_000_000, description="Samples per optimizer step; sets accumulation")
        ] = None,
        gpu: GpuArg = "auto",
        gpu_count: Annotated[int, Field(ge=1, le=1024, description="Data-parallel GPUs")] = 1,
        headroom_pct: Annotated[float, Field(ge=0, le=50, description="Safety headroom kept free, %")] = 15.0,
        tokens_per_s: Annotated[
            float | None,
            Field(
                gt=0,
                description="A quoted training throughput to use for time/cost; it is checked for "
                "physical plausibility",
            ),
        ] = None,
    ) -> TrainingEstimate:
        """Memory, batch plan, time and cost of a fine-tune before anything is loaded: memory breakdown (weights
        by format, trainable params, gradients, optimizer, activations with/without checkpointing, logits,
        overhead), the largest micro-batch under the headroom, gradient accumulation for a target batch,
        tokens/s from FLOPs and MFU, wall time, cost per provider and local electricity."""
        return estimator(app_state(ctx)).training(
            model,
            method,
            lora_rank,
            lora_target_modules,
            max_length,
            micro_batch,
            gradient_checkpointing,
            optimizer,
            weight_format,
            dataset_samples,
            dataset_tokens,
            num_train_epochs,
            target_global_batch,
            gpu,
            gpu_count,
            headroom_pct,
            tokens_per_s,
        )

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
        kind: Annotated[Literal["inference", "training"] | None, Field(description="Filter by kind")] = None,
        gpu: Annotated[str | None, Field(description="Filter by catalog GPU id", max_length=100)] = None,
    ) -> MeasurementList:
        """Measured runs (benchmarks, fine-tuning jobs, recorded measurements) that estimates use instead of
        defaults, newest first."""
        est = estimator(app_state(ctx))
        gpu_id = est.catalog.gpu(gpu).id if gpu and gpu.lower() != "cpu" else gpu
        return MeasurementList(measurements=est.store.list(kind=kind, gpu=gpu_id), database=str(est.store.path))

    @gpubox_tool(mcp, annotations=WRITES, title="Record a measurement")
    def estimate_record_measurement(
        ctx: Context,
        kind: Annotated[Literal["inference", "training"], Field(description="What was measured")],
        gpu: Annotated[str, Field(description="Catalog GPU the run used", min_length=1, max_length=100)],
        model: ModelArg,
        tokens_per_s: Annotated[float, Field(gt=0, description="Decode tok/s (inference) or training tok/s")],
        peak_memory_gb: Annotated[float | None, Field(gt=0, description="Peak GPU memory of the run, GB")] = None,
        prefill_tokens_per_s: Annotated[float | None, Field(gt=0, description="Inference prefill tok/s")] = None,
        weight_format: Annotated[str | None, Field(description="Weight format of the run")] = None,
        context_length: Annotated[int, Field(ge=0, description="Inference: context in use")] = 0,
        method: Annotated[Literal["full", "lora", "qlora"], Field(description="Training method")] = "qlora",
        max_length: Annotated[int, Field(ge=8, description="Training sequence length")] = 512,
        micro_batch: Annotated[int, Field(ge=1, description="Training micro-batch")] = 1,
        gradient_checkpointing: Annotated[bool, Field(description="Training used checkpointing")] = True,
        note: Annotated[str | None, Field(max_length=500, description="Where the figure came from")] = None,
    ) -> Measurement:
        """Store a measured run so later estimates for the same GPU use its efficiency/MFU and memory factor
        (derived from the model's real shape). Returns the stored row; list them with estimate_calibrations."""
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
            micro_batch,
            gradient_checkpointing,
            tokens_per_s,
            peak_memory_gb,
            weight_format=weight_format,
            note=note,
        )
