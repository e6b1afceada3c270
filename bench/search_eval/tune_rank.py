"""Tune and ablate the hybrid ranking stage (tools/search/rank.py) on indexes that run_eval.py already built.

    .venv/bin/python bench/search_eval/tune_rank.py --state-dir DIR [--split dev] [--out FILE]

Each leg (vector, lexical, phrase, symbol) is queried once per query through gpubox's own code; fusion and the
ranking rules are then replayed in-process for every configuration below, so one run compares them all on the
same candidates. Tune on --split dev only; the test split is for the final report (run_eval.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from evalset import Query, first_rank, load_queries, metrics, select
from fetch import DEFAULT_DEST, QUERIES_DIR, load_specs

from gpubox.settings import Settings
from gpubox.tools.search.query import legs, rank_lists
from gpubox.tools.search.query_kind import classify
from gpubox.tools.search.rank import DEFAULT, RankConfig, fusion_only, reweighted
from gpubox.tools.search.service import SearchService
from gpubox.tools.search.store import IndexStore

OLD_WEIGHTS = {k: {"symbol": 2.0, "lexical": 1.0, "vector": 1.0, "phrase": 0.0} for k in ("symbol", "mixed", "nl")}
# the ranking before this stage: equal-weight RRF + symbol x2, no rules (the symbol leg then also fired on words)
BEFORE = replace(
    DEFAULT, rrf_k=60, weights=OLD_WEIGHTS, definition=0, name_match=0, stem=0, coherence=0, mention=1, path_penalty=1,
    dedupe=False,
)  # fmt: skip


CONFIGS: dict[str, RankConfig] = {
    "before (equal RRF, no rules)": BEFORE,
    "fusion only (query-kind weights, no rules)": fusion_only(DEFAULT),
    "**default**": DEFAULT,
    "- phrase leg": reweighted(DEFAULT, **{k: {"phrase": 0.0} for k in ("symbol", "mixed", "nl")}),
    "- definition boost": replace(DEFAULT, definition=0),
    "- name match": replace(DEFAULT, name_match=0),
    "- file-stem match": replace(DEFAULT, stem=0),
    "- file coherence": replace(DEFAULT, coherence=0),
    "- mention penalty": replace(DEFAULT, mention=1),
    "- path penalty": replace(DEFAULT, path_penalty=1),
    "- overlap de-dup": replace(DEFAULT, dedupe=False),
}


def extra_configs() -> dict[str, RankConfig]:
    out: dict[str, RankConfig] = {}
    for v in (0.5, 0.7, 1.3, 1.6):
        out[f"nl vector x{v}"] = reweighted(DEFAULT, nl={"vector": v})
    for k in (10, 30):
        out[f"rrf k={k}"] = replace(DEFAULT, rrf_k=k)
    for st in (0.15, 0.6, 1.0):
        out[f"stem {st}"] = replace(DEFAULT, stem=st)
    for nm in (0.25, 1.0):
        out[f"name match {nm}"] = replace(DEFAULT, name_match=nm)
    for c in (0.1, 0.4):
        out[f"coherence {c}"] = replace(DEFAULT, coherence=c)
    for m in (0.6, 0.9):
        out[f"mention x{m}"] = replace(DEFAULT, mention=m)
    return out


def collect(
    state_dir: Path, split: str, names: list[str] | None, cache: Path | None
) -> list[tuple[Query, Any, dict[str, Any]]]:
    """Every leg's candidates per query; with --cache they are stored once, so replays skip loading the model."""
    specs = [s for s in load_specs(names) if (QUERIES_DIR / f"{s.name}.jsonl").exists()]
    specs = [s for s in specs if (state_dir / "search" / s.name / "index.sqlite").is_file()]
    stores = {s.name: IndexStore(state_dir / "search" / s.name) for s in specs}
    queries = [(q, s.name) for s in specs for q in select(load_queries(s.name), split)]
    saved: dict[str, Any] = json.loads(cache.read_text()) if cache and cache.is_file() else {}
    if any(q.id not in saved for q, _ in queries):
        svc = SearchService(Settings.load(state_dir=state_dir, allowed_roots=[DEFAULT_DEST.resolve()]))
        for q, name in queries:
            if q.id in saved:
                continue
            index = svc._faiss_index(name, svc.store(name))
            vec = svc.embedder.encode_query(q.query)
            found = legs(stores[name], index, lambda v=vec: v, q.query, "hybrid", 50, None, classify(q.query))
            saved[q.id] = {leg: [[i, float(sc)] for i, sc in items] for leg, items in found.items()}
        if cache:
            cache.write_text(json.dumps(saved))
    return [(q, stores[name], {leg: [tuple(x) for x in v] for leg, v in saved[q.id].items()}) for q, name in queries]


def ranks_for(cfg: RankConfig, data: list[tuple[Query, Any, dict[str, Any]]]) -> list[tuple[Query, int | None]]:
    res = []
    for q, store, lists in data:
        ranked = rank_lists(store, lists, classify(q.query), cfg)[:10]
        rows = store.chunks([r.id for r in ranked])
        hits = [(rows[r.id].path, rows[r.id].start_line, rows[r.id].end_line) for r in ranked]
        res.append((q, first_rank(hits, q.targets)))
    return res


def leg_ranks(leg: str, data: list[tuple[Query, Any, dict[str, Any]]]) -> list[tuple[Query, int | None]]:
    res = []
    for q, store, lists in data:
        ids = [i for i, _ in lists.get(leg, [])][:10]
        rows = store.chunks(ids)
        hits = [(rows[i].path, rows[i].start_line, rows[i].end_line) for i in ids if i in rows]
        res.append((q, first_rank(hits, q.targets)))
    return res


def row(label: str, ranks: list[tuple[Query, int | None]]) -> str:
    m = metrics([r for _, r in ranks])
    kinds = [
        metrics([r for q, r in ranks if q.kind == k]).get("recall@5", 0.0) for k in ("nl", "identifier", "conceptual")
    ]
    return (
        f"| {label} | {m['recall@1']:.2f} | {m['recall@5']:.2f} | {m['recall@10']:.2f} | {m['mrr@10']:.2f} | "
        + " | ".join(f"{k:.2f}" for k in kinds)
        + " |"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state-dir", type=Path, required=True)
    ap.add_argument("--split", choices=("dev", "test", "all"), default="dev")
    ap.add_argument("--corpus", action="append")
    ap.add_argument("--sweep", action="store_true", help="also try the parameter variants in extra_configs()")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--cache", type=Path, help="JSON file keeping each query's leg candidates between runs")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    data = collect(args.state_dir, args.split, args.corpus, args.cache)
    head = [
        f"{len(data)} {args.split} queries; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        "| ranking | recall@1 | recall@5 | recall@10 | MRR@10 | nl r@5 | identifier r@5 | conceptual r@5 |",
        "|---|---|---|---|---|---|---|---|",
        row("vector leg alone", leg_ranks("vector", data)),
        row("lexical leg alone", leg_ranks("lexical", data)),
    ]
    configs = {**CONFIGS, **(extra_configs() if args.sweep else {})}
    lines = head + [row(label, ranks_for(cfg, data)) for label, cfg in configs.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
