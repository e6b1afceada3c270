"""Train the code-tuned LoRA adapter for the bundled all-MiniLM-L6-v2 on build_pairs.py's pairs: in-batch
negatives (sentence-transformers' MultipleNegativesRankingLoss, written out), one epoch, CPU is enough.

    .venv/bin/python bench/code_embedder/train.py --pairs pairs.jsonl --out adapter.safetensors \
        [--merged DIR] [--by-source]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from gpubox.bundled import minilm_dir

TARGETS = ("query", "key", "value", "attention.output.dense", "intermediate.dense", "output.dense")


def _targets(model: torch.nn.Module) -> list[str]:
    return [n for n, mod in model.named_modules() if isinstance(mod, torch.nn.Linear) and n.endswith(TARGETS)]


class LoRA(torch.nn.Module):
    def __init__(self, base: torch.nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = base
        self.a = torch.nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))
        self.b = torch.nn.Parameter(torch.zeros(base.out_features, rank))
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.a.T @ self.b.T) * self.scale


def _batches(rows: list[dict[str, str]], size: int, mix: bool) -> list[list[dict[str, str]]]:
    """`mix`: random batches (what the shipped adapter was trained with). Else batches of one source each (the
    negatives a search meets are the same repository's other definitions), the remainders pooled."""
    rng = random.Random(0)
    rows = rows[:]
    rng.shuffle(rows)
    if mix:
        return [rows[i : i + size] for i in range(0, len(rows) - size + 1, size)]
    by: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        by.setdefault(r["source"], []).append(r)
    out, rest = [], []
    for group in by.values():
        whole = len(group) // size * size
        out += [group[i : i + size] for i in range(0, whole, size)]
        rest += group[whole:]
    out += [rest[i : i + size] for i in range(0, len(rest) - size + 1, size)]
    rng.shuffle(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--merged", type=Path, help="also save the merged model as a sentence-transformers folder")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--heldout", type=int, default=512)
    ap.add_argument("--by-source", action="store_true", help="batches of one source each (v2: worse, see results)")
    args = ap.parse_args()
    from safetensors.torch import save_file
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    rows = [json.loads(line) for line in args.pairs.read_text(encoding="utf-8").splitlines()]
    held, rows = rows[: args.heldout], rows[args.heldout :]
    if args.limit:
        rows = rows[: args.limit]
    model = SentenceTransformer(str(minilm_dir()), device="cpu")
    model.max_seq_length = args.max_tokens
    bert = model[0].auto_model
    for p in bert.parameters():
        p.requires_grad_(False)
    names = _targets(bert)
    for name in names:
        parent_name, _, leaf = name.rpartition(".")
        parent = bert.get_submodule(parent_name)
        setattr(parent, leaf, LoRA(getattr(parent, leaf), args.rank, args.alpha))
    params = [p for p in bert.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    batches = _batches(rows, args.batch, not args.by_source)
    steps = len(batches)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, steps // 10)) * max(0.0, (steps - s) / steps)
    )

    def embed(texts: list[str]) -> torch.Tensor:
        return F.normalize(model(model.preprocess(texts))["sentence_embedding"], dim=-1)

    def heldout_mrr() -> float:
        model.eval()
        with torch.no_grad():
            q = torch.cat([embed([r["query"] for r in held[i : i + 64]]) for i in range(0, len(held), 64)])
            c = torch.cat([embed([r["code"] for r in held[i : i + 64]]) for i in range(0, len(held), 64)])
        ranks = (q @ c.T > (q * c).sum(-1, keepdim=True)).sum(-1) + 1
        model.train()
        return float((1.0 / ranks.float()).mean())

    print(f"{len(names)} LoRA layers, {sum(p.numel() for p in params)} parameters, {steps} steps", flush=True)
    print(f"held-out MRR before: {heldout_mrr():.4f}", flush=True)
    model.train()
    t0 = time.time()
    for step, batch in enumerate(batches):
        q, c = embed([r["query"] for r in batch]), embed([r["code"] for r in batch])
        scores = q @ c.T * 20.0
        labels = torch.arange(len(batch))
        loss = (F.cross_entropy(scores, labels) + F.cross_entropy(scores.T, labels)) / 2
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        if step % 20 == 0 or step == steps - 1:
            print(f"step {step}/{steps} loss {loss.item():.4f} {time.time() - t0:.0f}s", flush=True)
    print(f"held-out MRR after: {heldout_mrr():.4f}", flush=True)
    tensors: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name in names:
            lora = bert.get_submodule(name)
            assert isinstance(lora, LoRA)
            tensors[f"{name}.lora_a"] = lora.a.detach().to(torch.float16).contiguous()
            tensors[f"{name}.lora_b"] = (lora.b * lora.scale).detach().to(torch.float16).contiguous()
            lora.base.weight += (lora.b @ lora.a) * lora.scale
            parent_name, _, leaf = name.rpartition(".")
            setattr(bert.get_submodule(parent_name), leaf, lora.base)
    save_file(
        tensors, str(args.out), metadata={"base": "sentence-transformers/all-MiniLM-L6-v2", "rank": str(args.rank)}
    )
    if args.merged:
        model.save(str(args.merged))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
