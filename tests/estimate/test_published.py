"""Estimates against published measurements.

The decode rows below are also rows of bench/estimator_eval/decode.csv, some of them among the 'fit' rows the
decode model's constants were fitted to (bench/estimator_eval/README.md); the independent check is the
'check' rows, scored in tests/estimate/test_decode_eval.py. The QLoRA figures were used to fit nothing.

Decode speeds: llama.cpp runs published in github.com/XiongjieDai/GPU-Benchmarks-on-LLM-Inference (README;
LLaMA 3 table: llama-bench tg512 on RunPod, May 2024; LLaMA 2 table: average eval speed, Dec 2023).
QLoRA memory: Dettmers et al., "QLoRA: Efficient Finetuning of Quantized LLMs", arXiv 2305.14314 (abstract:
a 65B model needs more than 780 GB to fine-tune in 16 bit, and fits on a single 48 GB GPU with QLoRA).
"""

from __future__ import annotations

import pytest

from gpubox.tools.estimate import inference as inf
from gpubox.tools.estimate import training as tr
from gpubox.tools.estimate.catalog import ModelShape, package_catalog

# (gpu, model, format, published decode tok/s, context of the run)
BANDWIDTH_BOUND = [
    ("RTX-4090", "Llama-3-8B", "f16", 54.84, 512),
    ("RTX-3090", "Llama-3-8B", "f16", 47.40, 512),
    ("RTX-4090", "Llama-3-8B", "q4_k_m", 130.58, 512),
    ("RTX-3090", "Llama-3-8B", "q4_k_m", 115.42, 512),
    ("RTX-4090", "Llama-2-7B", "f16", 60.78, 1024),
    ("RTX-4090", "Llama-2-7B", "q4_0", 149.37, 1024),
    ("RTX-3090", "Llama-2-7B", "f16", 51.85, 1024),
    ("A6000", "Llama-2-7B", "f16", 44.01, 1024),
    ("A6000", "Llama-2-7B", "q4_0", 111.57, 1024),
    ("A100-80GB-PCIe", "Llama-2-7B", "f16", 73.83, 1024),
    ("H100-PCIe", "Llama-2-7B", "f16", 83.32, 1024),
    ("M3-Max", "Llama-2-7B", "f16", 24.76, 1024),
    ("M3-Max", "Llama-2-7B", "q4_0", 63.11, 1024),
]
# Small quantised models on HBM GPUs run far below the bandwidth ceiling (kernel launch and sampling
# overheads dominate a 4 GB read at 2 TB/s): the per-layer fixed cost of decode_model accounts for it.
LATENCY_BOUND = [
    ("A100-80GB-PCIe", "Llama-2-7B", "q4_0", 136.24, 1024),
    ("H100-PCIe", "Llama-2-7B", "q4_0", 133.77, 1024),
]


def _estimate(gpu: str, model: str, fmt: str, ctx: int) -> tuple[float, float]:
    cat = package_catalog()
    shape = cat.model(model)
    r = inf.estimate_on_gpu(
        shape, inf.weight_plan(shape, fmt), cat.gpu(gpu), context=ctx, batch=1, kv_type="f16", catalog=cat
    )
    return r.decode_tokens_per_s_ceiling, r.decode_tokens_per_s


@pytest.mark.parametrize(("gpu", "model", "fmt", "published", "ctx"), BANDWIDTH_BOUND + LATENCY_BOUND)
def test_no_published_run_beats_the_bandwidth_ceiling(
    gpu: str, model: str, fmt: str, published: float, ctx: int
) -> None:
    ceiling, _ = _estimate(gpu, model, fmt, ctx)
    assert published <= ceiling


@pytest.mark.parametrize(("gpu", "model", "fmt", "published", "ctx"), BANDWIDTH_BOUND)
def test_expected_decode_speed_is_within_25_percent_of_published_runs(
    gpu: str, model: str, fmt: str, published: float, ctx: int
) -> None:
    _, expected = _estimate(gpu, model, fmt, ctx)
    assert expected == pytest.approx(published, rel=0.25)


@pytest.mark.parametrize(("gpu", "model", "fmt", "published", "ctx"), LATENCY_BOUND)
def test_small_quantised_models_on_hbm_gpus(gpu: str, model: str, fmt: str, published: float, ctx: int) -> None:
    _, expected = _estimate(gpu, model, fmt, ctx)
    assert expected == pytest.approx(published, rel=0.25)


# LLaMA-65B shape from its published config (hidden 8192, 80 layers, 64 heads, FFN 22016, vocab 32000)
LLAMA_65B = ModelShape(
    id="LLaMA-65B",
    layers=80,
    hidden=8192,
    heads=64,
    kv_heads=64,
    head_dim=128,
    intermediate=22016,
    vocab=32000,
    tied_embeddings=False,
    max_context=2048,
)


def test_full_16_bit_fine_tuning_of_65b_needs_more_than_780_gb() -> None:
    # the paper's "regular 16-bit finetuning" is mixed precision: fp32 master weights, gradients and Adam states
    # (16 B/param here); a model loaded in bf16 with torch's AdamW keeps 8 B/param (what gpubox's worker runs)
    p = tr.TrainingPlanInput("full", 0, [], 512, True, "adamw_torch", 0.0, "fp32")
    assert tr.memory_at(LLAMA_65B, p, 1, True, tr.ACTIVATION_FACTOR[True]).total_gb > 780


def test_qlora_weights_of_65b_leave_room_on_a_48_gb_gpu() -> None:
    p = tr.TrainingPlanInput("qlora", 64, tr.ALL_LINEAR, 512, True, "paged_adamw_32bit", 0.0, "nf4_dq")
    weights = tr.static_memory(LLAMA_65B, p)["weights"] / 1e9
    assert 30 < weights < 40  # NF4 with double quantisation: ~4.13 bits per weight


def test_qlora_65b_fits_on_one_48_gb_gpu() -> None:
    # the paper's claim, with peft's fp32 adapters: the paged optimizer's state may live in host RAM
    p = tr.TrainingPlanInput("qlora", 64, tr.ALL_LINEAR, 512, True, "paged_adamw_32bit", 0.0, "nf4_dq")
    assert tr.memory_at(LLAMA_65B, p, 1, True, tr.ACTIVATION_FACTOR[True]).total_gb <= 48
