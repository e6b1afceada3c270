"""Inference estimate: VRAM breakdown, fit, largest context, n_gpu_layers, decode/prefill speed, cost.

Decode at small batch is memory-bandwidth bound: tok/s <= BW / bytes read per step (weights once, plus the
KV cache of every sequence). Prefill is compute bound: tok/s ~ MFU x peak / (2 N).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpubox.tools.estimate import decode_model
from gpubox.tools.estimate.calibration import CalibrationStore
from gpubox.tools.estimate.catalog import Catalog, GpuSpec, ModelShape
from gpubox.tools.estimate.formats import SIXTEEN_BIT_EMBEDDINGS, bits_per_weight, kv_bytes
from gpubox.tools.estimate.schemas import (
    FullContextLine,
    InferenceMemory,
    InferenceOnGpu,
)

GB = 1e9
RUNTIME_OVERHEAD_GB = 0.45  # CUDA context + cuBLAS workspace: 0.3-0.5 GB (PyTorch 'CUDA semantics' notes)
N_UBATCH = 512  # llama.cpp default physical batch
PREFILL_MFU = 0.25  # a class without published prefill rows (the CPU); a calibration replaces it
# llama.cpp prefill as a share of the catalog's dense BF16 peak, per GPU class, and the factor for quantised
# weights: fitted to published runs (bench/estimator_eval/prefill.py; a GeForce's FP16-accumulate rate is twice
# the catalog's figure, hence ~1)
PREFILL_MFU_BY_CLASS = {
    "apple": 0.687,
    "consumer-gddr": 1.036,
    "datacenter-gddr": 0.289,
    "datacenter-hbm": 0.373,
    "datacenter-hbm-fast": 0.219,
    "workstation-gddr": 0.475,
}
PREFILL_QUANTISED = 0.844


FAST_HBM_TFLOPS = 500.0  # H100 class and later (not the H20): llama.cpp reaches a smaller share of that peak


def prefill_group(gpu: GpuSpec) -> str:
    """The GPU class, with HBM parts of 500+ TFLOPS apart: the fit rows show the H100 at 0.22 of its peak,
    the A100s at 0.30-0.36 (bench/estimator_eval/prefill.py)."""
    fast = gpu.gpu_class == "datacenter-hbm" and gpu.bf16_tflops >= FAST_HBM_TFLOPS
    return "datacenter-hbm-fast" if fast else gpu.gpu_class


def prefill_mfu(gpu: GpuSpec, fmt: str) -> float:
    quantised = fmt not in ("f16", "bf16", "f32")
    return PREFILL_MFU_BY_CLASS.get(prefill_group(gpu), PREFILL_MFU) * (PREFILL_QUANTISED if quantised else 1.0)


@dataclass
class WeightPlan:
    total_bytes: float
    per_layer_bytes: float
    non_layer_bytes: float  # embeddings + output head + norms
    fmt: str = ""  # the weight format (decode speed depends on it beyond its bytes: decode_model.compute_seconds)


def weight_plan(shape: ModelShape, fmt: str, exact_bytes: int | None = None) -> WeightPlan:
    bpw = bits_per_weight(fmt) / 8
    emb = shape.embedding_params()
    emb_bpw = 2.0 if fmt in SIXTEEN_BIT_EMBEDDINGS else bpw
    layer_params = shape.linear_params_per_layer() + 2 * shape.hidden
    total = shape.layers * layer_params * bpw + emb * emb_bpw
    if exact_bytes:  # a GGUF file's tensors: scale our split to the exact total
        scale = exact_bytes / total
        return WeightPlan(exact_bytes, layer_params * bpw * scale, emb * emb_bpw * scale, fmt)
    return WeightPlan(total, layer_params * bpw, emb * emb_bpw, fmt)


def kv_bytes_per_token(shape: ModelShape, kv_type: str, context: int) -> float:
    """K and V for every layer; sliding-window layers hold only their window."""
    per_layer = 2 * shape.kv_heads * shape.head_dim * kv_bytes(kv_type)
    return per_layer * shape.kv_layers_at(context)


def compute_buffer_bytes(
    shape: ModelShape, context: int, batch: int, flash_attn: bool = False, ubatch: int = N_UBATCH
) -> float:
    """llama.cpp's compute buffer: the larger of two peaks of one ubatch's graph, never their sum: the fp32
    logits plus one hidden-state row per token, or (without flash attention) the fp32 attention scores and mask
    against the whole context plus four hidden-state rows. Fitted on published load logs ('compute buffer size'
    lines; bench/results/estimator_llamacpp_memory.md: 11 logs, 8 models, check rows within 3.1%)."""
    ub = min(ubatch, max(context * batch, 1))
    hidden = ub * shape.hidden * 4
    logits = ub * shape.vocab * 4 + hidden
    ctx = min(context, 1 << 20)
    scores = 0 if flash_attn else ub * ctx * (shape.heads + 1) * 4 + 4 * hidden
    return max(logits, scores)


def memory(shape: ModelShape, wp: WeightPlan, kv_type: str, context: int, batch: int) -> InferenceMemory:
    kv = kv_bytes_per_token(shape, kv_type, context) * context * batch
    comp = compute_buffer_bytes(shape, context, batch, flash_attn=kv_type != "f16")  # as the loader sets it
    total = wp.total_bytes + kv + comp + RUNTIME_OVERHEAD_GB * GB
    return InferenceMemory(
        weights_gb=round(wp.total_bytes / GB, 3),
        kv_cache_gb=round(kv / GB, 3),
        compute_buffers_gb=round(comp / GB, 3),
        runtime_overhead_gb=RUNTIME_OVERHEAD_GB,
        total_gb=round(total / GB, 3),
    )


def max_context(shape: ModelShape, wp: WeightPlan, kv_type: str, batch: int, avail_bytes: float) -> int:
    """Largest context (<= model max) whose full-offload memory fits `avail_bytes` (bisection: KV of
    sliding-window layers and the compute buffer are not linear in the context)."""

    def need(ctx: int) -> float:
        return memory(shape, wp, kv_type, ctx, batch).total_gb * GB

    if need(1) > avail_bytes:
        return 0
    lo, hi = 1, shape.max_context
    if need(hi) <= avail_bytes:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if need(mid) <= avail_bytes else (lo, mid)
    return lo


def gpu_layers(shape: ModelShape, wp: WeightPlan, kv_type: str, context: int, batch: int, avail: float) -> int:
    """llama.cpp n_gpu_layers for a partial offload: each offloaded layer brings its weights and its KV."""
    fixed = compute_buffer_bytes(shape, context, batch, flash_attn=kv_type != "f16") + RUNTIME_OVERHEAD_GB * GB
    kv_layer = 2 * shape.kv_heads * shape.head_dim * kv_bytes(kv_type) * context * batch
    per_layer = wp.per_layer_bytes + kv_layer
    if avail <= fixed:
        return 0
    return max(0, min(shape.layers, math.floor((avail - fixed) / per_layer)))


def decode_speed(
    shape: ModelShape,
    wp: WeightPlan,
    gpu: GpuSpec,
    context: int,
    batch: int,
    kv_type: str,
    n_layers: int,
    host_bandwidth_gbs: float,
    measured_eff: float | None,
) -> tuple[float, float]:
    """(bandwidth ceiling, expected) decode tok/s. A measured efficiency scales the ceiling (it already holds
    every per-token cost of that GPU); otherwise the class's bandwidth + per-layer model (decode_model)."""
    # bytes read per decode step: all weights once, plus each sequence's KV at half the context on average
    kv_read = kv_bytes_per_token(shape, kv_type, context) * (context / 2) * batch
    frac_gpu = n_layers / shape.layers
    gpu_bytes = wp.non_layer_bytes + wp.per_layer_bytes * n_layers + kv_read * frac_gpu
    cpu_s = (wp.per_layer_bytes * (shape.layers - n_layers) + kv_read * (1 - frac_gpu)) / (host_bandwidth_gbs * GB)
    ceiling = batch / (gpu_bytes / (gpu.bandwidth_gbs * GB) + cpu_s)
    if measured_eff is not None:
        return ceiling, ceiling * measured_eff
    costs = decode_model.costs_for(gpu.gpu_class)
    weights_on_gpu = shape.linear_params_per_layer() * n_layers + (shape.vocab * shape.hidden if n_layers else 0)
    compute_s = decode_model.compute_seconds(weights_on_gpu, wp.fmt, gpu.fp32_tflops, costs)
    step_s = decode_model.step_seconds(gpu_bytes, gpu.bandwidth_gbs, n_layers, costs, compute_s)
    return ceiling, batch / (step_s + cpu_s)


def estimate_on_gpu(
    shape: ModelShape,
    wp: WeightPlan,
    gpu: GpuSpec,
    *,
    context: int,
    batch: int,
    kv_type: str,
    catalog: Catalog,
    available_gb: float | None = None,
    store: CalibrationStore | None = None,
    host_bandwidth_gbs: float = 50.0,
) -> InferenceOnGpu:
    avail = (available_gb if available_gb is not None else gpu.vram_gb) * GB
    mem = memory(shape, wp, kv_type, context, batch)
    need = mem.total_gb * GB
    fits = need <= avail
    full = memory(shape, wp, kv_type, shape.max_context, batch)
    host = gpu.gpu_class == "cpu"  # host RAM is the device: nothing to offload to
    n_layers = shape.layers if fits else 0 if host else gpu_layers(shape, wp, kv_type, context, batch, avail)
    offload = "full" if fits else ("partial" if n_layers > 0 else "none")

    measured_eff: float | None = None
    eff_src = decode_model.source_text(decode_model.costs_for(gpu.gpu_class))
    mfu = prefill_mfu(gpu, wp.fmt)
    if store is not None:
        m = store.best("inference", gpu.id, "decode_efficiency", params=shape.params(), spec=gpu)
        if m is not None and m.decode_efficiency:
            measured_eff = m.decode_efficiency
            eff_src = f"measured: run #{m.id} ({m.model}, {m.created_at[:10]})"
        p = store.best("inference", gpu.id, "prefill_tokens_per_s", params=shape.params(), spec=gpu)
        if p is not None and p.prefill_tokens_per_s and p.params:
            mfu = min(2.0, p.prefill_tokens_per_s * 2 * p.params / (gpu.bf16_tflops * 1e12))  # GeForce: ~0.9

    ceiling, decode = decode_speed(shape, wp, gpu, context, batch, kv_type, n_layers, host_bandwidth_gbs, measured_eff)
    eff = decode / ceiling
    frac_gpu = n_layers / shape.layers
    prefill = mfu * gpu.bf16_tflops * 1e12 / (2 * shape.params())
    if n_layers < shape.layers:  # CPU layers run the prompt at host speed too
        prefill *= max(frac_gpu, 0.05)

    costs = catalog.costs(gpu.id, lambda hourly: round(hourly / (decode * 3600) * 1e6, 4))
    return InferenceOnGpu(
        gpu=gpu.id,
        gpu_name=gpu.name,
        vram_gb=gpu.vram_gb,
        available_gb=round(avail / GB, 3),
        memory=mem,
        fits=fits,
        margin_gb=round((avail - need) / GB, 3),
        full_context=FullContextLine(
            context=shape.max_context,
            kv_cache_gb=full.kv_cache_gb,
            total_gb=full.total_gb,
            fits=full.total_gb * GB <= avail,
        ),
        max_context_that_fits=max_context(shape, wp, kv_type, batch, avail),
        n_gpu_layers=n_layers,
        total_layers=shape.layers,
        offload=offload,
        decode_tokens_per_s_ceiling=round(ceiling, 2),
        decode_tokens_per_s=round(decode, 2),
        decode_efficiency=round(eff, 4),
        efficiency_source=eff_src,
        prefill_tokens_per_s=float(f"{prefill:.3g}"),  # 3 significant digits: a CPU's 70B prefill is 0.04
        prefill_mfu=round(mfu, 3),
        costs_per_million_tokens=costs,
        cheapest_usd_per_million_tokens=min((c.usd for c in costs), default=None),
    )


def check_quoted(r: InferenceOnGpu, quoted: float, model: str, fmt: str, catalog: Catalog) -> str | None:
    """Judge a quoted decode speed against this GPU (sets r.quoted_*); a warning when it is impossible."""
    r.quoted_tokens_per_s = quoted
    what = f"{quoted:g} tok/s for {model} {fmt} on {r.gpu}"
    if not r.fits:
        r.quoted_verdict = "does_not_fit"
        where = (
            f"with {r.n_gpu_layers}/{r.total_layers} layers on the GPU the rest runs from host memory at about "
            f"{r.decode_tokens_per_s:g} tok/s"
            if r.n_gpu_layers
            else "not even one layer fits"
        )
        # at or below the offloaded speed a quote is what a partial offload gives, not impossible
        verdict = (
            "only possible with part of the model in host memory"
            if (r.n_gpu_layers and quoted <= r.decode_tokens_per_s_ceiling)
            else "impossible"
        )
        return (
            f"{what} is {verdict}: the model does not fit ({r.memory.total_gb:g} GB needed, "
            f"{r.available_gb:g} GB available); {where}."
        )
    if quoted > r.decode_tokens_per_s_ceiling:
        r.quoted_verdict = "above_bandwidth_ceiling"
        return (
            f"{what} is impossible: decode reads every weight (and the KV cache) once per token, so the memory "
            f"bandwidth caps it at {r.decode_tokens_per_s_ceiling:g} tok/s ({r.memory.weights_gb:g} GB of "
            f"weights); expect about {r.decode_tokens_per_s:g}. The quote may be for a quantised model, a batch "
            "of requests in aggregate, or speculative decoding."
        )
    r.quoted_verdict = "plausible"
    r.costs_per_million_tokens = catalog.costs(r.gpu, lambda hourly: round(hourly / (quoted * 3600) * 1e6, 4))
    r.cheapest_usd_per_million_tokens = min((c.usd for c in r.costs_per_million_tokens), default=None)
    return None


ASSUMPTIONS = [
    "Weights: bits per weight of the format (k-quants as llama.cpp reports whole-file sizes; IQ/TQ and other "
    "GGUF types from the gguf package's block sizes); NF4/int8 keep embeddings and the output head in 16 bit; a "
    "GGUF file's exact tensor bytes are used when given a path.",
    "KV cache = 2 x layers x kv_heads x head_dim x bytes(kv type) x context x batch; sliding-window layers "
    "(e.g. Gemma-3) hold only their window.",
    f"Compute buffers: llama.cpp's graph buffer for a {N_UBATCH}-token ubatch, the larger of fp32 logits and "
    "(without flash attention, which gpubox turns on only for a quantised KV cache) fp32 attention scores against "
    "the whole context, fitted to published load logs; runtime overhead "
    f"{RUNTIME_OVERHEAD_GB} GB (CUDA context, cuBLAS).",
    "Decode ceiling = bandwidth / (weights + KV read at half the context per sequence); expected step time = "
    "bytes / (bandwidth x class efficiency) + layers x a fixed per-layer cost (kernel launches, dequantisation, "
    "sampling), both fitted per GPU class to published llama.cpp runs (github.com/XiongjieDai/"
    "GPU-Benchmarks-on-LLM-Inference, github.com/ggml-org/llama.cpp/discussions/4167); a measured calibration "
    "for this GPU replaces it (expected = ceiling x measured efficiency). Partially offloaded layers read at "
    "50 GB/s.",
    "Prefill = MFU x dense BF16 peak / (2 x params), MFU per GPU class fitted to published llama.cpp prompt-eval "
    "runs (github.com/XiongjieDai/GPU-Benchmarks-on-LLM-Inference; x 0.84 for quantised weights; a GeForce card "
    f"comes out near 1, its FP16-accumulate rate being twice the dense BF16 figure), {PREFILL_MFU} on a CPU, "
    "unless calibrated.",
    "Cost per million generated tokens = $/hour / (expected decode tok/s x 3600) x 1e6, at full utilisation.",
]


VERDICTS = {"does_not_fit": "the model does not fit", "above_bandwidth_ceiling": "above the bandwidth ceiling"}


def quoted_summary(results: list[InferenceOnGpu], quoted: float | None, model: str, fmt: str) -> list[str]:
    """The per-GPU verdicts on a quoted speed as one line for a ranking (43 GPUs gave 43 long warnings)."""
    by: dict[str, list[str]] = {}
    for r in results:
        if r.quoted_verdict in VERDICTS:
            by.setdefault(r.quoted_verdict, []).append(r.gpu)
    if not by:
        return []
    parts = [
        f"{VERDICTS[v]} on {len(ids)} GPU(s) ({', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''})"
        for v, ids in by.items()
    ]
    return [f"{quoted:g} tok/s for {model} {fmt}: {'; '.join(parts)}; detail=true says why on each"]
