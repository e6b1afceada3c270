"""The words around a training estimate: its assumptions, and whether a quoted throughput is plausible."""

from __future__ import annotations

from typing import Any

from gpubox.tools.estimate.catalog import GpuSpec, ModelShape
from gpubox.tools.estimate.training import (
    ACTIVATION_FACTOR_SOURCE,
    MFU,
    MICRO_BATCH_TOKENS,
    OPTIMIZER_BYTES,
    OPTIMIZER_SOURCE,
    TRAINING_OVERHEAD_GB,
    TrainingPlanInput,
    flops_per_token,
)


def assumptions(req: Any, fmt: str, usd_per_kwh: float) -> list[str]:
    gc = req.gradient_checkpointing
    return [
        f"Weights: {fmt}"
        + (" (linear layers; embeddings and lm_head in 16 bit)" if req.method == "qlora" else "")
        + (
            "; full fine-tuning keeps weights, gradients and torch optimizers' states in that dtype (no fp32 "
            "master copy: the model is loaded in it)"
            if req.method == "full"
            else "; trainable weights and gradients fp32 (peft casts adapters to fp32)"
        )
        + f"; optimizer {req.optim} = {OPTIMIZER_BYTES[req.optim]:g} bytes per trainable fp32 parameter "
        f"({OPTIMIZER_SOURCE})"
        + (
            "; a paged optimizer's state lives in CUDA unified memory the driver moves to host RAM when the GPU "
            "fills (QLoRA, arXiv 2305.14314): shown, not counted in the GPU total."
            if str(req.optim).startswith("paged_")
            else "."
        ),
        f"Micro-batch: the largest that fits, up to {MICRO_BATCH_TOKENS} tokens (micro-batch x max_length: "
        "larger ones add memory, not speed); the global batch comes from gradient accumulation.",
        "Activations: textbook 16-bit count per token per layer (12h + 4 kv_dim + 8 ffn, SDPA attention; "
        "Korthikanti et al., arXiv 2205.05198); with checkpointing only each layer's input (2h) plus one "
        "recomputed layer; logits 10 bytes x vocab per token. Multiplied by the activation factor ("
        + ACTIVATION_FACTOR_SOURCE
        + ", or a comparable calibrated run).",
        "gradient_checkpointing='auto': off unless, without it, the requested micro-batch (or, when the planner "
        "chooses, even micro-batch 1) does not fit under the headroom; each result says what it used."
        if gc == "auto"
        else f"gradient_checkpointing={gc} as requested.",
        f"Overhead {TRAINING_OVERHEAD_GB} GB (CUDA context, workspaces). Safe limit = memory x "
        f"(1 - {req.headroom_pct:g}% headroom); between it and the memory size a batch is 'too_close'.",
        "Throughput = MFU x dense BF16 peak / FLOPs per token (LoRA 4N, full 6N, +2N with checkpointing, "
        "+ attention 6 L s h). Time = tokens x epochs / (tokens/s x 3600); with max_steps, tokens = "
        "max_steps x global batch x max_length.",
        f"Costs use on-demand prices (date shown per row); electricity = TDP x hours x $/kWh ({usd_per_kwh}).",
    ]


def plausibility(tps_given: float, shape: ModelShape, p: TrainingPlanInput, gpu: GpuSpec, gpu_count: int) -> str | None:
    """Explain when a quoted throughput is physically implausible for this GPU."""
    fpt = flops_per_token(shape, p)
    implied_mfu = tps_given * fpt / (gpu.bf16_tflops * 1e12 * gpu_count)
    expected = MFU[p.method] * gpu.bf16_tflops * 1e12 * gpu_count / fpt
    if implied_mfu > 1:
        return (
            f"{tps_given:g} tokens/s on {gpu.id} is impossible: it needs {implied_mfu:.0%} of the GPU's dense "
            f"BF16 peak ({gpu.bf16_tflops} TFLOPS) at {fpt / 1e9:.1f} GFLOP per token."
        )
    if implied_mfu < MFU[p.method] / 10:
        return (
            f"{tps_given:g} tokens/s on {gpu.id} is implausibly low: it implies {implied_mfu:.2%} of the dense "
            f"BF16 peak ({gpu.bf16_tflops} TFLOPS) at {fpt / 1e9:.1f} GFLOP per token; a {p.method} run usually "
            f"reaches ~{MFU[p.method]:.0%}, i.e. about {expected:,.0f} tokens/s. The quoted figure may be "
            "samples/s, or generation speed rather than training throughput."
        )
    return None
