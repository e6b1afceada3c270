"""Hybrid retrieval: vector (FAISS) + lexical (FTS5 BM25) + exact symbol matches, fused by reciprocal rank."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gpubox.tools.search import vectors
from gpubox.tools.search.store import IDENT, IndexStore, split_identifiers

RRF_K = 60
WORD = re.compile(r"[A-Za-z0-9_]+")


@dataclass
class Ranked:
    id: int
    score: float
    sources: list[str]


def _fts_query(text: str) -> str:
    words = {w.lower() for w in WORD.findall(text)} | set(split_identifiers(text).split())
    words = {w for w in words if len(w) > 1}
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


def lexical(store: IndexStore, text: str, n: int, allowed: set[int] | None) -> list[tuple[int, float]]:
    q = _fts_query(text)
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


def symbols(store: IndexStore, text: str, allowed: set[int] | None) -> list[int]:
    """Chunks that define an identifier named in the query (definitions beat mentions). Plain words match only
    with their exact case, so 'token' in a sentence does not pull in a type named Token."""
    idents = [w for w in IDENT.findall(text) if len(w) > 2]
    if not idents:
        return []
    db = store.connect()
    out: list[int] = []
    for ident in idents:
        code_like = "_" in ident or any(c.isupper() for c in ident[1:]) or any(c.isdigit() for c in ident)
        sql = "SELECT id FROM chunks WHERE symbol = ?"
        if code_like:
            sql += " OR lower(symbol) = lower(?)"
        rows = db.execute(
            sql + " ORDER BY symbol = ? DESC", (ident, ident, ident) if code_like else (ident, ident)
        ).fetchall()
        out.extend(r[0] for r in rows if allowed is None or r[0] in allowed)
    return list(dict.fromkeys(out))


_LEXICAL_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gpubox-lexical")


def hybrid(
    store: IndexStore,
    index: Any,
    embed: Callable[[], Any] | None,
    text: str,
    mode: str,
    n: int,
    path_glob: str | None,
    language: str | None,
) -> list[Ranked]:
    """`embed` computes the query vector; it runs while SQLite answers the lexical side on another thread
    (torch, FAISS and SQLite all release the GIL, so the two legs overlap on two cores)."""
    allowed_list = _allowed(store, path_glob, language)
    allowed = set(allowed_list) if allowed_list is not None else None

    def lexical_side() -> dict[str, list[tuple[int, float]]]:
        out: dict[str, list[tuple[int, float]]] = {}
        if mode in ("hybrid", "lexical"):
            out["lexical"] = lexical(store, text, n, allowed)
        if mode == "hybrid":
            out["symbol"] = [(i, 1.0) for i in symbols(store, text, allowed)][:n]
        return out

    pending = _LEXICAL_POOL.submit(lexical_side) if mode != "vector" else None
    lists: dict[str, list[tuple[int, float]]] = {}
    if mode in ("hybrid", "vector") and embed is not None:
        lists["vector"] = vectors.search(index, embed(), n, allowed_list)
    if pending is not None:
        lists.update(pending.result())
    if mode != "hybrid":
        (only,) = lists.values()
        return [Ranked(i, s, [mode]) for i, s in only]
    fused: dict[int, Ranked] = {}
    for source, items in lists.items():
        weight = 2.0 if source == "symbol" else 1.0  # a definition of a named identifier is the best answer
        for rank, (i, _) in enumerate(items):
            r = fused.setdefault(i, Ranked(i, 0.0, []))
            r.score += weight / (RRF_K + rank + 1)
            r.sources.append(source)
    return sorted(fused.values(), key=lambda r: -r.score)


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
