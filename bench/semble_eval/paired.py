"""How far a difference from semble's published NDCG@10 is from noise: a paired bootstrap over repositories.

semble publishes one figure per repository (and per category within it), not per query, so the repository is the
unit: resample a half's repositories with replacement, take gpubox's mean minus semble's mean over the same draw
(overall, and per category over the drawn repositories that have queries of it, as score.summarize does), and
report the observed difference with its 95% percentile interval. A difference whose interval spans zero is a tie
at this benchmark's size, in either direction.

    .venv/bin/python bench/semble_eval/paired.py HITS.jsonl --half report [--mode hybrid] [--draws 10000]
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import score

CATEGORIES = ("overall", *score.CATEGORIES)


def _pairs(ours: Mapping[str, Any], category: str) -> list[tuple[float, float]]:
    """(gpubox, semble) per repository for one category ('overall': the repository's NDCG@10)."""
    out = []
    for repo, r in ours["repos"].items():
        theirs = score.semble_published(repo)
        if category == "overall":
            out.append((r["ndcg10"], theirs["ndcg10"]))
        elif category in r["by_category"] and category in theirs["by_category"]:
            out.append((r["by_category"][category], theirs["by_category"][category]))
    return out


def interval(pairs: Sequence[tuple[float, float]], draws: int, seed: int = 0) -> tuple[float, float, float]:
    """Observed mean difference and its 95% bootstrap interval (percentile method, repositories resampled)."""
    diffs = [a - b for a, b in pairs]
    observed = sum(diffs) / len(diffs)
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(diffs, k=len(diffs))) / len(diffs) for _ in range(draws))
    return observed, means[int(0.025 * draws)], means[int(0.975 * draws) - 1]


def table(ours: Mapping[str, Any], draws: int) -> str:
    lines = [
        "| | repositories | gpubox - semble | 95% interval | share of draws above 0 |",
        "|---|---|---|---|---|",
    ]
    for category in CATEGORIES:
        pairs = _pairs(ours, category)
        if not pairs:
            continue
        observed, lo, hi = interval(pairs, draws)
        diffs = [a - b for a, b in pairs]
        rng = random.Random(1)
        above = sum(sum(rng.choices(diffs, k=len(diffs))) > 0 for _ in range(draws)) / draws
        lines.append(f"| {category} | {len(pairs)} | {observed:+.4f} | [{lo:+.4f}, {hi:+.4f}] | {above:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hits", type=Path)
    ap.add_argument("--half", choices=("tune", "report", "all"), default="report")
    ap.add_argument("--mode", default="hybrid")
    ap.add_argument("--draws", type=int, default=10_000)
    args = ap.parse_args(argv)
    ours = score.score_hits_file(args.hits, args.half)[args.mode]
    print(f"## {args.mode} ({args.half}): gpubox vs semble's published NDCG@10, paired by repository\n")
    print(table(ours, args.draws))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
