"""The lexical leg's bounded BM25 (tools/search/query.py): on a small index it is plain FTS5 BM25; when query words
are common it scores at most the budget's rows and still finds rare words, names and all-common queries.

Real chunks of tests/data/sample_repo in a real index store (SQLite FTS5); inventory/api.py is copied many times so
its words ("items", "db", "quantity") become common, as "request" is in a large web code base. No model is loaded."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpubox.tools.search import query
from gpubox.tools.search.chunker import chunk_text
from gpubox.tools.search.query import _BM25, _fts_query, _fts_words, lexical, plan_lexical
from gpubox.tools.search.store import IndexStore
from tests.conftest import DATA

REPO = DATA / "sample_repo"
UNIQUE = {"inventory/auth.py": "python", "inventory/retry.py": "python", "server/ratelimit.go": "go"}
COMMON, COPIES = "inventory/api.py", 60
BUDGET = 40  # rows scored per query in these tests: far fewer than the copies of api.py


def _chunks(path: str, lang: str, prefix: str = "") -> list[tuple[object, ...]]:
    text = (REPO / path).read_text()
    return [
        (prefix + path, c.start_line, c.end_line, c.symbol, c.kind, lang, c.text, f"{prefix}{path}:{c.start_line}",
         b"\0" * 16)
        for c in chunk_text(text, lang)
    ]  # fmt: skip


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IndexStore]:
    st = IndexStore(tmp_path_factory.mktemp("lexbudget") / "idx")
    rows: list[tuple[object, ...]] = []
    for i in range(COPIES):  # the common file first, so the rare chunks have the highest row ids
        rows += _chunks(COMMON, "python", f"copy{i:02d}/")
    for path, lang in UNIQUE.items():
        rows += _chunks(path, lang)
    with st.transaction() as db:
        st.insert_chunks(db, rows)
    yield st
    st.close()


@pytest.fixture
def small_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(query, "LEXICAL_BUDGET", BUDGET)


def _plain_bm25(st: IndexStore, text: str, n: int) -> list[int]:
    """The unbounded ranking the leg used before the budget: every matching row scored."""
    q = _fts_query(_fts_words(text) or _fts_words(text, False))
    sql = f"SELECT rowid, {_BM25} AS s FROM chunks_fts WHERE chunks_fts MATCH ? ORDER BY s, rowid LIMIT ?"
    return [i for i, _ in st.connect().execute(sql, (q, n)).fetchall()]


def _paths(st: IndexStore, ids: list[int]) -> list[str]:
    rows = st.chunks(ids)
    return [rows[i].path for i in ids]


@pytest.mark.parametrize("text", ["hash a password with a salt", "items quantity", "token bucket rate limiter"])
def test_within_the_budget_the_leg_is_plain_bm25(store: IndexStore, text: str) -> None:
    # the default budget (2,000 rows) covers this whole index: same rows, same order as scoring everything
    got = [i for i, _ in lexical(store, text, 10, None)]
    assert got
    want = _plain_bm25(store, text, 10)
    assert sorted(got) == sorted(want)


def test_document_frequencies_pick_the_rare_words(store: IndexStore) -> None:
    words = _fts_words("list items by hashed password")
    chosen, total, live = plan_lexical(store.connect(), words, BUDGET)
    assert "password" in chosen  # in auth.py only
    assert "items" not in chosen and "items" in live  # in every copy of api.py: over the budget
    assert total <= BUDGET


def test_a_rare_word_among_common_ones_is_found(store: IndexStore, small_budget: None) -> None:
    hits = lexical(store, "items quantity password", 10, None)
    assert _paths(store, [hits[0][0]]) == ["inventory/auth.py"]


def test_a_query_of_common_words_only_still_returns_results(store: IndexStore, small_budget: None) -> None:
    for text in ("items", "the items of a page", "the and of"):
        hits = lexical(store, text, 10, None)
        assert len(hits) == 10, text
        assert len({i for i, _ in hits}) == 10  # no row twice across the leg's passes


def test_a_common_word_finds_the_chunks_it_names_first(store: IndexStore, small_budget: None) -> None:
    # "delete item" is in every copy of api.py; the chunks defining delete_item lead (symbol column, weight 10)
    hits = lexical(store, "delete item", 5, None)
    assert hits  # `all` over no hits would pass
    rows = store.chunks([i for i, _ in hits])
    assert all(rows[i].symbol == "delete_item" for i, _ in hits)


def test_the_budget_bounds_the_rows_scored(store: IndexStore, small_budget: None) -> None:
    # bm25() runs inside FTS5, out of Python's reach: trace the statements the leg runs (bound values expanded) and
    # count, for each scoring statement, the rows its MATCH and row-id cut let through
    db = store.connect()
    seen: list[str] = []
    db.set_trace_callback(seen.append)
    try:
        lexical(store, "items", 10, None)
    finally:
        db.set_trace_callback(None)
    scoring = [s for s in seen if "bm25(" in s]
    assert scoring and all("rowid <" in s for s in scoring)  # every scoring pass was cut at a row id
    full = db.execute("SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH '\"items\"'").fetchone()[0]
    assert full > BUDGET * 3
    for s in scoring:
        bound = int(s.split("rowid < ")[1].split()[0])
        match = s.split("MATCH '")[1].split("' AND rowid")[0].replace("''", "'")
        n = db.execute("SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH ? AND rowid < ?", (match, bound))
        assert n.fetchone()[0] <= BUDGET


def test_words_absent_from_the_index_return_nothing(store: IndexStore, small_budget: None) -> None:
    assert lexical(store, "zyzzyva quuxotic", 10, None) == []


def test_the_path_filter_still_applies(store: IndexStore, small_budget: None) -> None:
    allowed = {i for i, r in store.chunks(list(range(1, 2000))).items() if r.path.startswith("copy07/")}
    assert allowed
    hits = lexical(store, "items", 10, allowed)
    assert hits  # `all` over no hits would pass
    assert all(i in allowed for i, _ in hits)
