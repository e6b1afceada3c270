"""Prefill (prompt processing) speed: the split rule, the fit and the score against published llama.cpp runs.

Rows: prefill.csv (XiongjieDai/GPU-Benchmarks-on-LLM-Inference, 1024-token prompt eval of Llama-3 8B/70B, one GPU).
Split (fixed before fitting, as decode.csv's): within each GPU class, rows ordered by
sha256("gpu|model|quant|context|pp_tok_s"), every third one is a check row. Model form:
prefill tok/s = MFU(group) x (QUANTISED if the weights are quantised) x dense BF16 TFLOPS / (2 x params);
`QUANTISED` is the median ratio of quantised to F16 MFU over GPU+model pairs whose two rows are both fit rows,
MFU(group) the median F16-equivalent MFU of the group's fit rows. A group is the GPU class, with HBM parts of
500+ TFLOPS (the H100 class on, not the H20) apart: the first fit (one datacenter-hbm class) left the H100
PCIe's fit rows at +64%, the A100s' near 0. The catalog's dense BF16 figure is the one with FP32 accumulation,
so a GeForce card, which llama.cpp drives with FP16 accumulation at twice that rate, comes out near or above 1.
Run: `python bench/estimator_eval/prefill.py` (prints the constants and writes bench/results/estimator_prefill.md,
before = the single constant MFU it replaces).
"""

from __future__ import annotations

import csv
import hashlib
import statistics
import sys
from pathlib import Path

from gpubox.tools.estimate.catalog import package_catalog
from gpubox.tools.estimate.inference import PREFILL_MFU, prefill_group, prefill_mfu

HERE = Path(__file__).resolve().parent
CSV = HERE / "prefill.csv"
OUT = HERE.parent / "results" / "estimator_prefill.md"
OLD_MFU = 0.25  # the single constant used for every GPU before this fit
# F16 below the same card's Q4_K_M in the source (its multi-GPU rows of these cards too): kept in every figure, and
# also shown without
OUTLIERS = {("L40S", "Llama-3-8B", "f16"), ("A100-80GB-SXM", "Llama-3-8B", "f16")}


def load() -> list[dict[str, str]]:
    with CSV.open(newline="") as f:
        return list(csv.DictReader(f))


def split_of(rows: list[dict[str, str]]) -> dict[str, str]:
    """row key -> 'fit' or 'check', by the rule above."""

    def key(r: dict[str, str]) -> str:
        return hashlib.sha256(
            "|".join(r[k] for k in ("gpu", "model", "quant", "context", "pp_tok_s")).encode()
        ).hexdigest()

    cat, by_class, out = package_catalog(), {}, {}
    for r in rows:
        by_class.setdefault(cat.gpu(r["gpu"]).gpu_class, []).append(r)
    for members in by_class.values():
        for i, r in enumerate(sorted(members, key=key)):
            out[key(r)] = "check" if i % 3 == 0 else "fit"
    return {f"{r['gpu']}|{r['model']}|{r['quant']}": out[key(r)] for r in rows}


def implied_mfu(r: dict[str, str]) -> float:
    cat = package_catalog()
    return float(r["pp_tok_s"]) * 2 * cat.models[r["model"]].params() / (cat.gpu(r["gpu"]).bf16_tflops * 1e12)


def fit(rows: list[dict[str, str]]) -> tuple[dict[str, float], float]:
    """(MFU per GPU class, quantised factor) from the fit rows only."""
    cat = package_catalog()
    train = [r for r in rows if r["split"] == "fit"]
    f16 = {(r["gpu"], r["model"]): implied_mfu(r) for r in train if r["quant"] == "f16"}
    ratios = [
        implied_mfu(r) / f16[(r["gpu"], r["model"])]
        for r in train
        if r["quant"] != "f16" and (r["gpu"], r["model"]) in f16
    ]
    quantised = statistics.median(ratios)
    per_class: dict[str, list[float]] = {}
    for r in train:
        scale = 1.0 if r["quant"] == "f16" else quantised
        per_class.setdefault(prefill_group(cat.gpu(r["gpu"])), []).append(implied_mfu(r) / scale)
    return {c: round(statistics.median(v), 3) for c, v in sorted(per_class.items())}, round(quantised, 3)


def table(rows: list[dict[str, str]]) -> list[str]:
    cat = package_catalog()
    lines = [
        "| GPU class | split | rows | median abs error before | after | worst after |",
        "|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in rows:
        gpu = cat.gpu(r["gpu"])
        measured, params = float(r["pp_tok_s"]), cat.models[r["model"]].params()
        before = OLD_MFU * gpu.bf16_tflops * 1e12 / (2 * params)
        after = prefill_mfu(gpu, r["quant"]) * gpu.bf16_tflops * 1e12 / (2 * params)
        err = (before / measured - 1, after / measured - 1)
        keys = [(prefill_group(gpu), r["split"]), ("all", r["split"])]
        if (r["gpu"], r["model"], r["quant"]) not in OUTLIERS:
            keys.append(("all but the two outliers", r["split"]))
        for key in keys:
            groups.setdefault(key, []).append(err)
    for (cls, split), errs in sorted(groups.items(), key=lambda kv: (kv[0][0].startswith("all"), kv[0])):
        b = statistics.median(abs(e[0]) for e in errs)
        a = statistics.median(abs(e[1]) for e in errs)
        worst = max((e[1] for e in errs), key=abs)
        lines.append(f"| {cls} | {split} | {len(errs)} | {b:.0%} | {a:.0%} | {worst:+.0%} |")
    return lines


def main() -> None:
    rows = load()
    rule = split_of(rows)
    if any(rule[f"{r['gpu']}|{r['model']}|{r['quant']}"] != r["split"] for r in rows):
        sys.exit("prefill.csv's split column disagrees with the rule")
    per_class, quantised = fit(rows)
    print("MFU per class:", per_class, "quantised factor:", quantised, "(default", PREFILL_MFU, ")")
    OUT.write_text(
        "# Estimator prefill speed vs published llama.cpp runs\n\n"
        "Rows: bench/estimator_eval/prefill.csv (source per row there). Error = predicted / measured - 1. Split "
        "fixed before fitting (bench/estimator_eval/prefill.py); constants fitted on 'fit' rows only. Before: one "
        f"MFU ({OLD_MFU}) for every GPU. After: MFU per GPU class {per_class}, x {quantised} for quantised "
        f"weights; a class without rows (the CPU) keeps {PREFILL_MFU}.\n\n" + "\n".join(table(rows)) + "\n\n"
        "Known outliers, kept in every row but the last two: L40S and A100 SXM F16 8B (2,492 and 681 tok/s, below "
        "their own Q4_K_M rows; the source's multi-GPU rows of those cards show the same); they carry the worst "
        "errors. The CPU has no rows here and keeps the default; a measured prefill (infer_benchmark, "
        "estimate_record_measurement) replaces the class figure on that GPU.\n"
    )


if __name__ == "__main__":
    main()
