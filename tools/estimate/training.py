"""Training estimate and micro-batch planner (full, LoRA, QLoRA).

Memory = weights + trainable weights + gradients + optimizer states + activations + logits + overhead.
Activations start from a textbook count (16-bit, SDPA/flash attention, no dropout) and are multiplied by a
measured factor: real HF/peft runs hold more than the count (fp32 up-casts from prepare_model_for_kbit_training,
LoRA dropout copies, allocator fragmentation). The factor defaults to a fit on published trl + peft runs
(bench/estimator_eval) and is replaced by our own calibrated runs for the same GPU and method.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from gpubox.errors import InvalidInputError
from gpubox.tools.estimate.calibration import CalibrationStore
from gpubox.tools.estimate.catalog import Catalog, GpuSpec, ModelShape
from gpubox.tools.estimate.schemas import BatchCandidate, TrainingMemory, TrainingOnGpu

GB = 1e9
Method = Literal["full", "lora", "qlora"]

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Optimizer state bytes per trainable parameter, by transformers' TrainingArguments.optim name.
# AdamW keeps two fp32 moments (8 B); bitsandbytes 8-bit AdamW keeps them blockwise-quantised to 8 bit (2 B;
# Dettmers et al., "8-bit Optimizers via Block-wise Quantization", arXiv 2110.02861); the paged variants hold
# the same states in paged memory. Adafactor factors the second moment and keeps no first moment by default:
# "slightly more than 4 bytes" per parameter in the transformers guide (huggingface.co/docs/transformers/
# perf_train_gpu_one). transformers' 'sgd' is torch.optim.SGD with momentum 0 unless optim_args sets it: no
# state (0 B; with momentum it would be one fp32 buffer, 4 B).
OPTIMIZER_BYTES: dict[str, float] = {
    "adamw_torch": 8.0,
    "adamw_torch_fused": 8.0,
    "adamw_8bit": 2.0,
    "adamw_bnb_8bit": 2.0,
    "paged_adamw_8bit": 2.0,
    "paged_adamw_32bit": 8.0,
    "adafactor": 4.0,
    "sgd": 0.0,
}
TORCH_OPTIMIZERS = {"adamw_torch", "adamw_torch_fused", "adafactor", "sgd"}
OPTIMIZER_SOURCE = (
    "optimizer state per trainable parameter: AdamW 8 B (two fp32 moments), bitsandbytes 8-bit AdamW 2 B "
    "(arXiv 2110.02861), Adafactor ~4 B (transformers 'Efficient training on a single GPU' guide), "
    "'sgd' 0 B (torch.optim.SGD without momentum, transformers' default for optim='sgd')"
)
# CUDA context plus cuBLAS and bitsandbytes workspaces. PyTorch's CUDA context alone takes 0.3-0.5 GB
# (PyTorch "CUDA semantics" notes on memory management); 1 GB covers the workspaces as well.
TRAINING_OVERHEAD_GB = 1.0
# A micro-batch of 4096 tokens already makes every projection a 4096-row GEMM, enough to keep a GPU's tensor
# cores busy for 7B-class widths; larger ones add memory (and out-of-memory risk on long samples), not speed.
# The planner stops there and reaches the global batch by gradient accumulation; an explicit
# per_device_train_batch_size is planned as given.
MICRO_BATCH_TOKENS = 4096
MICRO_BATCHES = [1, 2, 4, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128]  # even sizes suit tensor cores

# Measured/textbook activation-memory ratio: real HF/peft runs hold more than the textbook count (fp32 up-casts,
# LoRA dropout copies, bitsandbytes dequantization buffers, allocator fragmentation). With checkpointing: fitted
# (bench/estimator_eval/training_run.py --fit) to the 'fit' rows of published trl/HF Trainer + peft runs
# (fms-acceleration's Mistral-7B LoRA/QLoRA on an A100-80GB, nvidia-smi peaks; Qwen's LoRA memory profile,
# 256-8192 tokens) as the factor with the lowest median error that under-predicts no fit row by more than 5%;
# QLoRA's peaks set it (LoRA and full runs come out 5-30% over). Without checkpointing no published trl + peft
# row is at hand: 1.9 is the earlier default (a reported A10 QLoRA run). Calibrated runs on the same GPU replace
# both.
ACTIVATION_FACTOR = {True: 1.4, False: 1.9}
# The static-memory model an activation factor was derived against: a factor measured under another one (before
# 2026-11-25: fp32 master copy in full fine-tuning, paged optimizer state counted as resident) would mis-predict,
# so calibrations are matched on it.
MEMORY_MODEL = 2
ACTIVATION_FACTOR_SOURCE = (
    "default fitted to published trl/HF Trainer + peft runs (bench/results/estimator_training.md); record a "
    "measured run on this GPU to replace it"
)

# Model FLOPs utilisation by method. Full: HF Trainer + FlashAttention-2 reaches 50-73% of peak in kernels
# and ~45% end to end is typical (Dao, "FlashAttention-2", arXiv 2307.08691); LoRA: smaller effective GEMMs;
# QLoRA: NF4 dequantisation makes steps 1.5-1.6x slower than bf16 LoRA (Lightning AI, "Finetuning LLMs with
# LoRA and QLoRA: insights from hundreds of experiments", LitGPT measurements).
MFU = {"full": 0.40, "lora": 0.35, "qlora": 0.35 / 1.55}
MFU_SOURCE = "default: full 40%, LoRA 35%, QLoRA 35%/1.55 (FlashAttention-2 paper; LitGPT QLoRA slowdown)"


@dataclass
class TrainingPlanInput:
    method: Method
    lora_rank: int
    target_modules: list[str]
    seq_len: int
    gradient_checkpointing: bool
    optimizer: str  # transformers TrainingArguments.optim name (OPTIMIZER_BYTES)
    headroom: float
    weight_format: str  # bf16 / fp32 for full & lora; nf4_dq / nf4 for qlora


TRAIN_FORMATS = {
    "full": {"bf16", "f16", "fp16", "fp32"},
    "lora": {"bf16", "f16", "fp16", "fp32"},
    "qlora": {"nf4", "nf4_dq"},
}


def train_format(method: Method, weight_format: str | None) -> str:
    fmt = (weight_format or ("nf4_dq" if method == "qlora" else "bf16")).strip().lower()
    if fmt not in TRAIN_FORMATS[method]:
        raise InvalidInputError(
            f"weight_format '{fmt}' does not go with method '{method}'; use one of {sorted(TRAIN_FORMATS[method])}"
        )
    return fmt


def lora_targets(modules: list[str] | str | None, method: Method) -> list[str]:
    """peft target_modules -> projection names; 'all-linear' (or none given) is every projection."""
    if method == "full":
        return []
    if isinstance(modules, list) and not modules:
        raise InvalidInputError(
            "lora_target_modules is an empty list; name modules (e.g. ['q_proj', 'v_proj']) or leave it null"
        )
    if modules is None or modules == "all-linear" or modules == ["all-linear"]:
        return list(ALL_LINEAR)
    if isinstance(modules, str):
        modules = [modules]
    return sorted(set(modules), key=lambda m: ALL_LINEAR.index(m) if m in ALL_LINEAR else len(ALL_LINEAR))


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
    # full: the model is loaded in its training dtype (gpubox's worker, like trl/HF scripts that pass
    # torch_dtype=bfloat16) and HF Trainer keeps no fp32 master copy, so weights, gradients and torch
    # optimizers' states are all 16-bit: 8 B/param with AdamW (fms-acceleration's published full bf16 runs of
    # Mistral-7B peak at 72-81 GB on one A100-80GB, below the 18 B/param mixed-precision textbook's 130 GB)
    wbytes = 2 if p.weight_format != "fp32" else 4
    opt = optimizer_bytes(p.optimizer, wbytes) * n
    return {"weights": n * wbytes, "trainable": 0.0, "grads": wbytes * n, "optimizer": opt}


def resident(static: dict[str, float], p: TrainingPlanInput) -> float:
    """Bytes that must stay on the GPU: a paged optimizer's state (bitsandbytes paged_adamw_*) lives in CUDA
    unified memory, which the driver moves to host RAM when the GPU fills (Dettmers et al., "QLoRA", arXiv
    2305.14314, Sec. 2: paged optimizers), so it is shown but not counted in the GPU total."""
    paged = p.optimizer.startswith("paged_")
    return sum(v for k, v in static.items() if not (paged and k == "optimizer"))


def optimizer_bytes(optim: str, param_bytes: int) -> float:
    """State bytes per parameter: torch's optimizers keep their states in the parameter's dtype, bitsandbytes'
    keep theirs in 8 bit (or fp32 for the 32-bit variants) whatever the parameter is."""
    if optim in TORCH_OPTIMIZERS:
        return OPTIMIZER_BYTES[optim] * param_bytes / 4
    return OPTIMIZER_BYTES[optim]


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
    total = resident(st, p) + factor * (acts + logits) + TRAINING_OVERHEAD_GB * GB
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


def _candidates(
    shape: ModelShape, p: TrainingPlanInput, gc: bool, factor: float, vram: float, sizes: list[int], all_: bool
) -> list[BatchCandidate]:
    out: list[BatchCandidate] = []
    for b in sizes:
        total = memory_at(shape, p, b, gc, factor).total_gb
        out.append(BatchCandidate(micro_batch=b, total_gb=total, status=status_of(total, vram, p.headroom)))
        if not all_ and out[-1].status == "oom":
            break  # larger batches only need more
    return out


def _factor(
    store: CalibrationStore | None, gpu: GpuSpec, shape: ModelShape, p: TrainingPlanInput, gc: bool
) -> tuple[float, str | None]:
    """(activation factor, note) for checkpointing on/off: a comparable calibrated run, else the default."""
    if store is not None:
        same = comparable(p, gc) | {"memory_model": MEMORY_MODEL}
        m = store.best("training", gpu.id, "activation_factor", params=shape.params(), method=p.method, config=same)
        if m is not None and m.activation_factor:
            return m.activation_factor, f"activation factor from run #{m.id} ({m.model}, {m.created_at[:10]})"
    return ACTIVATION_FACTOR[gc], None


def comparable(p: TrainingPlanInput, gc: bool) -> dict[str, object]:
    """Config a calibration run must share to be reused: rank, targets, optimizer and checkpointing."""
    full = p.method == "full"
    return {
        "lora_r": None if full else p.lora_rank,
        "lora_target_modules": [] if full else sorted(p.target_modules),
        "optim": p.optimizer,
        "gradient_checkpointing": gc,
    }


@dataclass(frozen=True)
class RunInput:
    """What a run asks for besides its memory plan: batch sizes, length, GPU count and prices. The same on every
    device a request is planned on."""

    micro_batch: int | None  # None: the largest that fits
    target_global_batch: int | None
    accumulation: int | None  # gradient_accumulation_steps; None: from target_global_batch
    checkpointing: bool | None  # None: 'auto' (see plan_on_gpu)
    dataset_tokens: int | None
    epochs: float
    max_steps: int | None
    gpu_count: int
    usd_per_kwh: float
    tokens_per_s_override: float | None = None


def plan_on_gpu(
    shape: ModelShape,
    p: TrainingPlanInput,
    gpu: GpuSpec,
    run: RunInput,
    *,
    catalog: Catalog,
    store: CalibrationStore | None,
    vram_override_gb: float | None = None,
) -> TrainingOnGpu:
    """`run.checkpointing` None means 'auto': off unless, without it, the requested micro-batch (or, when the
    planner chooses, not even micro-batch 1) fits under the headroom."""
    vram = vram_override_gb if vram_override_gb is not None else gpu.vram_gb
    sizes = [run.micro_batch] if run.micro_batch else MICRO_BATCHES
    checkpointing = run.checkpointing
    if checkpointing is None:
        f_off, _ = _factor(store, gpu, shape, p, False)
        first = _candidates(shape, p, False, f_off, vram, sizes[:1], True)[0]
        checkpointing = first.status != "fits"
    p = replace(p, gradient_checkpointing=checkpointing)
    factor, calib = _factor(store, gpu, shape, p, checkpointing)
    mfu, mfu_src = _mfu(store, gpu, shape, p)

    candidates = _candidates(shape, p, checkpointing, factor, vram, sizes, False)
    fitting = [c.micro_batch for c in candidates if c.status == "fits"]
    chosen = _choose(fitting, p.seq_len) if not run.micro_batch else (fitting[0] if fitting else None)
    breakdown = memory_at(shape, p, chosen or (run.micro_batch or 1), checkpointing, factor)
    without_gc: list[BatchCandidate] = []
    if checkpointing:
        without_gc = _candidates(shape, p, False, ACTIVATION_FACTOR[False], vram, sizes, False)
    accum, global_batch = _accumulation(chosen, run)

    fpt = flops_per_token(shape, p)
    peak = gpu.bf16_tflops * 1e12  # FP16 tensor rate on GPUs without BF16 (T4, V100): same column
    tps = run.tokens_per_s_override or mfu * peak * run.gpu_count / fpt
    hours = (
        _wall_hours(run, global_batch, p.seq_len, tps) if chosen else None
    )  # no time or price for a run that cannot start
    gpu_count = run.gpu_count
    costs = catalog.costs(gpu.id, lambda hourly: round(hourly * hours * gpu_count, 2)) if hours is not None else []
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
        mfu_source=mfu_src if not run.tokens_per_s_override else "throughput given by the caller",
        flops_per_token=fpt,
        wall_hours=round(hours, 4) if hours is not None else None,
        costs=costs,
        electricity_usd=round(gpu.tdp_w * hours * gpu_count / 1000 * run.usd_per_kwh, 2) if hours is not None else None,
        calibration=calib,
        gradient_checkpointing=checkpointing,
    )


def _choose(fitting: list[int], seq_len: int) -> int | None:
    """The largest micro-batch that fits, up to MICRO_BATCH_TOKENS tokens (at least 1 sample)."""
    if not fitting:
        return None
    capped = [b for b in fitting if b * seq_len <= MICRO_BATCH_TOKENS]
    return max(capped) if capped else min(fitting)


def _mfu(store: CalibrationStore | None, gpu: GpuSpec, shape: ModelShape, p: TrainingPlanInput) -> tuple[float, str]:
    """(MFU, source): a comparable calibrated run's, else the method's default."""
    if store is not None:
        same = comparable(p, p.gradient_checkpointing)
        r = store.best("training", gpu.id, "mfu", params=shape.params(), method=p.method, config=same)
        if r is not None and r.mfu:
            return r.mfu, f"measured: run #{r.id} ({r.model}, {r.created_at[:10]})"
    return MFU[p.method], MFU_SOURCE


def _accumulation(micro_batch: int | None, run: RunInput) -> tuple[int | None, int | None]:
    """(gradient accumulation steps, global batch) at `micro_batch` per GPU; both None when nothing fits."""
    if not micro_batch:
        return None, None
    per_step = micro_batch * run.gpu_count
    from_target = max(1, math.ceil(run.target_global_batch / per_step)) if run.target_global_batch else 1
    accum = run.accumulation or from_target
    return accum, per_step * accum


def _wall_hours(run: RunInput, global_batch: int | None, seq_len: int, tokens_per_s: float) -> float | None:
    """Hours the run takes at `tokens_per_s`, or None when its length is unknown."""
    total_tokens: float | None = None
    if run.max_steps and global_batch:  # max_steps overrides epochs, as in transformers
        total_tokens = run.max_steps * global_batch * seq_len
    elif run.dataset_tokens:
        total_tokens = run.dataset_tokens * run.epochs
    return total_tokens / (tokens_per_s * 3600) if total_tokens is not None else None


def measured_activation_factor(
    shape: ModelShape, plan: TrainingPlanInput, micro_batch: int, peak_gb: float
) -> float | None:
    acts, logits = activation_bytes(shape, plan, micro_batch, plan.gradient_checkpointing)
    factor = (peak_gb * 1e9 - static_bytes(shape, plan) - TRAINING_OVERHEAD_GB * 1e9) / (acts + logits)
    return factor if factor > 0 else None


def static_bytes(shape: ModelShape, plan: TrainingPlanInput) -> float:
    """What a run's tensors hold before any activation: weights, adapter, gradients, optimizer state (no runtime
    overhead: torch.cuda.max_memory_allocated, which a job reports, does not count it)."""
    return resident(static_memory(shape, plan), plan)
