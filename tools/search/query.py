"""Hybrid retrieval: vector (FAISS) + lexical (FTS5 BM25) + symbol-definition legs, fused and ranked by rank.py."""

from __future__ import annotations

import re
import sqlite3
import time
import unicodedata
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gpubox.tools.search import filters, vectors
from gpubox.tools.search.compounds import STOPWORDS
from gpubox.tools.search.paths import superseded_dirs
from gpubox.tools.search.query_kind import QueryProfile, classify
from gpubox.tools.search.rank import DEFAULT, RankConfig, fuse, rerank
from gpubox.tools.search.store import QUALIFIER, IndexStore, last_part, split_identifiers

WORD = re.compile(r"\w+")  # any script's letters: [A-Za-z0-9_] cut 'café' to 'caf' and dropped 'größe' whole
COMPOUND_KINDS = ("class", "struct", "interface", "type", "enum", "trait", "module", "impl")


@dataclass
class Ranked:
    id: int
    score: float
    sources: list[str]


# Rows the lexical leg scores with bm25() per query. FTS5 walks a posting list cheaply (~0.1 us a row) but
# evaluates bm25() at ~3 us a row (it reads each row's column sizes and hit positions), so at 100k chunks an OR
# of words such as "request" or "parse" (20% of the chunks each) cost 30-110 ms. 2,000 rows is ~6 ms.
LEXICAL_BUDGET = 5000


def lexical_budget(store: IndexStore) -> int:
    """Rows the lexical leg may score for one query (a function so an evaluation can scale it to a small corpus)."""
    return LEXICAL_BUDGET


def fold(word: str) -> str:
    """A word as FTS5's unicode61 tokenizer stores it, so the vocabulary lookups find it: lower case, and a Latin
    letter with one diacritic without it ('Größe' -> 'große'); other scripts, and 'ế' with two, keep theirs."""
    return "".join(_fold_char(c) for c in unicodedata.normalize("NFC", word))


def _fold_char(c: str) -> str:
    if c.isascii() or not unicodedata.name(c, "").startswith("LATIN"):
        return c.lower()
    parts = unicodedata.normalize("NFD", c)
    base = "".join(x for x in parts if not unicodedata.combining(x))
    return base.lower() if len(parts) - len(base) == 1 else c.lower()


def _fts_words(text: str, drop_stopwords: bool = True) -> list[str]:
    words = {fold(w) for w in WORD.findall(text)} | set(split_identifiers(text).split())
    # English glue words match nearly every chunk: they only add noise to BM25's OR query
    return sorted(w for w in words if len(w) > 1 and not (drop_stopwords and w in STOPWORDS))


def _fts_query(words: list[str]) -> str:
    return " OR ".join(f'"{w}"' for w in words)


def _doc_freq(db: sqlite3.Connection, word: str) -> int:
    """Chunks holding `word` (FTS5's vocabulary table: one b-tree lookup). unicode61 splits parse_args into two
    tokens, so a word with an underscore counts as its rarest part (an upper bound on the phrase's matches)."""
    parts = [p for p in word.split("_") if p]
    freqs = [
        (row[0] if (row := db.execute("SELECT doc FROM chunks_vocab WHERE term = ?", (p,)).fetchone()) else 0)
        for p in parts
    ]
    return min(freqs, default=0)


def plan_lexical(db: sqlite3.Connection, words: list[str], budget: int) -> tuple[list[str], int, list[str]]:
    """The query words to match, rarest first; how many rows they match at most; every word that matches any.

    Words that match nothing are left out (they change no score). The rarest word is always kept; each next one
    is added while the rows to score stay within `budget`, so a word that is very common next to a rare one is
    dropped: its BM25 weight (IDF) is the smallest of the query's, and it would multiply the rows scored."""
    freqs = {w: _doc_freq(db, w) for w in words}
    live = sorted((w for w in words if freqs[w] > 0), key=lambda w: (freqs[w], w))
    chosen: list[str] = []
    total = 0
    for w in live:
        if chosen and total + freqs[w] > budget:
            break
        chosen.append(w)
        total += freqs[w]
    return chosen, total, live


_BM25 = "bm25(chunks_fts, 10.0, 2.0, 1.0, 2.0)"  # weights: symbol name, path, body, split identifiers


def _matches(db: sqlite3.Connection, match: str, cap: int) -> int:
    """How many rows match, counted up to `cap` (a walk over the posting lists; nothing is scored)."""
    sql = "SELECT count(*) FROM (SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH ? LIMIT ?)"
    return int(db.execute(sql, (match, cap)).fetchone()[0])


def _bm25_rows(
    db: sqlite3.Connection, match: str, limit: int, budget: int, at_most: int | None = None
) -> tuple[list[tuple[int, float]], int]:
    """Best `limit` (rowid, score) among the first `budget` rows matching an FTS5 query (rowid order, i.e. indexing
    order: FTS5 finds the cut-off row by walking the posting lists), and how many rows were scored. `at_most`: a
    known bound on the matches (the document frequencies), which spares the count when it is within the budget."""
    scored = at_most if at_most is not None and at_most <= budget else _matches(db, match, budget + 1)
    if scored <= budget:
        sql = f"SELECT rowid, {_BM25} AS s FROM chunks_fts WHERE chunks_fts MATCH ? ORDER BY s LIMIT ?"
        return db.execute(sql, (match, limit)).fetchall(), scored
    bound = db.execute(
        "SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH ? ORDER BY rowid LIMIT 1 OFFSET ?", (match, budget)
    ).fetchone()[0]
    sql = f"SELECT rowid, {_BM25} AS s FROM chunks_fts WHERE chunks_fts MATCH ? AND rowid < ? ORDER BY s LIMIT ?"
    return db.execute(sql, (match, bound, limit)).fetchall(), budget


def lexical(
    store: IndexStore, text: str, n: int, allowed: set[int] | None, drop_stopwords: bool = True
) -> list[tuple[int, float]]:
    """BM25 over the FTS5 index, scoring at most `lexical_budget` rows per query (see LEXICAL_BUDGET).

    The rarest words that fit the budget are matched (all of them on a small index: plain BM25). When words were
    left out and fewer than the wanted rows came back, or every word is common ("request routing", "middleware"),
    the rest of the budget goes, in this order, to the chunks holding all the words (BM25 ranks those first), the
    chunks whose symbol or path holds a word (weighted 10x and 2x the body, so they lead a full ranking too), and
    the body."""
    db = store.connect()
    words = _fts_words(text, drop_stopwords) or _fts_words(text, False)
    left = lexical_budget(store)
    chosen, total, live = plan_lexical(db, words, left)
    if not chosen:
        return []
    limit = n * 4 if allowed is not None else n
    rows: list[tuple[int, float]] = []
    passes: list[str] = []
    if total <= left and len(chosen) == len(live):
        passes.append(_fts_query(chosen))
    elif total <= left:
        # the rows holding a rare word, scored on every word: FTS5 finds the rows by the AND (posting walks, no
        # scoring) and bm25() sums over all phrases, so the common words still count (the rare ones twice: bm25 has
        # no per-phrase weight); dropping them instead cost ~0.1 MRR in lexical mode on the dev split
        passes.append(f"({_fts_query(chosen)}) AND ({_fts_query(live)})")
    elif len(live) > 1:
        passes.append(" AND ".join(f'"{w}"' for w in live))
    if len(live) > len(chosen) or total > left:
        passes += ["{symbol path} : (" + _fts_query(live) + ")", _fts_query(live)]
    seen: set[int] = set()
    for k, match in enumerate(passes):
        if len(rows) >= limit or left <= 0:
            break
        # the first pass's matches are rows holding a chosen word: `total` bounds them
        got, scored = _bm25_rows(db, match, limit + len(seen), left, total if k == 0 and total <= left else None)
        left -= scored
        new = [r for r in got if r[0] not in seen]
        rows += new[: limit - len(rows)]
        seen.update(i for i, _ in new)
    return [(i, -s) for i, s in rows if allowed is None or i in allowed][:n]


WORD_ONLY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def symbols(store: IndexStore, identifiers: tuple[str, ...], allowed: set[int] | None) -> list[int]:
    """Chunks that define an identifier the query names (query_kind.classify decides which tokens are identifiers, so
    English words never reach here). Exact case first, then any case (parseArgs finds parse_args' cousin
    ParseArgs); a dotted name (Class.method, pkg::fn) is looked up by its last part."""
    db = store.connect()
    out: list[int] = []
    for ident in identifiers:
        name = last_part(ident)
        if len(name) < 3:
            continue
        rows = db.execute(
            "SELECT id FROM chunks WHERE symbol = ? COLLATE NOCASE ORDER BY symbol = ? DESC",
            (name, name),
        ).fetchall()
        out.extend(r[0] for r in rows if allowed is None or r[0] in allowed)
        out.extend(i for i in _qualified(db, name) if allowed is None or i in allowed)
    return list(dict.fromkeys(out))


def compounds(store: IndexStore, names: tuple[str, ...], n: int, allowed: set[int] | None) -> list[int]:
    """Types named by words the query spells apart (compounds.compound_names: 'JSON element' finds JsonElement, 'type
    adapter factories' TypeAdapterFactory): one indexed case-insensitive lookup per name, the more specific names
    first. Types only: with functions too ('ssh agent' -> a helper sshagent) semble's tune half gained less."""
    db = store.connect()
    out: list[int] = []
    kinds = ",".join("?" * len(COMPOUND_KINDS))
    for name in names:
        rows = db.execute(
            f"SELECT id FROM chunks WHERE symbol = ? COLLATE NOCASE AND kind IN ({kinds})", (name, *COMPOUND_KINDS)
        ).fetchall()
        out.extend(r[0] for r in rows if allowed is None or r[0] in allowed)
        if len(out) >= n:
            break
    return list(dict.fromkeys(out))[:n]


def _qualified(db: Any, name: str) -> list[int]:
    """Chunks whose symbol is a qualified name ending in `name` (Elixir's `defmodule Ecto.Query`, `Foo::Bar`):
    found through the FTS symbol column (its tokenizer splits on the dots), exact case first."""
    if not WORD_ONLY.fullmatch(name):
        return []
    rows = db.execute(
        "SELECT rowid, symbol FROM chunks_fts WHERE chunks_fts MATCH ? LIMIT 200", (f'symbol : "{name}"',)
    ).fetchall()
    found = []
    for i, sym in rows:
        parts = re.split(QUALIFIER, sym or "")
        if len(parts) > 1 and parts[-1].lower() == name.lower():
            found.append((parts[-1] != name, i))  # exact case first
    return [i for _, i in sorted(found)]


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
        if mode == "hybrid" and profile.compounds:
            out["compound"] = [(i, 1.0) for i in compounds(store, profile.compounds, n, allowed)]
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
    lists = legs(store, index, embed, text, mode, n, filters.allowed(store, path_glob, language), profile)
    if mode != "hybrid":
        only = lists.get(mode, [])
        return [Ranked(i, s, [mode]) for i, s in only]
    return rank_lists(store, lists, profile, cfg)


def rank_lists(
    store: IndexStore, lists: dict[str, list[tuple[int, float]]], profile: QueryProfile, cfg: RankConfig = DEFAULT
) -> list[Ranked]:
    fused = fuse(lists, profile, cfg)
    rows = store.chunks([s.id for s in fused])
    older = superseded_of(store) if cfg.superseded < 1.0 else frozenset()
    return [Ranked(s.id, s.score, s.sources) for s in rerank(fused, rows, profile, cfg, older)]


_SUPERSEDED: dict[str, tuple[object, float, frozenset[str]]] = {}
# an index being built changes at every commit; its folders rarely do: read them again at most this often then
# (~0.2 s of Python per 100k files)
SUPERSEDED_REFRESH_S = 30.0


def superseded_of(store: IndexStore) -> frozenset[str]:
    """paths.superseded_dirs over the index's files, computed again once the index has changed (at most every
    SUPERSEDED_REFRESH_S). The cache is one dict whose values are replaced whole: threads at worst compute twice."""
    db = store.connect()
    row = db.execute("SELECT value FROM meta WHERE key = 'updated'").fetchone()
    stamp, now = (row[0] if row else None), time.monotonic()
    cached = _SUPERSEDED.get(str(store.dir))
    if cached is None or (cached[0] != stamp and now - cached[1] >= SUPERSEDED_REFRESH_S):
        cached = (stamp, now, superseded_dirs(p for (p,) in db.execute("SELECT path FROM files")))
        _SUPERSEDED[str(store.dir)] = cached
    return cached[2]


def snippet(text: str, query: str, budget: int) -> tuple[str, bool]:
    """The chunk, or a window of it around the first line matching a query word, within `budget` characters."""
    if len(text) <= budget:
        return text, False
    lines = text.split("\n")  # as the chunker cut it: a form feed inside a line is no line break
    words = [w.lower() for w in WORD.findall(query) if len(w) > 2]
    start = next((i for i, line in enumerate(lines) if any(w in line.lower() for w in words)), 0)
    match = start
    start = max(0, start - 2)
    out: list[str] = []
    used = 0
    for i, line in enumerate(lines[start:], start):
        if used + len(line) + 1 > budget:
            if not out and i < match:  # a context line too long to show: start at the match instead
                continue
            if i <= match and budget - used > 1:  # the match longer than what is left: its start, not nothing
                out.append(line[: budget - used - 1] + "…")
            break
        out.append(line)
        used += len(line) + 1
    return "\n".join(out), True
