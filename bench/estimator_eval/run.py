"""Score the estimator's decode speed against decode.csv and write bench/results/estimator_decode.md.

    .venv/bin/python bench/estimator_eval/run.py [--out PATH] [--label TEXT]

Every row is a full-GPU run, so the speed model is scored with the whole model on the GPU (memory fit
is reported separately: a row the memory model thinks does not fit is marked).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from decode_split import load  # noqa: E402

from gpubox.tools.estimate import decode_model  # noqa: E402
from gpubox.tools.estimate import inference as inf  # noqa: E402
from gpubox.tools.estimate.catalog import package_catalog  # noqa: E402

RESULTS = HERE.parent / "results" / "estimator_decode.md"


def predict(row: dict[str, str]) -> tuple[float, bool]:
    """(expected decode tok/s, whether the memory model says it fits)."""
    cat = package_catalog()
    shape, gpu = cat.model(row["model"]), cat.gpu(row["gpu"])
    wp = inf.weight_plan(shape, row["quant"])
    ctx = int(row["context"])
    common = {"context": ctx, "batch": 1, "kv_type": "f16", "catalog": cat}
    r = inf.estimate_on_gpu(shape, wp, gpu, available_gb=1e6, **common)
    fits = inf.memory(shape, wp, "f16", ctx, 1).total_gb <= gpu.vram_gb
    return r.decode_tokens_per_s, fits


def score(rows: list[dict[str, str]]) -> list[dict[str, object]]:
    cat = package_catalog()
    out: list[dict[str, object]] = []
    for r in rows:
        pred, fits = predict(r)
        meas = float(r["tg_tok_s"])
        cls = cat.gpu(r["gpu"]).gpu_class
        out.append({**r, "gpu_class": cls, "predicted": pred, "error": pred / meas - 1, "fits": fits})
    return out


def summary(scored: list[dict[str, object]]) -> list[str]:
    lines = ["| GPU class | split | rows | median abs error | worst error | signed median |", "|---" * 6 + "|"]
    classes = sorted({str(s["gpu_class"]) for s in scored})
    for cls in [*classes, "all"]:
        for split in ("fit", "check"):
            errs = [float(s["error"]) for s in scored if s["split"] == split and cls in ("all", s["gpu_class"])]
            if not errs:
                continue
            worst = max(errs, key=abs)
            lines.append(
                f"| {cls} | {split} | {len(errs)} | {statistics.median(abs(e) for e in errs):.1%} | "
                f"{worst:+.1%} | {statistics.median(errs):+.1%} |"
            )
    return lines


def detail(scored: list[dict[str, object]]) -> list[str]:
    lines = ["| GPU | model | quant | ctx | measured | predicted | error | split | fits |", "|---" * 9 + "|"]
    for s in sorted(scored, key=lambda s: (str(s["gpu_class"]), str(s["gpu"]), str(s["model"]), str(s["quant"]))):
        lines.append(
            f"| {s['gpu']} | {s['model']} | {s['quant']} | {s['context']} | {float(str(s['tg_tok_s'])):.2f} | "
            f"{float(str(s['predicted'])):.2f} | {float(str(s['error'])):+.1%} | {s['split']} | "
            f"{'yes' if s['fits'] else 'no (memory model)'} |"
        )
    return lines


def constants() -> list[str]:
    lines = [
        "| GPU class | efficiency (share of datasheet bandwidth) | fixed cost per layer | k-quant ops per weight |",
        "|---" * 4 + "|",
    ]
    for cls, c in decode_model.DECODE_COSTS.items():
        ops = f"{c.kquant_ops:.0f}" if c.kquant_ops else "-"
        lines.append(f"| {cls} | {c.efficiency:.2f} | {c.per_layer_s * 1e6:.0f} us | {ops} |")
    return lines


def report(scored: list[dict[str, object]], label: str) -> str:
    head = [
        f"# Estimator decode speed vs published llama.cpp runs ({label})",
        "",
        "Rows: bench/estimator_eval/decode.csv (sources per row there). Error = predicted / measured - 1.",
        "Split fixed before fitting (bench/estimator_eval/decode_split.py); constants fitted on 'fit' rows only.",
        "",
    ]
    form = [
        "## Model form (tools/estimate/decode_model.py)",
        "",
        "step_s = max((weights + KV read at half the context) / (bandwidth x efficiency), k-quant weights x ops"
        " / FP32 rate) + layers x per_layer_s; tok/s = batch / step_s. The compute term applies where the GPU"
        " unpacks k-quants in its FP32 ALUs (Apple Metal). Constants fitted by bench/estimator_eval/fit.py on the"
        " fit rows:",
        "",
        *constants(),
        "",
    ]
    return "\n".join([*head, *summary(scored), "", *form, "## Rows", "", *detail(scored), ""])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--label", default="current model")
    args = ap.parse_args()
    scored = score(load())
    text = report(scored, args.label)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print("\n".join(summary(scored)))


if __name__ == "__main__":
    main()
