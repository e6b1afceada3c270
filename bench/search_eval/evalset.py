"""The labelled query set: loading and validating queries/*.jsonl, hit matching and retrieval metrics."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUERIES = HERE / "queries"
KINDS = ("nl", "identifier", "conceptual")
SPLITS = ("dev", "test")
CUTOFFS = (1, 5, 10)


class EvalSetError(Exception):
    """A query line that does not follow the format in README.md."""


@dataclass(frozen=True)
class Target:
    path: str
    start: int
    end: int


@dataclass(frozen=True)
class Query:
    id: str
    corpus: str
    kind: str
    query: str
    targets: tuple[Target, ...]
    split: str
    note: str = ""


def parse_query(line: str, where: str) -> Query:
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as e:
        raise EvalSetError(f"{where}: not JSON ({e})") from e
    missing = {"id", "corpus", "kind", "query", "targets", "split"} - set(raw)
    if missing:
        raise EvalSetError(f"{where}: missing {sorted(missing)}")
    if raw["kind"] not in KINDS:
        raise EvalSetError(f"{where}: kind must be one of {KINDS}, got {raw['kind']!r}")
    if raw["split"] not in SPLITS:
        raise EvalSetError(f"{where}: split must be one of {SPLITS}, got {raw['split']!r}")
    if not isinstance(raw["query"], str) or not raw["query"].strip():
        raise EvalSetError(f"{where}: empty query")
    targets = []
    for t in raw["targets"] or []:
        path, start, end = t.get("path"), t.get("start"), t.get("end")
        if not isinstance(path, str) or path.startswith("/") or ".." in path.split("/"):
            raise EvalSetError(f"{where}: target path must be relative to the corpus root, got {path!r}")
        if not (isinstance(start, int) and isinstance(end, int) and 1 <= start <= end):
            raise EvalSetError(f"{where}: target lines must be 1-based with start <= end, got {start}-{end}")
        targets.append(Target(path, start, end))
    if not targets:
        raise EvalSetError(f"{where}: no targets")
    return Query(raw["id"], raw["corpus"], raw["kind"], raw["query"], tuple(targets), raw["split"], raw.get("note", ""))


def load_queries(corpus: str, queries_dir: Path = QUERIES) -> list[Query]:
    path = queries_dir / f"{corpus}.jsonl"
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            q = parse_query(line, f"{path.name}:{n}")
            if q.corpus != corpus:
                raise EvalSetError(f"{path.name}:{n}: corpus {q.corpus!r} in the file for {corpus!r}")
            out.append(q)
    ids = [q.id for q in out]
    if len(ids) != len(set(ids)):
        raise EvalSetError(f"{path.name}: duplicate ids {sorted({i for i in ids if ids.count(i) > 1})}")
    return out


def select(queries: Iterable[Query], split: str) -> list[Query]:
    return [q for q in queries if split == "all" or q.split == split]


def is_hit(path: str, start: int, end: int, targets: Sequence[Target]) -> bool:
    """Right file and an overlapping line span."""
    return any(t.path == path and start <= t.end and end >= t.start for t in targets)


def first_rank(hits: Sequence[tuple[str, int, int]], targets: Sequence[Target]) -> int | None:
    """1-based rank of the first hit on any target, or None when none of the hits is one."""
    for rank, (path, start, end) in enumerate(hits, 1):
        if is_hit(path, start, end, targets):
            return rank
    return None


def metrics(ranks: Sequence[int | None]) -> dict[str, float]:
    """recall@k (share of queries with a hit in the top k) and MRR@10 over one group of queries."""
    n = len(ranks)
    if not n:
        return {}
    out = {f"recall@{k}": sum(1 for r in ranks if r is not None and r <= k) / n for k in CUTOFFS}
    out["mrr@10"] = sum(1 / r for r in ranks if r is not None and r <= 10) / n
    return out
