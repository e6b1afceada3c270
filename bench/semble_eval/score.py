"""semble's benchmark scoring, ported to score any search engine's ranked hits (issue #22).

A port of MinishLab/semble's benchmarks/data.py + benchmarks/metrics.py + the per-query loop of
benchmarks/run_benchmark.py at upstream.SEMBLE_COMMIT, function for function (upstream names in the comments); the
README's "Scoring" section states the few places where feeding gpubox's hits differs from semble's own run.

    score_query(hits, annotation)  ->  {"ndcg10", "ndcg5", "ranks", "relevant_ranks", "n_relevant", "category"}
    aggregate(rows, half="report") ->  per repository, per language, per category, mean over repositories

`hits` is the engine's ranked list of (path, start_line, end_line), 1-based inclusive lines, the path relative to
the folder that was indexed (corpora/<repo>/<folder>), which is how semble's chunks name their files. Only the first
TOP_K count, as semble asks its index for top_k=10.

    .venv/bin/python bench/semble_eval/score.py HITS.jsonl [--half report|tune|all]

reads one JSON object a line, {"repo": ..., "index": <position of the query in annotations/<repo>.json>,
"hits": [[path, start, end], ...]} (optionally "mode" to score several modes side by side), and prints the
per-repository table beside semble's published numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import split as split_mod
import upstream

TOP_K = 10  # run_benchmark._DIRECT_TOP_K
CATEGORIES = ("architecture", "semantic", "symbol")
Hit = tuple[str, int, int]


@dataclass(frozen=True)
class Target:
    """data.Target: a file, optionally narrowed to an inclusive 1-based line span."""

    path: str
    start_line: int | None = None
    end_line: int | None = None

    @property
    def has_span(self) -> bool:
        return self.start_line is not None and self.end_line is not None


@dataclass(frozen=True)
class Query:
    """data.Task for one annotation item (plus its position in the file, since query texts repeat)."""

    repo: str
    index: int
    query: str
    relevant: tuple[Target, ...]
    secondary: tuple[Target, ...]
    category: str
    language: str = ""

    @property
    def all_relevant(self) -> tuple[Target, ...]:
        # data.Task.all_relevant: primary and secondary targets weigh the same
        return self.relevant + self.secondary


def infer_category(query: str) -> str:
    """data.infer_category: used only for items without a "category" (none at SEMBLE_COMMIT)."""
    if " " not in query.strip():
        return "symbol"
    lowered = query.lower()
    if lowered.startswith("how ") or lowered.startswith("how does") or lowered.startswith("how are"):
        return "architecture"
    return "semantic"


def parse_target(raw: str | Mapping[str, Any]) -> Target:
    """data._parse_target: a bare path, or {"path", "start_line"?, "end_line"?} (ints or numeric strings)."""
    if isinstance(raw, str):
        return Target(path=raw)
    if not isinstance(raw, Mapping):
        raise TypeError(f"expected a path or a mapping, got {type(raw).__name__}")
    start, end = raw.get("start_line"), raw.get("end_line")
    return Target(
        path=str(raw["path"]),
        start_line=int(start) if start is not None else None,
        end_line=int(end) if end is not None else None,
    )


def parse_query(item: Mapping[str, Any], repo: str = "", index: int = 0, language: str = "") -> Query:
    """One annotation item as data.load_tasks reads it (an item's own "repo" wins over the file's name)."""
    category = item.get("category")
    return Query(
        repo=str(item.get("repo", repo)),
        index=index,
        query=str(item["query"]),
        relevant=tuple(parse_target(t) for t in item.get("relevant", [])),
        secondary=tuple(parse_target(t) for t in item.get("secondary", [])),
        category=category if isinstance(category, str) else infer_category(str(item["query"])),
        language=language,
    )


def load_queries(repo: str, *, mirror: Path | None = None) -> list[Query]:
    """Every query of benchmarks/annotations/<repo>.json at SEMBLE_COMMIT, in file order."""
    language = upstream.load_repos(mirror=mirror)[repo]["language"]
    items = upstream.load_annotations(repo, mirror=mirror)
    return [parse_query(item, repo, i, language) for i, item in enumerate(items)]


def path_matches(file_path: str, target_path: str) -> bool:
    """data.path_matches: equal, or either path a suffix of the other at a '/' boundary.

    Annotations name files from the repository root (src/flask/app.py) while hits name them from the indexed folder
    (app.py), so the target-ends-with-hit direction is the one that usually matches.
    """
    hit = file_path.replace("\\", "/")
    target = target_path.replace("\\", "/")
    return hit == target or hit.endswith(f"/{target}") or target.endswith(f"/{hit}")


def target_matches_location(file_path: str, start_line: int, end_line: int, target: Target) -> bool:
    """data.target_matches_location: the file matches and, when the target has a span, the lines overlap."""
    if not path_matches(file_path, target.path):
        return False
    if not target.has_span:
        return True
    assert target.start_line is not None and target.end_line is not None
    return not (end_line < target.start_line or start_line > target.end_line)


def target_rank(hits: Sequence[Hit], target: Target) -> int | None:
    """metrics.target_rank: 1-based rank of the first hit covering the target, or None."""
    for rank, (path, start, end) in enumerate(hits, 1):
        if target_matches_location(path, start, end, target):
            return rank
    return None


def dcg(relevances: Sequence[int]) -> float:
    """metrics.dcg."""
    return sum(rel / math.log2(i + 2) for i, rel in enumerate(relevances))


def ndcg_at_k(relevant_ranks: Sequence[int], n_relevant: int, k: int) -> float:
    """metrics.ndcg_at_k: binary gains at the ranks where some target was first found (two targets first found at the
    same rank count once), ideal = min(k, n_relevant) gains at the top."""
    if n_relevant == 0:
        return 0.0
    relevances = [0] * k
    for rank in relevant_ranks:
        if 1 <= rank <= k:
            relevances[rank - 1] = 1
    ideal = dcg([1] * min(k, n_relevant))
    return dcg(relevances) / ideal if ideal > 0 else 0.0


def score_query(hits: Iterable[Sequence[Any]], query_annotation: Query | Mapping[str, Any]) -> dict[str, Any]:
    """One query scored as run_benchmark._evaluate scores it.

    hits: ranked (path, start_line, end_line); only the first TOP_K are looked at. query_annotation: a Query or a raw
    annotation item. n_relevant is the number of targets (relevant + secondary), whether or not the index holds them,
    as in run_benchmark._evaluate at SEMBLE_COMMIT (the older bench_hybrid.py counted only indexed targets).
    """
    query = query_annotation if isinstance(query_annotation, Query) else parse_query(query_annotation)
    top = [(str(h[0]), int(h[1]), int(h[2])) for h in list(hits)[:TOP_K]]
    ranks = [target_rank(top, t) for t in query.all_relevant]
    relevant_ranks = [r for r in ranks if r is not None]
    n_relevant = len(query.all_relevant)
    return {
        "ndcg10": ndcg_at_k(relevant_ranks, n_relevant, TOP_K),
        "ndcg5": ndcg_at_k(relevant_ranks, n_relevant, 5),
        "ranks": ranks,
        "relevant_ranks": relevant_ranks,
        "n_relevant": n_relevant,
        "category": query.category,
    }


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def aggregate(
    rows: Iterable[Mapping[str, Any]],
    half: str | None = None,
    split_path: Path = split_mod.SPLIT,
) -> dict[str, Any]:
    """Per repository, language and category, as run_benchmark._bench_quality / _save_results aggregate.

    rows: one per scored query, each with "repo", "category", "ndcg10" (and "ndcg5"), e.g. score_query's dict plus
    "repo". half: 'tune', 'report', 'all' (every repo in split.json) or None (whatever repos the rows hold). A
    repository's NDCG@10 is the mean over its queries, its per-category value the mean over its queries of that
    category; the summary is the mean over repositories, a category's summary the mean over the repositories that
    have queries of it (that is semble's "mean over all repos"; its printed 'Avg' column, a mean of language means,
    is not what it saves or publishes).
    """
    split = split_mod.load(split_path) if split_path.exists() else {}
    wanted = None if half is None else set(split_mod.repos_in(half, split_path))
    per_repo: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        if wanted is None or row["repo"] in wanted:
            per_repo[row["repo"]].append(row)
    repos: dict[str, dict[str, Any]] = {}
    for repo, items in sorted(per_repo.items()):
        by_cat: dict[str, list[float]] = defaultdict(list)
        for r in items:
            by_cat[r["category"]].append(r["ndcg10"])
        repos[repo] = {
            "language": split.get(repo, {}).get("language", items[0].get("language", "")),
            "half": split.get(repo, {}).get("half"),
            "queries": len(items),
            "ndcg10": _mean([r["ndcg10"] for r in items]),
            "ndcg5": _mean([r.get("ndcg5", float("nan")) for r in items]),
            "by_category": {c: _mean(v) for c, v in sorted(by_cat.items())},
        }
    return {
        "half": half,
        "repos": repos,
        "missing": sorted(wanted - set(repos)) if wanted is not None else [],
        "summary": summarize(repos),
        "by_language": {
            lang: {"repos": len(v), "ndcg10": _mean([r["ndcg10"] for r in v])}
            for lang, v in sorted(_group(repos.values(), "language").items())
        },
    }


def _group(items: Iterable[Mapping[str, Any]], key: str) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for item in items:
        out[item[key]].append(item)
    return out


def summarize(repos: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """run_benchmark._save_results' summary over the given per-repository results."""
    cats = sorted({c for r in repos.values() for c in r["by_category"]})
    return {
        "repos": len(repos),
        "queries": sum(r.get("queries", 0) for r in repos.values()),
        "ndcg10": _mean([r["ndcg10"] for r in repos.values()]),
        "by_category": {c: _mean([r["by_category"][c] for r in repos.values() if c in r["by_category"]]) for c in cats},
    }


def _published() -> dict[str, Any]:
    return json.loads(upstream.PUBLISHED.read_text())


def semble_published(repo: str, leg: str = "hybrid") -> dict[str, Any]:
    """semble's published result for one repository: {"ndcg10", "by_category", ...}; leg 'hybrid' (its default
    search), 'bm25' or 'semantic' (its ablation runs). From semble_published.json (source path and commit inside)."""
    entry = _published()["repos"][repo]
    if leg == "hybrid":
        return entry
    if leg not in entry:
        raise KeyError(f"semble published no {leg!r} run for {repo} (its ablation file predates that repository)")
    return {"language": entry["language"], **entry[leg]}


def semble_published_summary(repos: Iterable[str], leg: str = "hybrid") -> dict[str, Any]:
    """semble's published numbers re-aggregated over a subset (a half) the way aggregate() does ours; repositories
    with no published run for that leg are left out and named under "missing"."""
    published, missing = {}, []
    for repo in repos:
        try:
            published[repo] = semble_published(repo, leg)
        except KeyError:
            missing.append(repo)
    return {**summarize(published), "missing": missing}


def side_by_side(ours: Mapping[str, Any], label: str = "gpubox") -> str:
    """Markdown: per repository and overall, our NDCG@10 beside semble's published one, on the same repositories."""
    repos = ours["repos"]
    theirs = {r: semble_published(r) for r in repos}
    lines = [f"| repo | language | queries | {label} | semble | delta |", "|---|---|---|---|---|---|"]
    for repo, r in repos.items():
        s = theirs[repo]["ndcg10"]
        lines.append(
            f"| {repo} | {r['language']} | {r['queries']} | {r['ndcg10']:.3f} | {s:.3f} | {r['ndcg10'] - s:+.3f} |"
        )
    mine, pub = ours["summary"], summarize(theirs)
    lines.append(
        f"| **mean over {mine['repos']} repos** | | {mine['queries']} | {mine['ndcg10']:.3f} | {pub['ndcg10']:.3f} "
        f"| {mine['ndcg10'] - pub['ndcg10']:+.3f} |"
    )
    for cat in CATEGORIES:
        if cat in mine["by_category"] and cat in pub["by_category"]:
            a, b = mine["by_category"][cat], pub["by_category"][cat]
            lines.append(f"| {cat} | | | {a:.3f} | {b:.3f} | {a - b:+.3f} |")
    if ours.get("missing"):
        lines.append(f"\nNot scored (no rows): {', '.join(ours['missing'])}")
    return "\n".join(lines)


def score_hits_file(path: Path, half: str | None) -> dict[str, dict[str, Any]]:
    """Score a JSONL of {"repo", "index", "hits", "mode"?}; returns mode -> aggregate()."""
    queries: dict[str, list[Query]] = {}
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        repo = rec["repo"]
        if repo not in queries:
            queries[repo] = load_queries(repo)
        query = queries[repo][int(rec["index"])]
        rows[rec.get("mode", "default")].append({"repo": repo, **score_query(rec["hits"], query)})
    return {mode: aggregate(r, half) for mode, r in rows.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hits", type=Path, help="JSONL: repo, index, hits[, mode]")
    ap.add_argument("--half", choices=("tune", "report", "all"), default=None)
    args = ap.parse_args(argv)
    for mode, result in score_hits_file(args.hits, args.half).items():
        print(f"## {mode} ({args.half or 'repos in the file'})\n")
        print(side_by_side(result, label=mode))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
