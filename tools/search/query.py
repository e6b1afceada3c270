"""Hybrid retrieval: vector (FAISS) + lexical (FTS5 BM25) + symbol-definition legs, fused and ranked by rank.py."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gpubox.tools.search import vectors
from gpubox.tools.search.rank import DEFAULT, STOPWORDS, QueryProfile, RankConfig, classify, fuse, rerank
from gpubox.tools.search.store import IndexStore, split_identifiers

WORD = re.compile(r"[A-Za-z0-9_]+")


@dataclass
class Ranked:
    id: int
    score: float
    sources: list[str]


def _fts_query(text: str, drop_stopwords: bool = True) -> str:
    words = {w.lower() for w in WORD.findall(text)} | set(split_identifiers(text).split())
    # English glue words match nearly every chunk: they only add noise to BM25's OR query
    words = {w for w in words if len(w) > 1 and not (drop_stopwords and w in STOPWORDS)}
    return " OR ".join(f'"{w}"' for w in sorted(words))


def _allowed(store: IndexStore, path_glob: str | None, language: str | None) -> list[int] | None:
    if not path_glob and not language:
        return None
    rows = store.connect().execute("SELECT id, path, language FROM chunks").fetchall()
    return [
        i
        for i, p, lang in rows
        if (not language or lang == language) and (not path_glob or fnmatch.fnmatch(p, path_glob))
    ]


def lexical(
    store: IndexStore, text: str, n: int, allowed: set[int] | None, drop_stopwords: bool = True
) -> list[tuple[int, float]]:
    q = _fts_query(text, drop_stopwords) or _fts_query(text, False)
    if not q:
        return []
    # weights: symbol name, path, body, split identifiers
    rows = (
        store.connect()
        .execute(
            "SELECT rowid, bm25(chunks_fts, 10.0, 2.0, 1.0, 2.0) AS s FROM chunks_fts WHERE chunks_fts MATCH ? "
            "ORDER BY s LIMIT ?",
            (q, n * 4 if allowed is not None else n),
        )
        .fetchall()
    )
    return [(i, -s) for i, s in rows if allowed is None or i in allowed][:n]


def symbols(store: IndexStore, identifiers: tuple[str, ...], allowed: set[int] | None) -> list[int]:
    """Chunks that define an identifier the query names (rank.classify decides which tokens are identifiers, so
    English words never reach here). Exact case first, then any case (parseArgs finds parse_args' cousin
    ParseArgs); a dotted name (Class.method, pkg::fn) is looked up by its last part."""
    db = store.connect()
    out: list[int] = []
    for ident in identifiers:
        name = re.split(r"\.|::|->", ident)[-1]
        if len(name) < 3:
            continue
        rows = db.execute(
            "SELECT id FROM chunks WHERE symbol = ? COLLATE NOCASE ORDER BY symbol = ? DESC",
            (name, name),
        ).fetchall()
        out.extend(r[0] for r in rows if allowed is None or r[0] in allowed)
    return list(dict.fromkeys(out))


def phrase(store: IndexStore, text: str, n: int, allowed: set[int] | None) -> list[tuple[int, float]]:
    """Chunks whose text holds the query's words in order: a quoted error message, prompt or log line."""
    words = [w.lower() for w in WORD.findall(text)]
    if len(words) < 3:
        return []
    q = 'text : "' + " ".join(words) + '"'
    rows = (
        store.connect()
        .execute(
            "SELECT rowid, bm25(chunks_fts) AS s FROM chunks_fts WHERE chunks_fts MATCH ? ORDER BY s LIMIT ?",
            (q, n * 4 if allowed is not None else n),
        )
        .fetchall()
    )
    return [(i, -s) for i, s in rows if allowed is None or i in allowed][:n]


_LEXICAL_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gpubox-lexical")


def legs(
    store: IndexStore,
    index: Any,
    embed: Callable[[], Any] | None,
    text: str,
    mode: str,
    n: int,
    allowed_list: list[int] | None,
    profile: QueryProfile,
) -> dict[str, list[tuple[int, float]]]:
    """Each leg's ranked (chunk id, score) list. `embed` computes the query vector; it runs while SQLite answers
    the lexical side on another thread (torch, FAISS and SQLite all release the GIL, so the legs overlap)."""
    allowed = set(allowed_list) if allowed_list is not None else None

    def lexical_side() -> dict[str, list[tuple[int, float]]]:
        out: dict[str, list[tuple[int, float]]] = {}
        if mode in ("hybrid", "lexical"):
            out["lexical"] = lexical(store, text, n, allowed)
        if mode == "hybrid":
            out["phrase"] = phrase(store, text, n, allowed)
        if mode == "hybrid" and profile.identifiers:
            out["symbol"] = [(i, 1.0) for i in symbols(store, profile.identifiers, allowed)][:n]
        return out

    pending = _LEXICAL_POOL.submit(lexical_side) if mode != "vector" else None
    lists: dict[str, list[tuple[int, float]]] = {}
    if mode in ("hybrid", "vector") and embed is not None:
        lists["vector"] = vectors.search(index, embed(), n, allowed_list)
    if pending is not None:
        lists.update(pending.result())
    return lists


def hybrid(
    store: IndexStore,
    index: Any,
    embed: Callable[[], Any] | None,
    text: str,
    mode: str,
    n: int,
    path_glob: str | None,
    language: str | None,
    cfg: RankConfig = DEFAULT,
) -> list[Ranked]:
    """vector / lexical: that leg's ranking as is. hybrid: the legs fused with weights chosen by what the query
    looks like, then the ranking stage (rank.rerank) over the fused candidates."""
    profile = classify(text)
    lists = legs(store, index, embed, text, mode, n, _allowed(store, path_glob, language), profile)
    if mode != "hybrid":
        only = lists.get(mode, [])
        return [Ranked(i, s, [mode]) for i, s in only]
    return rank_lists(store, lists, profile, cfg)


def rank_lists(
    store: IndexStore, lists: dict[str, list[tuple[int, float]]], profile: QueryProfile, cfg: RankConfig = DEFAULT
) -> list[Ranked]:
    fused = fuse(lists, profile, cfg)
    rows = store.chunks([s.id for s in fused])
    return [Ranked(s.id, s.score, s.sources) for s in rerank(fused, rows, profile, cfg)]


def snippet(text: str, query: str, budget: int) -> tuple[str, bool]:
    """The chunk, or a window of it around the first line matching a query word, within `budget` characters."""
    if len(text) <= budget:
        return text, False
    lines = text.splitlines()
    words = [w.lower() for w in WORD.findall(query) if len(w) > 2]
    start = next((i for i, line in enumerate(lines) if any(w in line.lower() for w in words)), 0)
    start = max(0, start - 2)
    out: list[str] = []
    used = 0
    for line in lines[start:]:
        if used + len(line) + 1 > budget:
            break
        out.append(line)
        used += len(line) + 1
    return "\n".join(out), True
