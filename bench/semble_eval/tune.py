"""Tune and ablate gpubox's ranking stage on semble's benchmark, TUNE half only (issue #22).

    .venv/bin/python bench/semble_eval/tune.py [--half tune] [--cache bench/semble_eval/state/legs_tune.json]

Needs the indexes run_gpubox.py built in bench/semble_eval/state/. Each leg (vector, lexical, phrase, symbol) is
queried once per annotated query through gpubox's own code (cached in --cache), then fusion and the ranking rules
(tools/search/rank.py) are replayed in-process for every configuration below and scored with score.py, so one run
compares them on the same candidates. The report half is never read here: it is scored once, by run_gpubox.py and
score.py, with the configuration chosen on this half.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import score  # noqa: E402
import split as split_mod  # noqa: E402
import upstream  # noqa: E402

from gpubox.settings import Settings  # noqa: E402
from gpubox.tools.search.query import legs, rank_lists  # noqa: E402
from gpubox.tools.search.query_kind import classify  # noqa: E402
from gpubox.tools.search.rank import DEFAULT, RankConfig, fusion_only, reweighted  # noqa: E402
from gpubox.tools.search.service import SearchService  # noqa: E402
from gpubox.tools.search.store import IndexStore  # noqa: E402

STATE = Path(os.environ.get("SEMBLE_EVAL_STATE") or HERE / "state")  # another state dir: an experiment's indexes
Data = list[tuple[str, dict[str, Any], IndexStore, dict[str, list[tuple[int, float]]]]]


def configs() -> dict[str, RankConfig]:
    """The default, each rule switched off, and the values tried around the default (the tuning record)."""
    d = DEFAULT
    out: dict[str, RankConfig] = {
        "**default**": d,
        "fusion only (no rules)": fusion_only(d),
        "- definition boost": replace(d, definition=0),
        "definition boost in sentences too (x1)": replace(d, definition_in_sentence=1.0),
        "- file-stem match": replace(d, stem=0),
        "- file coherence": replace(d, coherence=0),
        "- mention penalty": replace(d, mention=1),
        "- path penalty": replace(d, path_penalty=1),
        "- overlap de-dup": replace(d, dedupe=False),
        "- file saturation": replace(d, saturation=1),
        "- prose penalty": replace(d, prose=1),
        "before #22 tuning (rrf k=10, stem 0.3, coherence 0.2, no saturation/prose)": replace(
            d, rrf_k=10, stem=0.3, coherence=0.2, saturation=1, prose=1
        ),
    }  # fmt: skip
    for k in (10, 30, 60):
        out[f"rrf k={k}"] = replace(d, rrf_k=k)
    for c in (0.2, 0.4, 0.8):
        out[f"coherence {c}"] = replace(d, coherence=c)
    for st in (0.3, 0.7):
        out[f"stem {st}"] = replace(d, stem=st)
    for sat in (0.3, 0.7):
        out[f"saturation x{sat}"] = replace(d, saturation=sat)
    for pr in (0.6,):
        out[f"prose x{pr}"] = replace(d, prose=pr)
    for pp in (0.5,):
        out[f"path penalty x{pp}"] = replace(d, path_penalty=pp)
    for v in (1.0, 2.0):
        out[f"nl vector x{v}"] = reweighted(d, nl={"vector": v})
    out["mixed vector x1.3"] = reweighted(d, mixed={"vector": 1.3})
    for nf in (0.3, 0.5, 1.0):
        out[f"named file {nf}"] = replace(d, named_file=nf)
    # what keeps bench/search_eval's labelled set (one labelled definition per query) from regressing
    out["saturation after 2"] = replace(d, saturation_after=2)
    out["saturation after 2, rrf k=10"] = replace(d, saturation_after=2, rrf_k=10)
    out["saturation x0.7 after 2"] = replace(d, saturation=0.7, saturation_after=2)
    out["saturation x0.7 after 2, rrf k=10"] = replace(d, saturation=0.7, saturation_after=2, rrf_k=10)
    out["- file saturation, rrf k=10"] = replace(d, saturation=1, rrf_k=10)
    # types named by adjacent words ('JSON element' -> JsonElement): their leg's weight, and a bonus on them
    out["- compound leg"] = reweighted(d, nl={"compound": 0.0}, mixed={"compound": 0.0})
    for w in (0.5, 2.0):
        out[f"compound leg {w}"] = reweighted(d, nl={"compound": w}, mixed={"compound": w})
    out["compound leg, nl queries only"] = reweighted(d, mixed={"compound": 0.0})
    for b in (0.3, 1.0):
        out[f"+ compound bonus {b}"] = replace(d, compound=b)
    # an API's older copy (pydantic/v1 beside pydantic/, zod's v3 beside v4, deprecated/)
    for x in (0.3, 0.7, 1.0):
        out[f"older copies x{x}"] = replace(d, superseded=x)
    # C++'s out-of-line constructor (`MemTable::MemTable(` in the .cc) beside the class in the header
    for c in (0.0, 0.25, 1.0):
        out[f"out-of-line constructor x{c}"] = replace(d, constructor=c)
    # a name defined outside the index: the chunk that re-exports it (axum's `pub use axum_core::...::FromRequest`)
    for x in (0.0, 0.5, 2.0):
        out[f"re-export x{x}"] = replace(d, reexport=x)
    # a symbol query's name that is a type and also functions/methods (class Double, a `Double(double)` handler)
    for x in (0.0, 0.25, 0.5, 0.75):
        out[f"type first x{x}"] = replace(d, type_first=x)
    return out


def index_stamp(store: IndexStore) -> str:
    """When the index last changed: cached legs name chunk ids, which indexing again renumbers."""
    return str(store.meta().get("updated", ""))


def collect(half: str, cache: Path) -> Data:
    """Every leg's candidates for every annotated query of the half's indexed repositories (cached)."""
    repos = [r for r in split_mod.repos_in(half) if (STATE / "search" / r / "index.sqlite").is_file()]
    saved: dict[str, Any] = json.loads(cache.read_text()) if cache.is_file() else {}
    svc: SearchService | None = None
    out: Data = []
    for repo in repos:
        store = IndexStore(STATE / "search" / repo)
        stamp = index_stamp(store)
        for i, item in enumerate(upstream.load_annotations(repo)):
            key = f"{repo}#{i}@{stamp}"
            if key not in saved:
                if svc is None:
                    svc = SearchService(Settings.load(state_dir=STATE, allowed_roots=[HERE / "corpora"]))
                index = svc._faiss_index(repo, store)  # the bench replays the service's own legs
                vec = svc.embedder.encode_query(item["query"])
                found = legs(store, index, lambda v=vec: v, item["query"], "hybrid", 50, None, classify(item["query"]))
                saved[key] = {leg: [[c, float(s)] for c, s in items] for leg, items in found.items()}
            lists = {leg: [(int(c), float(s)) for c, s in v] for leg, v in saved[key].items()}
            out.append((repo, {**item, "_index": i}, store, lists))
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(saved))
    return out


def evaluate(cfg: RankConfig, data: Data, half: str) -> dict[str, Any]:
    rows = []
    for repo, item, store, lists in data:
        ranked = rank_lists(store, lists, classify(item["query"]), cfg)[:10]
        chunks = store.chunks([r.id for r in ranked])
        hits = [(chunks[r.id].path, chunks[r.id].start_line, chunks[r.id].end_line) for r in ranked if r.id in chunks]
        rows.append({**score.score_query(hits, item), "repo": repo})
    return score.aggregate(rows, half)


def leg_only(leg: str, data: Data, half: str) -> dict[str, Any]:
    rows = []
    for repo, item, store, lists in data:
        ids = [c for c, _ in lists.get(leg, [])][:10]
        chunks = store.chunks(ids)
        hits = [(chunks[c].path, chunks[c].start_line, chunks[c].end_line) for c in ids if c in chunks]
        rows.append({**score.score_query(hits, item), "repo": repo})
    return score.aggregate(rows, half)


def line(label: str, agg: dict[str, Any]) -> str:
    s = agg["summary"]
    cats = s.get("by_category", {})
    return f"| {label} | {s['ndcg10']:.3f} | " + " | ".join(
        f"{cats.get(c, float('nan')):.3f}" for c in ("architecture", "semantic", "symbol")
    ) + " |"  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--half", choices=("tune",), default="tune", help="tuning reads the tune half only")
    ap.add_argument("--cache", type=Path, default=STATE / "legs_tune.json")
    ap.add_argument("--per-repo", action="store_true", help="also print the default's per-repository table")
    args = ap.parse_args(argv)
    data = collect(args.half, args.cache)
    print(f"{len({d[0] for d in data})} repositories, {len(data)} queries (half: {args.half})\n")
    print("| configuration | NDCG@10 | architecture | semantic | symbol |\n|---|---|---|---|---|")
    for leg in ("vector", "lexical"):
        print(line(f"{leg} leg alone", leg_only(leg, data, args.half)))
    for label, cfg in configs().items():
        print(line(label, evaluate(cfg, data, args.half)))
    if args.per_repo:
        print()
        print(score.side_by_side(evaluate(DEFAULT, data, args.half)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
