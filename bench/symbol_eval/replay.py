"""Replay gpubox's ranking stage with variants on bench/symbol_eval's query sets (issue #22).

    .venv/bin/python bench/symbol_eval/replay.py [--set once,shared] [--corpora /tmp/cppcorp]

Needs the indexes run.py built ($SYMBOL_EVAL_STATE, default /tmp/symbol_eval_state). Each leg is queried once per
query through gpubox's own code (cached in the state dir), then fusion and the ranking rules are replayed for each
configuration of bench/semble_eval/tune.py's `configs()`, scored with the port of semble's scorer.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "semble_eval"))

from run import STATE  # noqa: E402
from score import parse_query, score_query  # noqa: E402
from tune import configs, index_stamp  # noqa: E402

from gpubox.settings import Settings  # noqa: E402
from gpubox.tools.search.query import legs, rank_lists  # noqa: E402
from gpubox.tools.search.query_kind import classify  # noqa: E402
from gpubox.tools.search.rank import RankConfig  # noqa: E402
from gpubox.tools.search.service import SearchService  # noqa: E402
from gpubox.tools.search.store import IndexStore  # noqa: E402

FOLDERS = {
    "once": "annotations",
    "shared": "annotations_shared",
    "prominent": "annotations_prominent",
    "dressed": "annotations",
    "undressed": "annotations",
}
GENERIC = (".java", ".cs", ".ts", ".kt", ".swift", ".scala", ".rs", ".h", ".hpp", ".cc", ".cpp")
PHP_NAMESPACE = re.compile(r"^namespace\s+([\w\\]+)\s*;", re.MULTILINE)


def dress(name: str, target: Path) -> str | None:
    """The once-set name as a developer may write it: a type with generic arguments (`Node<T>`) where the
    language has them, a PHP class with its namespace (`League\\Flysystem\\Filesystem`); None when neither fits."""
    if target.suffix == ".php":
        m = PHP_NAMESPACE.search(target.read_text(errors="replace"))
        return f"{m.group(1)}\\{name}" if m else None
    return f"{name}<T>" if target.suffix in GENERIC and name[:1].isupper() else None


def _items(qset: str, repo: str, corpora: Path) -> list[dict[str, Any]]:
    path = HERE / FOLDERS[qset] / f"{repo}.json"
    items = json.loads(path.read_text()) if path.is_file() else []
    if qset not in ("dressed", "undressed"):
        return items
    out = []
    for item in items:  # the once-set names that dress() can dress: as dressed, or as they are to compare
        dressed = dress(item["query"], corpora / repo / item["relevant"][0])
        if dressed:
            out.append({**item, "query": dressed} if qset == "dressed" else item)
    return out


Data = list[tuple[str, str, dict[str, Any], IndexStore, dict[str, list[tuple[int, float]]]]]


def collect(sets: list[str], corpora: Path) -> Data:
    cache = STATE / "legs_symbol_eval.json"
    saved: dict[str, Any] = json.loads(cache.read_text()) if cache.is_file() else {}
    svc: SearchService | None = None
    out: Data = []
    for repo in [r["name"] for r in json.loads((HERE / "sources.json").read_text())["repos"]]:
        name = repo.replace("+", "--")
        if not (STATE / "search" / name / "index.sqlite").is_file():
            continue
        store = IndexStore(STATE / "search" / name)
        stamp = index_stamp(store)
        for qset in sets:
            for i, item in enumerate(_items(qset, repo, corpora)):
                key = f"{repo}#{item['query']}@{stamp}"
                if key not in saved:
                    svc = svc or SearchService(Settings.load(state_dir=STATE, allowed_roots=[corpora]))
                    index = svc._faiss_index(name, store)  # the bench replays the service's own legs
                    vec = svc.embedder.encode_query(item["query"])
                    found = legs(
                        store, index, lambda v=vec: v, item["query"], "hybrid", 50, None, classify(item["query"])
                    )
                    saved[key] = {leg: [[c, float(s)] for c, s in items] for leg, items in found.items()}
                lists = {leg: [(int(c), float(s)) for c, s in v] for leg, v in saved[key].items()}
                out.append((qset, repo, {**item, "_index": i}, store, lists))
    cache.write_text(json.dumps(saved))
    return out


def evaluate(cfg: RankConfig, data: Data) -> dict[str, float]:
    per: dict[tuple[str, str], list[float]] = {}
    for qset, repo, item, store, lists in data:
        ranked = rank_lists(store, lists, classify(item["query"]), cfg)[:10]
        chunks = store.chunks([r.id for r in ranked])
        hits = [(chunks[r.id].path, chunks[r.id].start_line, chunks[r.id].end_line) for r in ranked if r.id in chunks]
        per.setdefault((qset, repo), []).append(score_query(hits, parse_query(item, repo, item["_index"]))["ndcg10"])
    means: dict[str, float] = {}
    for qset in sorted({q for q, _ in per}):
        repos = [sum(v) / len(v) for (q, _), v in per.items() if q == qset]
        means[qset] = sum(repos) / len(repos)
    return means


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--set", type=lambda s: s.split(","), default=["once", "shared", "prominent", "dressed", "undressed"]
    )
    ap.add_argument("--corpora", type=Path, default=Path("/tmp/cppcorp"))
    args = ap.parse_args()
    data = collect(args.set, args.corpora)
    print("| configuration | " + " | ".join(args.set) + " |\n|---|" + "---|" * len(args.set))
    for label, cfg in configs().items():
        m = evaluate(cfg, data)
        print(f"| {label} | " + " | ".join(f"{m.get(s, float('nan')):.3f}" for s in args.set) + " |")


if __name__ == "__main__":
    main()
