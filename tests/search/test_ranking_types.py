"""A bare name that is both a type and functions/methods asks for the type (rank.RankConfig.type_first)."""

from __future__ import annotations

from dataclasses import replace

from gpubox.tools.search.query_kind import classify
from gpubox.tools.search.rank import DEFAULT, Scored, rerank
from gpubox.tools.search.store import ChunkRow

# rapidjson's `Double`: class Double in internal/ieee754.h, and a `bool Double(double d)` SAX handler method in
# every writer and in the schema validator, each file with several other candidates around it
CLS = ChunkRow(1, "internal/ieee754.h", 23, 73, "Double", "class", "cpp", "class Double {\npublic:\n    Double() {}")
WRITER = ChunkRow(2, "writer.h", 190, 192, "Double", "method", "cpp", "bool Double(double d) { return Write(d); }")
INT = ChunkRow(3, "writer.h", 180, 182, "Int", "method", "cpp", "bool Int(int i) { return WriteInt(i); }")
SCHEMA = ChunkRow(4, "schema.h", 900, 905, "Double", "method", "cpp", "bool Double(double d) { return true; }")
ROWS = {r.id: r for r in (CLS, WRITER, INT, SCHEMA)}
FUSED = [Scored(2, 0.09, ["symbol"]), Scored(4, 0.085, ["symbol"]), Scored(1, 0.08, ["symbol"]), Scored(3, 0.06, [])]


def test_the_type_outranks_methods_of_the_same_name() -> None:
    ranked = rerank(FUSED, ROWS, classify("Double"))
    assert ranked[0].id == 1
    off = rerank(FUSED, ROWS, classify("Double"), replace(DEFAULT, type_first=1.0))
    assert off[0].id == 2  # the rule is what decides: the writer's method, with its file's other hits, wins without it


def test_methods_keep_their_boost_when_no_type_has_the_name() -> None:
    rows = {k: v for k, v in ROWS.items() if k != 1}
    fused = [s for s in FUSED if s.id != 1]
    ranked = rerank(fused, rows, classify("Double"))
    assert [s.id for s in ranked][:2] == [2, 4]
    assert ranked[0].score == rerank(fused, rows, classify("Double"), replace(DEFAULT, type_first=1.0))[0].score


def test_a_question_naming_the_type_leaves_methods_alone() -> None:
    # only a lone name is a lookup: in a sentence the definition boost is already off (definition_in_sentence)
    profile = classify("how does Writer::Double format a NaN")
    assert profile.kind != "symbol"
    assert [s.id for s in rerank(FUSED, ROWS, profile)] == [
        s.id for s in rerank(FUSED, ROWS, profile, replace(DEFAULT, type_first=1.0))
    ]


def test_a_type_that_only_holds_a_member_of_the_name_leaves_the_functions_alone() -> None:
    # `class Parser` holding `def parse_args` defines parse_args by its text, but names no type parse_args
    holder = ChunkRow(1, "parser.py", 1, 6, "Parser", "class", "python", "class Parser:\n    def parse_args(self): ...")
    func = ChunkRow(2, "cli.py", 10, 14, "parse_args", "function", "python", "def parse_args(argv):\n    ...")
    on, off = _with_and_without_rule([Scored(2, 0.09, ["symbol"]), Scored(1, 0.085, ["symbol"])], holder, func)
    assert on[0][0] == 2
    assert on == off


def test_a_type_in_another_case_than_the_query_does_not_push_the_function_down() -> None:
    cls = ChunkRow(1, "settings.py", 1, 9, "Config", "class", "python", "class Config:\n    debug = False")
    func = ChunkRow(2, "app.py", 30, 34, "config", "function", "python", "def config(app):\n    ...")
    on, off = _with_and_without_rule([Scored(1, 0.09, ["symbol"]), Scored(2, 0.085, ["symbol"])], cls, func)
    assert on == off


def _with_and_without_rule(fused: list[Scored], *chunks: ChunkRow) -> tuple[list[tuple[int, float]], ...]:
    """(id, score) best first for a lookup of the function's name (the last chunk's), type-first on and off."""
    rows, query = {r.id: r for r in chunks}, classify(chunks[-1].symbol or "")
    ranked = (rerank(fused, rows, query), rerank(fused, rows, query, replace(DEFAULT, type_first=1.0)))
    return tuple([(s.id, s.score) for s in r] for r in ranked)
