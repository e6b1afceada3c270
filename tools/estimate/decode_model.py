"""Batch-1..n decode time per step: a bandwidth term plus a fixed cost per layer (issue #23).

    step_s = max(weight_and_kv_bytes / (bandwidth x efficiency[class]), k-quant compute) + layers x per_layer_s[class]
    tok/s  = batch / step_s

The k-quant compute term (Apple only): weights x kquant_ops / FP32 rate. Metal dequantizes k-quant super-blocks
in the shader ALUs, so a chip with a low FP32 rate for its bandwidth (the M1 Max: 10.4 TFLOPS at 400 GB/s) is
compute-bound on Q4_K_M: llama.cpp's Llama-3-8B table has it 27% slower than the M3 Max at the same bandwidth,
while F16 is within 15%. One constant, fitted on the apple fit rows with the other two.

Why two terms. The bandwidth ceiling alone (bytes / bandwidth) over-predicts small quantised models on
fast GPUs: Llama-2-7B Q4_0 reads 3.8 GB, 2 ms at an A100's 1.9 TB/s, yet llama.cpp measures 7.3 ms per
token there. The remainder does not shrink with the weights: every layer launches a fixed set of kernels
(norm, q/k/v/o, attention, MLP, adds) whose launch and synchronisation time, dequantisation set-up and
the per-token sampling are paid whatever the model's bytes. Published rows show it: on the A100 80GB the
7B Q4_0 / 7B F16 / 13B Q4_0 / 13B F16 times all fit 'bytes / (0.85 x bandwidth) + ~0.16 ms per layer'.

Where the numbers come from. `efficiency` and `per_layer_s` are fitted per GPU class, by least squares
on log(predicted / measured), to the 'fit' rows of bench/estimator_eval/decode.csv only (public llama.cpp
measurements: github.com/XiongjieDai/GPU-Benchmarks-on-LLM-Inference and
github.com/ggml-org/llama.cpp/discussions/4167); the 'check' rows were set aside before fitting and
are reported separately in bench/results/estimator_decode.md. Refit with bench/estimator_eval/fit.py.
With the fixed cost split off, the weight stream runs close to the datasheet bandwidth (0.85-0.97);
the fixed cost is 84-164 us per layer: 2.7-5.2 ms per token for a 32-layer model, which is why a 4 GB
Q4 model cannot reach 'bandwidth / size' on a 2 TB/s GPU.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeCosts:
    efficiency: float  # share of the datasheet bandwidth reached while streaming weights and KV
    per_layer_s: float  # fixed seconds per transformer layer per decode step
    # shader operations per weight to unpack and dot a k-quant block, where the GPU does it in its FP32 ALUs
    # (Apple's Metal kernels; CUDA's integer dot-product kernels keep k-quants bandwidth-bound): the step is
    # then the slower of streaming the weights and computing on them
    kquant_ops: float = 0.0


# Fitted by bench/estimator_eval/fit.py on the fit rows (rms log error 0.05-0.06 per class). No datacenter
# GDDR part (L4, L40S, A10, T4) is in the validation set: they take the workstation-GDDR constants, the same
# memory type and chip families (the L40 and the RTX 6000 Ada are one AD102 die). 'cpu' keeps the earlier
# single-efficiency form (no fixed term): no CPU rows are in the validation set.
DECODE_COSTS: dict[str, DecodeCosts] = {
    "cpu": DecodeCosts(0.60, 0.0),
    "datacenter-hbm": DecodeCosts(0.85, 156e-6),  # 6 fit rows
    "datacenter-gddr": DecodeCosts(0.87, 98e-6),  # = workstation-gddr
    "workstation-gddr": DecodeCosts(0.87, 98e-6),  # 6 fit rows
    "consumer-gddr": DecodeCosts(0.97, 84e-6),  # 11 fit rows
    "apple": DecodeCosts(0.92, 164e-6, 32.0),  # 12 fit rows
}
DEFAULT_COSTS = DecodeCosts(0.60, 0.0)

COSTS_SOURCE = (
    "default for this GPU class: step time = bytes / (bandwidth x {eff:.2f}) + {us:.0f} us per layer, fitted to "
    "published llama.cpp runs (github.com/XiongjieDai/GPU-Benchmarks-on-LLM-Inference, "
    "github.com/ggml-org/llama.cpp/discussions/4167)"
)


def costs_for(gpu_class: str) -> DecodeCosts:
    return DECODE_COSTS.get(gpu_class, DEFAULT_COSTS)


def step_seconds(
    gpu_bytes: float, bandwidth_gbs: float, gpu_layers: int, costs: DecodeCosts, compute_s: float = 0.0
) -> float:
    """Time of one decode step for the part of the model on the GPU (`compute_s`: see compute_seconds)."""
    return max(gpu_bytes / (bandwidth_gbs * 1e9 * costs.efficiency), compute_s) + gpu_layers * costs.per_layer_s


def is_kquant(fmt: str) -> bool:
    """llama.cpp's k-quants (q2_k ... q6_k, their _s/_m/_l mixes): 256-weight super-blocks with sub-block scales."""
    return fmt.lower().startswith("q") and "_k" in fmt.lower()


def compute_seconds(weights_on_gpu: float, fmt: str, fp32_tflops: float | None, costs: DecodeCosts) -> float:
    """Seconds to unpack and dot `weights_on_gpu` k-quant weights once, where the class does it in FP32 ALUs."""
    if not costs.kquant_ops or not fp32_tflops or not is_kquant(fmt):
        return 0.0
    return weights_on_gpu * costs.kquant_ops / (fp32_tflops * 1e12)


def source_text(costs: DecodeCosts) -> str:
    return COSTS_SOURCE.format(eff=costs.efficiency, us=costs.per_layer_s * 1e6)
