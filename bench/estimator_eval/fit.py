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

EFFICIENCIES = [e / 100 for e in range(40, 101)]
PER_LAYER_US = list(range(0, 401, 2))


def row_terms(row: dict[str, str]) -> tuple[str, float, int, float]:
    """(class, bytes per step / bandwidth in seconds, layers, measured seconds per token)."""
    cat = package_catalog()
    shape, gpu = cat.model(row["model"]), cat.gpu(row["gpu"])
    wp = inf.weight_plan(shape, row["quant"])
    ctx = int(row["context"])
    kv_read = inf.kv_bytes_per_token(shape, "f16", ctx) * ctx / 2
    stream_s = (wp.total_bytes + kv_read) / (gpu.bandwidth_gbs * 1e9)
    return gpu.gpu_class, stream_s, shape.layers, 1 / float(row["tg_tok_s"])


def fit_class(terms: list[tuple[float, int, float]]) -> tuple[float, float, float]:
    best = (math.inf, 0.0, 0.0)
    for eff in EFFICIENCIES:
        for us in PER_LAYER_US:
            loss = sum(math.log((s / eff + n * us * 1e-6) / t) ** 2 for s, n, t in terms)
            best = min(best, (loss, eff, us))
    return best


def main() -> None:
    by_class: dict[str, list[tuple[float, int, float]]] = {}
    for r in load():
        if r["split"] != "fit":
            continue
        cls, s, n, t = row_terms(r)
        by_class.setdefault(cls, []).append((s, n, t))
    for cls, terms in sorted(by_class.items()):
        loss, eff, us = fit_class(terms)
        rms = math.sqrt(loss / len(terms))
        print(f'    "{cls}": DecodeCosts({eff:.2f}, {us}e-6),  # {len(terms)} fit rows, rms log error {rms:.3f}')


if __name__ == "__main__":
    main()
