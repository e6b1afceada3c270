"""Training estimate and micro-batch planner (full, LoRA, QLoRA).

Memory = weights + trainable weights + gradients + optimizer states + activations + logits + overhead.
Activations start from a textbook count (16-bit, SDPA/flash attention, no dropout) and are multiplied by a
measured factor: real HF/peft runs hold more than the count (fp32 up-casts from prepare_model_for_kbit_training,
LoRA dropout copies, allocator fragmentation). The factor defaults to a published observation and is replaced
by our own calibrated runs for the same GPU and method.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from gpubox.errors import InvalidInputError
from gpubox.tools.estimate.calibration import CalibrationStore
from gpubox.tools.estimate.catalog import Catalog, GpuSpec, ModelShape
from gpubox.tools.estimate.schemas import BatchCandidate, TrainingMemory, TrainingOnGpu

GB = 1e9
Method = Literal["full", "lora", "qlora"]
Optimizer = Literal["adamw", "adamw_8bit", "paged_adamw_8bit", "sgd"]

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
OPTIMIZER_BYTES = {
    "adamw": 8.0,
    "adamw_8bit": 2.0,
    "paged_adamw_8bit": 2.0,
    "sgd": 4.0,
}  # per trainable param
TRAINING_OVERHEAD_GB = 1.0  # CUDA context, cuBLAS/bnb workspaces (seed 002: "~1 GB other"; hardware.md §4b)
MICRO_BATCHES = [1, 2, 4, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128]  # even sizes suit tensor cores

# Measured/textbook activation-memory ratio. Default from seed 002 (A10 24 GB, Mistral-7B-Instruct-v0.3
# QLoRA NF4-DQ r=16 q/k/v/o, seq 512, paged_adamw_8bit): ~20 GB at micro-batch 8 with checkpointing,
# ~29 GB at micro-batch 4 without. Replaced by calibrated runs (estimate_record_measurement, finetune jobs).
ACTIVATION_FACTOR = {True: 3.8, False: 1.9}
ACTIVATION_FACTOR_SOURCE = "seed 002 observation (A10, Mistral-7B QLoRA): measured/textbook activation memory"

# Model FLOPs utilisation by method. Full: HF Trainer + FlashAttention-2 reaches 50-73% of peak in kernels
# and ~45% end to end is typical (FA-2 paper); LoRA: smaller effective GEMMs; QLoRA: NF4 dequantisation makes
# steps 1.5-1.6x slower than bf16 LoRA (LitGPT measurements, hardware.md §4b).
MFU = {"full": 0.40, "lora": 0.35, "qlora": 0.35 / 1.55}
MFU_SOURCE = "default: full 40%, LoRA 35%, QLoRA 35%/1.55 (FA-2 paper; LitGPT QLoRA slowdown)"


@dataclass
class TrainingPlanInput:
    method: Method
    lora_rank: int
    target_modules: list[str]
    seq_len: int
    gradient_checkpointing: bool
    optimizer: Optimizer
    headroom: float
    weight_format: str  # bf16 / fp32 for full & lora; nf4_dq / nf4 for qlora


def lora_params(shape: ModelShape, rank: int, targets: list[str]) -> int:
    shapes = shape.linear_shapes()
    unknown = [t for t in targets if t not in shapes]
    if unknown:
        raise InvalidInputError(
            f"unknown LoRA target module(s) {unknown}; valid: {', '.join(shapes)} (or 'all-linear')"
        )
    return shape.layers * sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets)


def trainable_params(shape: ModelShape, p: TrainingPlanInput) -> int:
    return shape.params() if p.method == "full" else lora_params(shape, p.lora_rank, p.target_modules)


def static_memory(shape: ModelShape, p: TrainingPlanInput) -> dict[str, float]:
    n = shape.params()
    emb = shape.embedding_params()
    trainable = trainable_params(shape, p)
    opt = OPTIMIZER_BYTES[p.optimizer] * trainable
    if p.method == "qlora":
        bits = 4.127 if p.weight_format == "nf4_dq" else 4.5
        weights = (n - emb) * bits / 8 + emb * 2  # embeddings and lm_head stay 16-bit
        return {"weights": weights, "trainable": 4 * trainable, "grads": 4 * trainable, "optimizer": opt}
    if p.method == "lora":
        wbytes = 4 if p.weight_format == "fp32" else 2
        return {"weights": n * wbytes, "trainable": 4 * trainable, "grads": 4 * trainable, "optimizer": opt}
    # full, mixed precision: 16-bit weights + fp32 master copy, fp32 gradients (hardware.md: 18 B/param w/ AdamW)
    master = 4 * n if p.weight_format != "fp32" else 0
    wbytes = 2 if p.weight_format != "fp32" else 4
    return {"weights": n * wbytes, "trainable": master, "grads": 4 * n, "optimizer": opt}


def activation_bytes(shape: ModelShape, p: TrainingPlanInput, micro_batch: int, gc: bool) -> tuple[float, float]:
    """(activations, logits) textbook bytes for one micro-batch."""
    tokens = p.seq_len * micro_batch
    h, f = shape.hidden, shape.intermediate
    kvd = shape.kv_heads * shape.head_dim
    # per token per layer, 16-bit: norms' inputs 2h+2h, q/k/v/o inputs and outputs 2h+2h+2h+4kvd, MLP 2h+8f
    per_layer = 12 * h + 4 * kvd + 8 * f
    # with checkpointing: each layer's input is kept; backward recomputes one layer (activations + their grads)
    acts = tokens * (2 * h * shape.layers + 2 * per_layer) if gc else tokens * per_layer * shape.layers
    logits = tokens * shape.vocab * 10  # bf16 logits + fp32 up-cast for the loss + fp32 gradient
    return acts, logits


def memory_at(shape: ModelShape, p: TrainingPlanInput, micro_batch: int, gc: bool, factor: float) -> TrainingMemory:
    st = static_memory(shape, p)
    acts, logits = activation_bytes(shape, p, micro_batch, gc)
    total = sum(st.values()) + factor * (acts + logits) + TRAINING_OVERHEAD_GB * GB
    return TrainingMemory(
        weights_gb=round(st["weights"] / GB, 3),
        trainable_weights_gb=round(st["trainable"] / GB, 3),
        gradients_gb=round(st["grads"] / GB, 3),
        optimizer_gb=round(st["optimizer"] / GB, 3),
        activations_gb=round(factor * acts / GB, 3),
        logits_gb=round(factor * logits / GB, 3),
        overhead_gb=TRAINING_OVERHEAD_GB,
        total_gb=round(total / GB, 3),
        activations_physical_gb=round((acts + logits) / GB, 3),
        activation_factor=factor,
    )


def status_of(total_gb: float, vram_gb: float, headroom: float) -> Literal["fits", "too_close", "oom"]:
    if total_gb <= vram_gb * (1 - headroom):
        return "fits"
    return "too_close" if total_gb <= vram_gb else "oom"


def flops_per_token(shape: ModelShape, p: TrainingPlanInput) -> float:
    n = shape.params()
    base = 6 * n if p.method == "full" else 4 * n  # LoRA skips the frozen weights' gradient GEMM
    if p.gradient_checkpointing:
        base += 2 * n  # the forward runs twice
    attn = 6 * shape.layers * p.seq_len * shape.hidden * (4 / 3 if p.gradient_checkpointing else 1)
    return base + attn


def plan_on_gpu(
    shape: ModelShape,
    p: TrainingPlanInput,
    gpu: GpuSpec,
    *,
    catalog: Catalog,
    store: CalibrationStore | None,
    micro_batch: int | None,
    target_global_batch: int | None,
    dataset_tokens: int,
    epochs: float,
    gpu_count: int,
    usd_per_kwh: float,
    tokens_per_s_override: float | None,
    vram_override_gb: float | None = None,
) -> TrainingOnGpu:
    vram = vram_override_gb if vram_override_gb is not None else gpu.vram_gb
    factor = ACTIVATION_FACTOR[p.gradient_checkpointing]
    mfu, mfu_src, calib = MFU[p.method], MFU_SOURCE, None
    if store is not None:
        m = store.best(
            "training",
            gpu.id,
            "activation_factor",
            params=shape.params(),
            method=p.method,
            gradient_checkpointing=p.gradient_checkpointing,
        )
        if m is not None and m.activation_factor:
            factor = m.activation_factor
            calib = f"activation factor from run #{m.id} ({m.model}, {m.created_at[:10]})"
        r = store.best("training", gpu.id, "mfu", params=shape.params(), method=p.method)
        if r is not None and r.mfu:
            mfu, mfu_src = r.mfu, f"measured: run #{r.id} ({r.model}, {r.created_at[:10]})"

    sizes = [micro_batch] if micro_batch else MICRO_BATCHES
    candidates = []
    for b in sizes:
        mem = memory_at(shape, p, b, p.gradient_checkpointing, factor)
        candidates.append(
            BatchCandidate(micro_batch=b, total_gb=mem.total_gb, status=status_of(mem.total_gb, vram, p.headroom))
        )
        if not micro_batch and candidates[-1].status == "oom":
            break  # larger batches only need more
    fitting = [c.micro_batch for c in candidates if c.status == "fits"]
    chosen = max(fitting) if fitting else None
    if micro_batch and not fitting:
        chosen = None
    at = chosen or (micro_batch or 1)
    breakdown = memory_at(shape, p, at, p.gradient_checkpointing, factor)

    without_gc: list[BatchCandidate] = []
    if p.gradient_checkpointing:
        for b in sizes:
            total = memory_at(shape, p, b, False, ACTIVATION_FACTOR[False]).total_gb
            without_gc.append(BatchCandidate(micro_batch=b, total_gb=total, status=status_of(total, vram, p.headroom)))
            if without_gc[-1].status == "oom":
                break

    accum = global_batch = None
    if chosen:
        per_step = chosen * gpu_count
        accum = max(1, math.ceil(target_global_batch / per_step)) if target_global_batch else 1
        global_batch = per_step * accum

    fpt = flops_per_token(shape, p)
    peak = gpu.bf16_tflops * 1e12  # FP16 tensor rate on GPUs without BF16 (T4, V100): same column
    tps = tokens_per_s_override or mfu * peak * gpu_count / fpt
    hours = dataset_tokens * epochs / (tps * 3600)  # seed 003's formula
    costs = catalog.costs(gpu.id, lambda hourly: round(hourly * hours * gpu_count, 2))
    return TrainingOnGpu(
        gpu=gpu.id,
        gpu_name=gpu.name,
        gpu_count=gpu_count,
        vram_gb=vram,
        safe_limit_gb=round(vram * (1 - p.headroom), 3),
        micro_batch=chosen,
        memory=breakdown,
        candidates=candidates,
        without_checkpointing=without_gc,
        gradient_accumulation=accum,
        global_batch=global_batch,
        tokens_per_s=round(tps, 2),
        mfu=round(mfu, 4),
        mfu_source=mfu_src if not tokens_per_s_override else "throughput given by the caller",
        flops_per_token=fpt,
        wall_hours=round(hours, 4),
        costs=costs,
        electricity_usd=round(gpu.tdp_w * hours * gpu_count / 1000 * usd_per_kwh, 2),
        calibration=calib,
    )


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
