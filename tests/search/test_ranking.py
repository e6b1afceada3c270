"""The ranking stage of hybrid search (tools/search/rank.py) on real chunks of tests/data/sample_repo: the query
classifier, the symbol and phrase legs, and each ranking rule. SQLite only: no embedding model is loaded."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpubox.tools.search.chunker import chunk_text, embedding_text
from gpubox.tools.search.query import hybrid, phrase, symbols
from gpubox.tools.search.query_kind import classify
from gpubox.tools.search.rank import DEFAULT, Scored, dedupe, defines, fuse, path_penalty, rerank, stem_share
from gpubox.tools.search.store import ChunkRow, IndexStore
from tests.conftest import DATA

REPO = DATA / "sample_repo"
FILES = {
    "inventory/cache.py": "python",
    "inventory/config.py": "python",
    "inventory/db.py": "python",
    "inventory/auth.py": "python",
    "inventory/api.py": "python",
    "inventory/retry.py": "python",
    "server/ratelimit.go": "go",
    "web/src/debounce.js": "javascript",
}


def _rows(path: str, first_id: int) -> list[ChunkRow]:
    text = (REPO / path).read_text()
    return [
        ChunkRow(first_id + n, path, c.start_line, c.end_line, c.symbol, c.kind, FILES[path], c.text)
        for n, c in enumerate(chunk_text(text, FILES[path]))
    ]


@pytest.fixture(scope="module")
def rows() -> dict[int, ChunkRow]:
    out: dict[int, ChunkRow] = {}
    for path in FILES:
        for r in _rows(path, len(out) + 1):
            out[r.id] = r
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, rows: dict[int, ChunkRow]) -> Iterator[IndexStore]:
    """The sample chunks in a real index store (FTS5 + symbols); vectors are zeros since no leg here reads them."""
    st = IndexStore(tmp_path_factory.mktemp("rank") / "idx")
    with st.transaction() as db:
        st.insert_chunks(
            db,
            [(r.path, r.start_line, r.end_line, r.symbol, r.kind, r.language, r.text, str(r.id), b"\0" * 16)
             for r in rows.values()],
        )  # fmt: skip
    yield st
    st.close()


def _by_symbol(rows: dict[int, ChunkRow], symbol: str) -> ChunkRow:
    return next(r for r in rows.values() if r.symbol == symbol)


# --- the query classifier -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query",
    [
        "what happens on a command error",
        "the option that sets the retry count",
        "Config error when the file is missing",
    ],
)
def test_english_words_are_not_identifiers(query: str) -> None:
    p = classify(query)
    assert p.kind == "nl"
    assert p.identifiers == ()


@pytest.mark.parametrize(
    ("query", "ident"),
    [
        ("where is retry_with_backoff used", "retry_with_backoff"),
        ("how does NewRateLimiter refill tokens", "NewRateLimiter"),
        ("call LRUCache.get() on a miss", "LRUCache.get"),
        ("what does `migrate` do", "migrate"),
    ],
)
def test_code_tokens_in_a_sentence_are_identifiers(query: str, ident: str) -> None:
    p = classify(query)
    assert p.kind == "mixed"
    assert p.identifiers == (ident,)


def test_a_one_word_query_is_a_name_lookup() -> None:
    assert classify("migrate").kind == "symbol"
    assert classify("  load_config() ").identifiers == ("load_config",)
    assert classify("debounce").identifiers == ("debounce",)


def test_content_words_drop_stopwords_and_split_camel_case() -> None:
    assert classify("how is the parseConfigFile read").words == ("parseconfigfile", "parse", "config", "file", "read")


# --- the legs ---------------------------------------------------------------------------------------------------


def test_english_words_do_not_trigger_the_symbol_leg(store: IndexStore, rows: dict[int, ChunkRow]) -> None:
    # 'migrate', 'debounce', 'main' and 'Config' are definitions in the sample repo: as words in a sentence they
    # must not pull those definitions in through the symbol leg
    query = "migrate the Config before main starts, and debounce the reload"
    assert classify(query).identifiers == ()
    ranked = hybrid(store, None, None, query, "hybrid", 20, None, None)
    assert ranked, "the lexical leg still answers"
    assert all("symbol" not in r.sources for r in ranked)
    # ...while the same name written as code does
    assert symbols(store, classify("run migrate() first").identifiers, None) == [_by_symbol(rows, "migrate").id]


def test_symbol_leg_matches_any_case_for_code_tokens(store: IndexStore, rows: dict[int, ChunkRow]) -> None:
    assert symbols(store, ("lruCache",), None) == [_by_symbol(rows, "LRUCache").id]


def test_symbol_leg_finds_a_dressed_name_by_its_definition(store: IndexStore, rows: dict[int, ChunkRow]) -> None:
    lru = _by_symbol(rows, "LRUCache").id
    for query in ("LRUCache<K, V>", "@LRUCache", "inventory\\cache\\LRUCache", "inventory.cache.LRUCache"):
        assert symbols(store, classify(query).identifiers, None) == [lru], query
        assert hybrid(store, None, None, query, "hybrid", 5, None, None)[0].id == lru, query


def test_words_that_spell_a_type_name_find_the_type(store: IndexStore, rows: dict[int, ChunkRow]) -> None:
    from gpubox.tools.search.query import compounds

    profile = classify("which config errors can loading raise")
    assert profile.kind == "nl" and "configerror" in profile.compounds  # 'errors' read as 'error' too
    assert compounds(store, profile.compounds, 10, None) == [_by_symbol(rows, "ConfigError").id]
    assert compounds(store, classify("token bucket rate limiters").compounds, 10, None) == [
        _by_symbol(rows, "RateLimiter").id
    ]
    # a function is no type: 'load config' spells load_config, which this leg leaves to the others
    assert compounds(store, classify("load config from a file").compounds, 10, None) == []
    ranked = hybrid(store, None, None, "which config errors can loading raise", "hybrid", 20, None, None)
    assert ranked[0].id == _by_symbol(rows, "ConfigError").id and "compound" in ranked[0].sources


def test_compound_names_stay_inside_a_phrase_and_leave_written_names_alone() -> None:
    from gpubox.tools.search.compounds import MAX_COMPOUNDS, compound_names

    names = compound_names("handler for log rotation", "nl", ())
    assert "logrotation" in names and "log_rotation" in names and "handlerlog" not in names  # not across 'for'
    assert compound_names("type adapter factories", "nl", ())[:4] == (
        "typeadapterfactories",
        "type_adapter_factories",
        "typeadapterfactory",  # three words first, the singular too
        "type_adapter_factory",
    )
    assert "parseargs" not in compound_names("where is parse args called", "mixed", ("parseArgs",))
    assert compound_names("JsonElement", "symbol", ("JsonElement",)) == ()
    plural = compound_names("test cases for LRU caches and http cookies", "nl", ())
    assert {"testcase", "lrucache", "httpcookie"} <= set(plural)  # -es and -ies words lose just their s too
    assert "jsonelement" not in compound_names("json, element parsing", "nl", ())  # nor across punctuation
    assert "handlingretry" not in compound_names("error handling\nretry policy", "nl", ())  # or a line break
    assert "tablevaluedparameter" in compound_names("table-valued parameter support", "nl", ())  # a hyphen joins
    assert len(compound_names(" ".join(f"w{i}x word{i}" for i in range(300)), "nl", ())) == MAX_COMPOUNDS
    long = (
        "configure retry policy timeouts, http client connection pools, tls certificates caches, json element parsers"
    )
    assert "jsonelement" in compound_names(long, "nl", ())  # three-word names leave room for the two-word ones


def test_phrase_leg_finds_a_quoted_message(store: IndexStore, rows: dict[int, ChunkRow]) -> None:
    target = next(r for r in rows.values() if "quantity must not be negative" in r.text)
    hits = phrase(store, "quantity must not be negative", 10, None)
    assert [i for i, _ in hits] == [target.id]
    assert phrase(store, "quantity must be not negative", 10, None) == []  # word order matters


# --- fusion and the ranking rules --------------------------------------------------------------------------------


def test_fusion_weights_follow_the_query_kind() -> None:
    lists = {"vector": [(1, 0.9), (2, 0.8)], "lexical": [(2, 5.0), (1, 4.0)], "symbol": [(3, 1.0)]}
    nl = fuse(lists, classify("keep recently used entries"))
    assert {s.id for s in nl} == {1, 2}  # the symbol leg has weight 0 for plain English
    sym = fuse(lists, classify("LRUCache"))
    assert sym[0].id == 3  # a definition of the named symbol leads


def test_a_definition_outranks_a_mention(rows: dict[int, ChunkRow]) -> None:
    # api.py mentions Database in every signature; db.py defines it. Fusion alone puts the mention first.
    mention = next(r for r in rows.values() if r.path == "inventory/api.py" and "Database" in r.text)
    definition = _by_symbol(rows, "Database")
    profile = classify("Database")
    fused = [Scored(mention.id, 0.030, ["lexical"]), Scored(definition.id, 0.020, ["lexical"])]
    ranked = rerank(fused, rows, profile)
    assert ranked[0].id == definition.id


def test_test_paths_are_penalised(rows: dict[int, ChunkRow]) -> None:
    src = _by_symbol(rows, "retry_with_backoff")
    in_tests = ChunkRow(999, "tests/test_retry.py", 1, 8, "test_retry_gives_up", "function", "python", src.text)
    both = {**rows, 999: in_tests}
    fused = [Scored(999, 0.030, ["lexical"]), Scored(src.id, 0.025, ["lexical"])]
    ranked = rerank(fused, both, classify("retry a call with exponential backoff"))
    assert [s.id for s in ranked][:2] == [src.id, 999]
    assert path_penalty("tests/test_retry.py") and path_penalty("web/vendor/lib.js") and path_penalty("a.min.js")
    assert path_penalty("examples/basic/main.go") and not path_penalty("inventory/retry.py")


def test_file_names_that_match_the_query_go_up(rows: dict[int, ChunkRow]) -> None:
    assert stem_share("inventory/retry.py", ("retry", "failed", "call")) == pytest.approx(1 / 3)
    assert stem_share("doc/md_docs.go", ("markdown", "docs")) == pytest.approx(1 / 2)
    retry = _by_symbol(rows, "retry_with_backoff")
    other = _by_symbol(rows, "refresh_token")
    fused = [Scored(other.id, 0.030, ["vector"]), Scored(retry.id, 0.028, ["vector"])]
    ranked = rerank(fused, rows, classify("retry until it works"))
    assert ranked[0].id == retry.id


def test_a_class_and_its_method_are_not_both_returned(rows: dict[int, ChunkRow]) -> None:
    cls = _by_symbol(rows, "LRUCache")
    lines = (REPO / cls.path).read_text().splitlines()
    start = next(n for n, line in enumerate(lines, 1) if "def get(" in line)
    text = "\n".join(lines[start - 1 : start + 5])
    method = ChunkRow(500, cls.path, start, start + 5, "get", "method", "python", text)
    both = {**rows, 500: method}
    fused = [Scored(500, 0.030, ["vector"]), Scored(cls.id, 0.029, ["lexical"])]
    ranked = rerank(fused, both, classify("look up a cached value"))
    assert len(ranked) == 1 and ranked[0].id in (500, cls.id)
    assert set(ranked[0].sources) == {"vector", "lexical"}  # the kept hit says both legs found it
    # spans that do not overlap in the same file both stay
    db = [_by_symbol(rows, "create_item"), _by_symbol(rows, "delete_item")]
    assert len(dedupe([Scored(r.id, 1.0, []) for r in db], rows)) == 2


def test_a_name_inside_a_question_does_not_pull_its_definition_up(rows: dict[int, ChunkRow]) -> None:

    definition = _by_symbol(rows, "Database")
    mention = next(r for r in rows.values() if r.path == "inventory/api.py" and "Database" in r.text)
    fused = [Scored(mention.id, 0.030, ["lexical"]), Scored(definition.id, 0.020, ["lexical"])]
    cfg = replace(DEFAULT, coherence=0, mention=1, stem=0, named_file=0)
    question = classify("how does the api use `Database` connections")
    assert question.kind == "mixed"
    assert rerank(fused, rows, question, cfg)[0].id == mention.id
    assert rerank(fused, rows, question, replace(cfg, definition_in_sentence=1.0))[0].id == definition.id
    assert rerank(fused, rows, classify("Database"), cfg)[0].id == definition.id  # a bare name still does


def test_rules_can_be_switched_off(rows: dict[int, ChunkRow]) -> None:

    mention = next(r for r in rows.values() if r.path == "inventory/api.py" and "Database" in r.text)
    definition = _by_symbol(rows, "Database")
    fused = [Scored(mention.id, 0.030, ["lexical"]), Scored(definition.id, 0.020, ["lexical"])]
    off = replace(DEFAULT, definition=0, coherence=0, mention=1)
    assert rerank(fused, rows, classify("Database"), off)[0].id == mention.id
    from gpubox.tools.search.rank import fusion_only, reweighted

    assert rerank(fused, rows, classify("Database"), fusion_only(DEFAULT))[0].id == mention.id
    heavier = reweighted(DEFAULT, nl={"vector": 3.0})
    assert heavier.weights["nl"]["vector"] == 3.0 and DEFAULT.weights["nl"]["vector"] != 3.0


def test_one_file_does_not_fill_the_page_when_saturation_is_on(rows: dict[int, ChunkRow]) -> None:

    db = [r for r in rows.values() if r.path == "inventory/db.py"][:3]
    cache = _by_symbol(rows, "LRUCache")
    fused = [
        *(Scored(r.id, 0.030 - 0.001 * i, ["vector"]) for i, r in enumerate(db)),
        Scored(cache.id, 0.025, ["vector"]),
    ]
    cfg = replace(DEFAULT, coherence=0, mention=1, stem=0, saturation=0.5, saturation_after=1)
    ranked = [s.id for s in rerank(fused, rows, classify("store things"), cfg)]
    assert ranked[:2] == [db[0].id, cache.id]  # the second db.py chunk is halved below the other file's best
    after_two = [s.id for s in rerank(fused, rows, classify("store things"), replace(cfg, saturation_after=2))]
    assert after_two[:3] == [db[0].id, db[1].id, cache.id]  # the default: a file's first two chunks keep their score
    off = [s.id for s in rerank(fused, rows, classify("store things"), replace(cfg, saturation=1.0))]
    assert off[:3] == [r.id for r in db]


def test_documentation_waits_behind_code_unless_the_query_asks_for_docs(rows: dict[int, ChunkRow]) -> None:

    code = _by_symbol(rows, "retry_with_backoff")
    doc = ChunkRow(900, "docs/retry.md", 1, 9, None, "window", "markdown", "Retries back off exponentially.")
    both = {**rows, 900: doc}
    fused = [Scored(900, 0.040, ["vector"]), Scored(code.id, 0.025, ["vector"])]
    cfg = replace(DEFAULT, prose=0.5, path_penalty=1, stem=0, coherence=0)
    assert rerank(fused, both, classify("how are retries backed off"), cfg)[0].id == code.id
    assert rerank(fused, both, classify("documentation of the retry backoff"), cfg)[0].id == 900
    assert rerank(fused, both, classify("how are retries backed off"), replace(cfg, prose=1.0))[0].id == 900


# --- what gets embedded ------------------------------------------------------------------------------------------


def test_embedding_text_carries_path_and_qualified_name() -> None:
    text = (REPO / "server/ratelimit.go").read_text()
    allow = next(c for c in chunk_text(text, "go") if c.symbol == "Allow")
    assert allow.qualified == "RateLimiter.Allow"
    head = embedding_text("server/ratelimit.go", allow).splitlines()[:2]
    assert head == ["server/ratelimit.go", "method RateLimiter.Allow"]


def test_windows_of_a_long_function_repeat_its_signature(tmp_path: Path) -> None:
    body = "\n".join(f"        total += {i}" for i in range(150))
    src = f"class Ledger:\n    def settle(self, accounts: list[str]) -> int:\n        total = 0\n{body}\n"
    chunks = [c for c in chunk_text(src, "python") if c.symbol == "settle"]
    assert len(chunks) >= 2
    assert chunks[0].signature is None  # the first window starts with the def line itself
    later = embedding_text("ledger.py", chunks[1])
    assert "method Ledger.settle" in later
    assert "def settle(self, accounts: list[str]) -> int:" in later


def test_a_method_defined_inside_a_whole_impl_chunk_counts_as_its_definition() -> None:
    # engine/src/parser.rs: a small `impl<'a> Tokenizer<'a>` is one chunk holding `fn next_token`
    text = (REPO / "engine/src/parser.rs").read_text()
    impl = next(c for c in chunk_text(text, "rust") if c.kind == "impl")
    assert impl.symbol == "Tokenizer"  # generics stripped, so `Tokenizer` finds it through the symbol leg
    row = ChunkRow(1, "engine/src/parser.rs", impl.start_line, impl.end_line, impl.symbol, impl.kind, "rust", impl.text)
    auth = (REPO / "inventory/auth.py").read_text()
    refresh = next(c for c in chunk_text(auth, "python") if c.symbol == "refresh_token")
    other = ChunkRow(2, "inventory/auth.py", refresh.start_line, refresh.end_line, "refresh_token", "function",
                     "python", refresh.text)  # fmt: skip
    profile = classify("next_token")
    assert defines(row, profile.identifiers) and not defines(other, profile.identifiers)
    # refresh_token shares the word 'token' but only the real definition gets the boost
    ranked = rerank([Scored(2, 0.030, ["lexical"]), Scored(1, 0.025, ["lexical"])], {1: row, 2: other}, profile)
    assert ranked[0].id == 1


def test_a_capitalised_name_prefers_the_case_exact_primary_definition() -> None:
    from gpubox.tools.search.rank import definition_strength, named_file

    profile = classify("Timeout")
    cls = ChunkRow(1, "httpx/_config.py", 72, 85, "Timeout", "class", "python", "class Timeout:\n    ...")
    method = ChunkRow(2, "httpx/_client.py", 253, 255, "timeout", "method", "python", "def timeout(self):\n    ...")
    ext = ChunkRow(3, "Cache/Request+Cache.swift", 1, 5, "Request", "impl", "swift", "extension Request {}")
    mod = ChunkRow(4, "lib/ecto/query.ex", 1, 80, "Ecto.Query", "module", "elixir", "defmodule Ecto.Query do")
    assert definition_strength(cls, profile.identifiers) == 1.0
    assert definition_strength(method, profile.identifiers) == 0.5  # only another case than the query's capitals
    assert definition_strength(method, classify("timeout").identifiers) == 1.0  # a lower-case query takes any case
    assert definition_strength(ext, classify("Request").identifiers) == 0.5  # an extension, not the type
    assert definition_strength(mod, classify("Query").identifiers) == 1.0  # a qualified name by its last part
    ctor = ChunkRow(5, "db/memtable.cc", 21, 30, "MemTable", "method", "cpp", "MemTable::MemTable(const C& c) {}")
    assert definition_strength(ctor, classify("MemTable").identifiers) == 0.5  # a C++ constructor, not the class
    assert definition_strength(ctor, classify("MemTable").identifiers, 0.25) == 0.25  # RankConfig.constructor
    nested = ChunkRow(6, "a.cc", 1, 2, "Foo", "method", "cpp", "Foo<std::vector<T>>::Foo(int x) {}")
    assert definition_strength(nested, classify("Foo").identifiers) == 0.5
    ranked = rerank([Scored(2, 0.030, ["symbol"]), Scored(1, 0.028, ["symbol"])], {1: cls, 2: method}, profile)
    assert ranked[0].id == 1
    assert named_file("Sources/Vapor/Request/Request.swift", ("Request",))
    assert named_file("lib/ecto/changeset.ex", ("Changeset",)) and not named_file("lib/ecto/repo.ex", ("Changeset",))


def test_the_symbol_leg_finds_a_qualified_name_by_its_last_part(tmp_path: Path) -> None:
    st = IndexStore(tmp_path / "q")
    chunks = [
        ("lib/ecto/query.ex", 1, 9, "Ecto.Query", "module", "elixir", "defmodule Ecto.Query do\nend", "a"),
        ("lib/ecto/planner.ex", 1, 9, "query", "function", "elixir", "def query(x), do: x", "b"),
        (
            "lib/ecto/query_builder.ex",
            1,
            9,
            "Ecto.QueryBuilder",
            "module",
            "elixir",
            "defmodule Ecto.QueryBuilder",
            "c",
        ),
    ]
    with st.transaction() as db:
        st.insert_chunks(db, [(*c, b"\0" * 16) for c in chunks])
    found = symbols(st, ("Query",), None)
    paths = [st.chunks(found)[i].path for i in found]
    assert set(paths) == {"lib/ecto/query.ex", "lib/ecto/planner.ex"}  # not Ecto.QueryBuilder
    st.close()


@pytest.mark.parametrize(
    ("path", "test"),
    [
        ("absl/strings/ascii_test.cc", True),  # GoogleTest's own naming
        ("base/files/file_util_unittest.cc", True),  # Chromium's
        ("src/test_parser.cpp", True),
        ("src/parser_test.cxx", True),
        ("absl/strings/ascii.cc", False),
        ("lib/contest.cc", False),
        ("src/latest.c", False),
        ("src/main/java/org/apache/commons/io/build/AbstractOrigin.java", False),  # a package named build
        ("web/dist/bundle.js", True),
    ],
)
def test_cpp_test_files_are_known_by_every_usual_extension(path: str, test: bool) -> None:
    assert path_penalty(path) == test


def test_the_class_in_the_header_outranks_its_out_of_line_constructor_and_the_cc_file_around_it() -> None:
    # leveldb's MemTable: `MemTable::MemTable(...)` in db/memtable.cc, beside the file's other members (file
    # coherence), came first and the class in db/memtable.h second (bench/symbol_eval's shared-name set)
    profile = classify("MemTable")
    cls = ChunkRow(1, "db/memtable.h", 20, 83, "MemTable", "class", "cpp", "class MemTable {\n public:\n};")
    ctor = ChunkRow(2, "db/memtable.cc", 21, 22, "MemTable", "method", "cpp", "MemTable::MemTable(const C& c) {}")
    add = ChunkRow(3, "db/memtable.cc", 76, 100, "Add", "method", "cpp", "void MemTable::Add(SequenceNumber s) {}")
    get = ChunkRow(4, "db/memtable.cc", 102, 140, "Get", "method", "cpp", "bool MemTable::Get(const LookupKey& k) {}")
    rows = {r.id: r for r in (cls, ctor, add, get)}
    fused = [Scored(2, 0.09, ["symbol", "lexical"]), Scored(1, 0.08, ["symbol", "lexical"])]
    fused += [Scored(3, 0.05, ["lexical"]), Scored(4, 0.05, ["lexical"])]
    assert rerank(fused, rows, profile)[0].id == 1
    # the rules are what decide: the constructor's own, and the type's over functions of its name
    assert rerank(fused, rows, profile, replace(DEFAULT, constructor=1.0, type_first=1.0))[0].id == 2


@pytest.mark.parametrize(
    ("query", "identifier"),
    [
        ("ZodType<T>", "ZodType"),  # generic arguments
        ("Map<String, List<Integer>>", "Map"),
        ("fmt::formatter<T>", "fmt::formatter"),
        ("@JsonProperty", "JsonProperty"),  # an annotation or decorator as written at a use
        ("Monolog\\Logger", "Monolog\\Logger"),  # PHP's namespace separator
        ("\\League\\Flysystem\\Filesystem", "League\\Flysystem\\Filesystem"),
        ("$ZodType", "$ZodType"),  # `$` is a letter in JavaScript names
        ("Foo<T>::bar", "Foo::bar"),
        ("Rack::Request#params", "Rack::Request#params"),  # Ruby's and Javadoc's instance-method notation
        ("Plug.Conn.put_status/2", "Plug.Conn.put_status"),  # Elixir's arity
        ("parse(input)", "parse"),  # a call as written
    ],
)
def test_a_lone_name_written_as_code_is_a_symbol_query(query: str, identifier: str) -> None:
    # bench/symbol_eval's once-set names written this way scored 0.954 NDCG@10 as sentences, 0.995 as bare names
    profile = classify(query)
    assert (profile.kind, profile.identifiers) == ("symbol", (identifier,))


def test_a_php_qualified_name_finds_its_class_by_the_last_part() -> None:
    from gpubox.tools.search.rank import definition_strength

    cls = ChunkRow(
        1, "src/Monolog/Logger.php", 30, 80, "Logger", "class", "php", "class Logger implements LoggerInterface"
    )
    assert definition_strength(cls, classify("Monolog\\Logger").identifiers) == 1.0
    assert classify("where is Monolog\\Logger created").identifiers == ("Monolog\\Logger",)
    assert classify("a < b and c > d").kind == "nl"
    assert classify("issue #22 fix").kind == "nl" and classify("#include").kind == "nl"
    # what only looks dressed: a pasted log line, a protocol version, a file path, a comparison
    assert classify('logger.warning("Retrying request")').kind == "mixed"
    assert classify("HTTP/2").kind == "nl" and classify("tokio/1").kind == "nl"
    assert classify("src\\foo\\bar.py").kind != "symbol"
    assert classify("a<b>c").kind == "nl" and classify("\\n").kind == "nl"
    assert classify("ZodType<T>[]").identifiers == ("ZodType",)
