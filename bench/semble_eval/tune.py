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
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import score  # noqa: E402
import split as split_mod  # noqa: E402
import upstream  # noqa: E402

from gpubox.settings import Settings  # noqa: E402
from gpubox.tools.search import rank  # noqa: E402
from gpubox.tools.search.query import legs, rank_lists  # noqa: E402
from gpubox.tools.search.rank import DEFAULT, RankConfig, classify  # noqa: E402
from gpubox.tools.search.service import SearchService  # noqa: E402
from gpubox.tools.search.store import IndexStore  # noqa: E402

STATE = HERE / "state"
Data = list[tuple[str, dict[str, Any], IndexStore, dict[str, list[tuple[int, float]]]]]


def configs() -> dict[str, RankConfig]:
    """The default, each rule switched off, and the variants being tuned."""
    out: dict[str, RankConfig] = {
        "**default**": DEFAULT,
        "fusion only (no rules)": replace(
            DEFAULT, definition=0, name_match=0, stem=0, coherence=0, mention=1, path_penalty=1, dedupe=False
        ),
        "- definition boost": replace(DEFAULT, definition=0),
        "- file-stem match": replace(DEFAULT, stem=0),
        "- file coherence": replace(DEFAULT, coherence=0),
        "- mention penalty": replace(DEFAULT, mention=1),
        "- path penalty": replace(DEFAULT, path_penalty=1),
        "- overlap de-dup": replace(DEFAULT, dedupe=False),
    }
    for sat in (0.5, 0.7):
        out[f"file saturation x{sat}"] = replace(DEFAULT, saturation=sat)
    for pr in (0.3, 0.6):
        out[f"prose x{pr}"] = replace(DEFAULT, prose=pr)
        out[f"prose x{pr} + saturation x0.5"] = replace(DEFAULT, prose=pr, saturation=0.5)
    for pp in (0.5, 0.7):
        out[f"path penalty x{pp}"] = replace(DEFAULT, path_penalty=pp)
    for v in (1.0, 1.6, 2.0):
        out[f"nl vector x{v}"] = replace(DEFAULT, weights=_weights(nl={"vector": v}))
    for c in (0.0, 0.4):
        out[f"coherence {c}"] = replace(DEFAULT, coherence=c)
    return out


# semble's path patterns at 8d737ab (src/semble/ranking/penalties.py, MIT): test files named per language (not
# test_* in any language), test dirs without benchmarks/testdata, examples without docs/demos/samples
SEMBLE_TEST_FILE = re.compile(
    r"(?:^|/)(?:test_[^/]*\.py|[^/]*_test\.py|[^/]*_test\.go|[^/]*Tests?\.java|[^/]*Test\.php|[^/]*_spec\.rb"
    r"|[^/]*_test\.rb|[^/]*\.test\.[jt]sx?|[^/]*\.spec\.[jt]sx?|[^/]*Tests?\.kt|[^/]*Spec\.kt|[^/]*Tests?\.swift"
    r"|[^/]*Spec\.swift|[^/]*Tests?\.cs|test_[^/]*\.cpp|[^/]*_test\.cpp|test_[^/]*\.c|[^/]*_test\.c"
    r"|[^/]*Spec\.scala|[^/]*Suite\.scala|[^/]*Test\.scala|[^/]*_spec\.lua|[^/]*_test\.lua|test_[^/]*\.lua"
    r"|test_helpers?[^/]*\.\w+)$"
)
SEMBLE_TEST_DIR = re.compile(r"(?:^|/)(?:tests?|__tests__|spec|testing)/")
SEMBLE_EXAMPLE_DIR = re.compile(r"(?:^|/)(?:_?examples?|docs?_src|compat|_compat|legacy)/")


@contextmanager
def semble_paths() -> Iterator[None]:
    """rank.path_penalty with semble's patterns while inside."""
    saved = (rank._TEST_FILE, rank._TEST_DIR, rank._EXAMPLE_DIR)
    rank._TEST_FILE, rank._TEST_DIR, rank._EXAMPLE_DIR = SEMBLE_TEST_FILE, SEMBLE_TEST_DIR, SEMBLE_EXAMPLE_DIR
    rank.path_penalty.cache_clear()
    try:
        yield
    finally:
        rank._TEST_FILE, rank._TEST_DIR, rank._EXAMPLE_DIR = saved
        rank.path_penalty.cache_clear()


def _weights(**per_kind: dict[str, float]) -> dict[str, dict[str, float]]:
    w = {k: dict(v) for k, v in DEFAULT.weights.items()}
    for kind, changes in per_kind.items():
        w[kind].update(changes)
    return w


def extra() -> dict[str, RankConfig]:
    """Variants run with semble's path patterns."""
    return {
        "semble paths + saturation x0.5": replace(DEFAULT, saturation=0.5),
        "semble paths + saturation x0.5 + prose x0.3": replace(DEFAULT, saturation=0.5, prose=0.3),
    }


def collect(half: str, cache: Path) -> Data:
    """Every leg's candidates for every annotated query of the half's indexed repositories (cached)."""
    repos = [r for r in split_mod.repos_in(half) if (STATE / "search" / r / "index.sqlite").is_file()]
    saved: dict[str, Any] = json.loads(cache.read_text()) if cache.is_file() else {}
    svc: SearchService | None = None
    out: Data = []
    for repo in repos:
        store = IndexStore(STATE / "search" / repo)
        for i, item in enumerate(upstream.load_annotations(repo)):
            key = f"{repo}#{i}"
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
    with semble_paths():
        for label, cfg in {"semble's path patterns": DEFAULT, **extra()}.items():
            print(line(label, evaluate(cfg, data, args.half)))
    if args.per_repo:
        print()
        print(score.side_by_side(evaluate(DEFAULT, data, args.half)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
