"""Fit the decode model's per-class constants (efficiency, per-layer seconds) on the FIT rows only.

    .venv/bin/python bench/estimator_eval/fit.py

Least squares on log(predicted / measured), by grid search (no optimiser dependency). Prints the
constants to paste into tools/estimate/decode_model.py; check rows are never read here.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_split import load

from gpubox.tools.estimate import inference as inf
from gpubox.tools.estimate.catalog import package_catalog
from gpubox.tools.estimate.decode_model import is_kquant

EFFICIENCIES = [e / 100 for e in range(40, 101)]
PER_LAYER_US = list(range(0, 401, 2))


KQUANT_OPS = [float(c) for c in range(0, 61)]  # fitted for the classes in FP32_DEQUANT only
FP32_DEQUANT = {"apple"}  # Metal unpacks k-quants in FP32 ALUs; CUDA's integer dot kernels do not (decode_model)
Terms = tuple[float, int, float, float]


def row_terms(row: dict[str, str]) -> tuple[str, Terms]:
    """(class, (bytes per step / bandwidth in s, layers, measured s per token, k-quant weights / FP32 rate in s))."""
    cat = package_catalog()
    shape, gpu = cat.model(row["model"]), cat.gpu(row["gpu"])
    wp = inf.weight_plan(shape, row["quant"])
    ctx = int(row["context"])
    kv_read = inf.kv_bytes_per_token(shape, "f16", ctx) * ctx / 2
    stream_s = (wp.total_bytes + kv_read) / (gpu.bandwidth_gbs * 1e9)
    weights = shape.linear_params_per_layer() * shape.layers + shape.vocab * shape.hidden
    unit_s = weights / (gpu.fp32_tflops * 1e12) if is_kquant(row["quant"]) and gpu.fp32_tflops else 0.0
    return gpu.gpu_class, (stream_s, shape.layers, 1 / float(row["tg_tok_s"]), unit_s)


def fit_class(terms: list[Terms], ops: list[float]) -> tuple[float, float, float, float]:
    """(loss, efficiency, us per layer, k-quant ops per weight) with the least squared log error."""
    best = (math.inf, 0.0, 0.0, 0.0)
    for c in ops:
        for eff in EFFICIENCIES:
            for us in PER_LAYER_US:
                loss = sum(math.log((max(s / eff, c * u) + n * us * 1e-6) / t) ** 2 for s, n, t, u in terms)
                best = min(best, (loss, eff, us, c))
    return best


def main() -> None:
    by_class: dict[str, list[Terms]] = {}
    for r in load():
        if r["split"] != "fit":
            continue
        cls, terms = row_terms(r)
        by_class.setdefault(cls, []).append(terms)
    for cls, terms in sorted(by_class.items()):
        loss, eff, us, c = fit_class(terms, KQUANT_OPS if cls in FP32_DEQUANT else [0.0])
        rms = math.sqrt(loss / len(terms))
        extra = f", {c:.1f}" if cls in FP32_DEQUANT else ""
        print(f'    "{cls}": DecodeCosts({eff:.2f}, {us}e-6{extra}),  # {len(terms)} fit rows, rms log error {rms:.3f}')


if __name__ == "__main__":
    main()
