"""Score the estimator's llama.cpp compute buffer against published load logs; write
bench/results/estimator_llamacpp_memory.md.

    .venv/bin/python bench/estimator_eval/llamacpp_run.py [--out PATH]

Rows: llamacpp_memory.csv, one per llama.cpp load log (`compute buffer size`, `KV self size`, `model buffer size`
as printed). A row is scored when its whole graph ran on one CUDA device (offload 'full') or on the CPU backend
(offload 'cpu': same ggml-alloc graph, the log's numbers match the CUDA ones to 0.01 MiB); partial offloads and
other backends (CANN) are listed, not scored. The shape is the catalog model named in `catalog`, else a
`ModelShape` built from the row (head_dim = n_embd / n_head). Fields the log did not print take llama.cpp's
defaults (n_ubatch 512, flash attention off) and the table marks them with '*'.

Split, fixed before any constant is fitted: all rows ordered by
sha256("model|n_ctx|n_ubatch|flash_attn|compute_buffer_mib"), every third (positions 0, 3, ...) is a 'check' row
(the decode_split.py rule, one group). The proposed formula's two constants are fitted on scored fit rows only.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import statistics
from pathlib import Path

from gpubox.tools.estimate.catalog import ModelShape, package_catalog
from gpubox.tools.estimate.inference import RUNTIME_OVERHEAD_GB, compute_buffer_bytes

HERE = Path(__file__).resolve().parent
CSV = HERE / "llamacpp_memory.csv"
RESULTS = HERE.parent / "results" / "estimator_llamacpp_memory.md"
MIB = 1024**2
DEFAULT_UBATCH = 512  # llama.cpp's default n_ubatch (and llama-cpp-python's / ollama's n_batch)
F32 = 4


def load(path: Path = CSV) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def row_key(row: dict[str, str]) -> str:
    text = "|".join(row[k] for k in ("model", "n_ctx", "n_ubatch", "flash_attn", "compute_buffer_mib"))
    return hashlib.sha256(text.encode()).hexdigest()


def assign_split(rows: list[dict[str, str]]) -> dict[str, str]:
    """row_key -> 'fit' or 'check'."""
    return {row_key(r): ("check" if i % 3 == 0 else "fit") for i, r in enumerate(sorted(rows, key=row_key))}


def scored(row: dict[str, str]) -> bool:
    return row["offload"] in ("full", "cpu") and row["backend"] in ("CUDA", "CPU")


def shape_of(row: dict[str, str]) -> ModelShape:
    if row["catalog"]:
        return package_catalog().model(row["catalog"])
    n_embd, n_head = int(row["n_embd"]), int(row["n_head"])
    return ModelShape(
        id=row["model"],
        layers=int(row["n_layer"]),
        hidden=n_embd,
        heads=n_head,
        kv_heads=int(row["n_head_kv"]),
        head_dim=n_embd // n_head,
        intermediate=int(row["n_ff"]),
        vocab=int(row["n_vocab"]),
        tied_embeddings=False,
        max_context=max(int(row["n_ctx"]), 2048),
    )


def settings(row: dict[str, str]) -> tuple[int, int, bool, bool]:
    """(n_ctx, ubatch, flash attention, whether a default filled a missing field)."""
    n_ctx = int(row["n_ctx"])
    filled = not row["n_ubatch"] or not row["flash_attn"]
    ub = min(int(row["n_ubatch"] or DEFAULT_UBATCH), n_ctx)
    return n_ctx, ub, row["flash_attn"] == "1", filled


def terms(row: dict[str, str]) -> tuple[float, float, float]:
    """(logits, attention scores + mask, one hidden-state tensor) in bytes, for the row's ubatch."""
    shape = shape_of(row)
    n_ctx, ub, fa, _ = settings(row)
    logits = ub * shape.vocab * F32
    attn = 0.0 if fa else ub * n_ctx * shape.heads * F32 + ub * n_ctx * F32  # KQ (f32) + KQ mask (f32)
    return logits, attn, ub * shape.hidden * F32


def fit_constants(rows: list[dict[str, str]]) -> tuple[float, float, int, int]:
    """(a, b, n_a, n_b): hidden-state tensors live beside the logits (a) and beside KQ (b), medians over fit rows."""
    a_vals, b_vals = [], []
    for r in rows:
        logits, attn, h = terms(r)
        printed = float(r["compute_buffer_mib"]) * MIB
        (a_vals if logits >= attn else b_vals).append((printed - max(logits, attn)) / h)
    a = statistics.median(a_vals) if a_vals else 1.0
    b = statistics.median(b_vals) if b_vals else a
    return a, b, len(a_vals), len(b_vals)


def proposed_bytes(row: dict[str, str], a: float, b: float) -> float:
    logits, attn, h = terms(row)
    return max(logits + a * h, attn + b * h)


def err(pred: float, printed: float) -> float:
    return (pred - printed) / printed


def summary(errors: list[float]) -> str:
    if not errors:
        return "no rows"
    abs_e = [abs(e) for e in errors]
    worst = max(errors, key=abs)
    return f"median |error| {statistics.median(abs_e):.1%}, worst {worst:+.1%} (n={len(errors)})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=RESULTS)
    out = ap.parse_args().out
    rows = load()
    split = assign_split(rows)
    use = [r for r in rows if scored(r)]
    fit_rows = [r for r in use if split[row_key(r)] == "fit"]
    a, b, n_a, n_b = fit_constants(fit_rows)

    table = []
    cur: dict[str, list[float]] = {"fit": [], "check": []}
    new: dict[str, list[float]] = {"fit": [], "check": []}
    for r in rows:
        s = split[row_key(r)]
        printed = float(r["compute_buffer_mib"])
        if not scored(r):
            table.append(
                f"| {r['model']} | {r['n_ctx']} | {r['n_ubatch'] or '-'} | {r['flash_attn'] or '-'} | {s} | "
                f"{printed:g} | not scored ({r['backend']}, offload {r['offload']}) | | | |"
            )
            continue
        n_ctx, ub, fa, filled = settings(r)
        now = compute_buffer_bytes(shape_of(r), n_ctx, 1, flash_attn=bool(fa), ubatch=ub) / MIB
        prop = proposed_bytes(r, a, b) / MIB
        cur[s].append(err(now, printed))
        new[s].append(err(prop, printed))
        star = "*" if filled else ""
        table.append(
            f"| {r['model']} | {n_ctx} | {ub}{star} | {int(fa)}{star} | {s} | {printed:g} | {now:.1f} | "
            f"{err(now, printed):+.1%} | {prop:.1f} | {err(prop, printed):+.1%} |"
        )

    smi = [r for r in rows if r["nvidia_smi_mib"]]
    lines = [
        "# llama.cpp compute buffer: estimator vs published load logs",
        "",
        f"Data: `bench/estimator_eval/llamacpp_memory.csv` ({len(rows)} logs, {len(use)} scored). "
        'Script: `bench/estimator_eval/llamacpp_run.py`. Split: sha256("model|n_ctx|n_ubatch|flash_attn|'
        'compute_buffer_mib"), every third row a check row, fixed before fitting. `*`: n_ubatch / flash '
        "attention not printed, llama.cpp defaults (512, off) used.",
        "",
        "Current = gpubox's `compute_buffer_bytes(shape, n_ctx, 1, flash_attn, ubatch)` (tools/estimate/inference.py; "
        "before 2026-11-25 a fixed 512-token ubatch, no flash-attention case and a larger scratch term: "
        "estimator_llamacpp_memory_before.md). "
        f"Proposed = max(logits + a*h, KQ + mask + b*h), fitted on fit rows: a = {a:.2f} ({n_a} logits-bound rows), "
        f"b = {b:.2f} ({n_b} KQ-bound rows); logits = ub*n_vocab*4, KQ = ub*n_ctx*n_head*4 (0 with flash "
        "attention), mask = ub*n_ctx*4 (0 with flash attention), h = ub*n_embd*4, ub = min(n_ubatch, n_ctx).",
        "",
        "| model | n_ctx | n_ubatch | FA | split | printed MiB | current MiB | current err | proposed MiB | "
        "proposed err |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|",
        *table,
        "",
        "## Errors",
        "",
        f"- current, fit rows: {summary(cur['fit'])}",
        f"- current, check rows: {summary(cur['check'])}",
        f"- proposed, fit rows: {summary(new['fit'])}",
        f"- proposed, check rows: {summary(new['check'])}",
        "",
        "## Whole-card memory (nvidia-smi)",
        "",
        f"{len(smi)} rows give an nvidia-smi reading for the same run, so weights + KV + compute + "
        f"RUNTIME_OVERHEAD_GB ({RUNTIME_OVERHEAD_GB} GB) could not be checked against the card."
        if not smi
        else f"{len(smi)} rows give nvidia-smi readings.",
    ]
    lines += [
        "",
        "## What the errors say",
        "",
        "- The graph buffer is one of two peaks, never their sum: the output step (logits, ub*n_vocab*4, plus "
        f"{a:.0f} hidden-state tensor) or, without flash attention, the attention step (KQ ub*n_ctx*n_head*4 "
        f"plus its f32 mask, plus about {b:.0f} hidden-state tensors: Q, K/V views copied, residual). Every "
        "scored log is reproduced to the printed 0.01 MiB except Pythia-2.8B (-6%, its parallel-residual "
        "block keeps more tensors live).",
        "- The current scratch term ub*(hidden + intermediate)*4*2 is too big (+4% to +40% on every row): "
        "llama.cpp frees the FFN intermediate before the logits or KQ are allocated.",
        "- With flash attention KQ is never materialised, so the buffer stays at the logits peak at any n_ctx "
        "(GLM-4-32B at 32768: 308 MiB printed; the current model, which always adds the scores, says 3186 MiB).",
        "- The buffer is linear in n_ubatch (both peaks scale with it); the current model fixes ub = 512, so "
        "`-ub 1024/2048` runs are under-counted by about the ratio once logits dominate.",
        "- n_vocab matters most at short context: Llama-3 / Qwen2.5 vocabularies (128k-152k) give a 250-300 MiB "
        "floor at ub = 512 even at n_ctx 512.",
        "- Backend matters: the same Llama-3-8B at 8192 prints 560.00 MiB on CUDA and CPU, 1260.50 MiB on CANN.",
        "",
        "Caveats: 11 scored rows, 4 of them from files the search index could not resolve to a repository path "
        "(marked in the CSV); two rows had n_ubatch / flash attention filled by defaults; only 2 fit rows are "
        "logits-bound, so a = 1 rests on them (the 4 check rows of that kind agree to 0.01 MiB); both flash-"
        "attention rows come from the ik_llama.cpp fork; no row gives nvidia-smi for the same run.",
        "",
        "## Public statements on per-process CUDA overhead",
        "",
        "- https://dev.to/plasmon_imp/20260325llamacppoptions8gben-3jjg (2026-03-25): on an RTX 4060 8GB "
        '"~0.5 GB goes to CUDA context + framework overhead" (a statement, not a logged reading).',
        "- https://github.com/ggml-org/llama.cpp/issues/21514 (2026-04-06): same model and settings (gemma-4-31B "
        "Q4_K_M, ctx 64000, q8_0 KV, -fa on) use 22.3 GB in llama-cli and 23.5 GB in llama-server: the front-end "
        "alone moves the card reading by 1.2 GB.",
        "- https://github.com/nibor1896/Crow/issues/105 (2026-08-20): RTX 5090 on a Windows desktop with no "
        "llama-server running reads a median 1,585.5 MiB in nvidia-smi (display/desktop, not a CUDA context): "
        "the baseline a plan must subtract from 'free' on a display GPU.",
        "- https://github.com/ollama/ollama/issues/6160 (2024-10-02): ollama ps 24 GB vs nvidia-smi 20618 MiB "
        "for one loaded model: an estimator's figure and the card's differ in both directions.",
        "- Recent llama.cpp prints `common_memory_breakdown_print` (total / free / self = model + context + "
        "compute / unaccounted per device; https://github.com/ggml-org/llama.cpp/issues/23679): 'unaccounted' "
        "is exactly the CUDA context + other processes term; a log with it is the best source for the next rows.",
    ]
    for r in smi:
        parts = [float(r[k]) for k in ("model_mib", "kv_mib", "compute_buffer_mib") if r[k]]
        total = sum(parts) + RUNTIME_OVERHEAD_GB * 1e9 / MIB
        lines.append(f"- {r['model']}: printed buffers + overhead {total:.0f} MiB vs nvidia-smi {r['nvidia_smi_mib']}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines[-12:]))


if __name__ == "__main__":
    main()
