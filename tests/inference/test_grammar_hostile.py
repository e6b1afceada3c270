"""Issue #25 (1-3): regex patterns that crashed llama.cpp, grammar size bounded before expansion, output checked.

The crashing cases run through a real server in a subprocess: a regression would show as a dead child process,
not a dead pytest."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from gpubox.bundled import smollm2_gguf
from gpubox.errors import InvalidInputError, OutputRejectedError
from gpubox.tools.inference.grammar import check_gbnf, check_schema, format_literal, schema_to_gbnf
from gpubox.tools.inference.grammar_probe import check_in_child
from gpubox.tools.inference.output_check import check_output
from gpubox.tools.inference.pattern import pattern_to_gbnf

# the patterns an outside tester crashed the server with (SIGSEGV: "unknown escape at \d"), and what each admits
CRASHED = {
    r"^\d+$": "12345",
    r"^\w+$": "abc_1",
    r"^\s*x$": "  x",
    r"^a\.b$": "a.b",
    r"^a\/b$": "a/b",
    r"^[\d]+$": "42",
    r"^[\w.-]+@[\w-]+\.\w+$": "ann.lee@example.org",
    r"^\d{3}-\d{4}$": "555-1234",
    r"^[A-Z]\w*\s\d+$": "Box 12",
}
REFUSED = {
    r"\bword\b": "anchors",
    r"^(a)\1$": "back-references",
    r"^(?=a)a$": "lookahead",
    r"(?i)^abc$": "inline flags",
    r"^[ab]{100000000}$": "100,000,000 repetitions",
    r"^((a{100}){100}){100}$": "grammar elements (the limit",
    r"^(unclosed$": "not a valid regular expression",
    r"^\p{L}$": "bad escape",
}


def gguf() -> Path:
    path = smollm2_gguf()
    assert path is not None
    return path


@pytest.mark.parametrize("pattern", list(CRASHED))
def test_patterns_that_crashed_llama_cpp_become_grammars_it_accepts(pattern: str) -> None:
    grammar = schema_to_gbnf({"type": "string", "pattern": pattern})
    assert "\\d" not in grammar and "\\w" not in grammar and "\\s" not in grammar
    check_in_child(grammar, gguf())  # llama.cpp builds a sampler from it (in a child, so a regression is an error)


def test_a_pattern_nested_under_properties_is_translated_too() -> None:
    schema = {"type": "object", "properties": {"zip": {"type": "string", "pattern": r"^\d{5}$"}}, "required": ["zip"]}
    grammar = schema_to_gbnf(schema)
    assert "[0-9]" in grammar and "{5}" in grammar
    check_in_child(grammar, gguf())


@pytest.mark.parametrize(("pattern", "reason"), list(REFUSED.items()))
def test_unsupported_or_oversized_patterns_are_refused_by_name_before_anything_expands(
    pattern: str, reason: str
) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(InvalidInputError, match=re.escape(reason)) as info:
            check_schema({"type": "object", "properties": {"code": {"type": "string", "pattern": pattern}}})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "properties.code.pattern" in str(info.value) and "fix the pattern" in str(info.value)
    assert peak < 20 * 2**20, f"checking {pattern!r} allocated {peak / 2**20:.0f} MiB"


def test_repetition_bounds_add_up_across_the_schema_before_the_grammar_is_built() -> None:
    props = {f"p{i}": {"type": "string", "maxLength": 1000} for i in range(200)}
    with pytest.raises(InvalidInputError, match="grammar elements"):
        check_schema({"type": "object", "properties": props})


def test_json_specials_in_patterns_are_emitted_as_their_json_escapes() -> None:
    body = pattern_to_gbnf(r'^a"b\\c$')
    assert body == '"a" "\\\\\\"" "b" "\\\\\\\\" "c"'  # a \" b \\ c inside the JSON string
    check_gbnf(f'root ::= "\\"" {body} "\\""')
    # an unanchored side admits anything, as JSON Schema's pattern does (a search, not a full match)
    assert pattern_to_gbnf("x").count("*") == 2 and pattern_to_gbnf("^x$") == '"x"'


def test_the_child_process_turns_a_llama_cpp_parser_failure_into_an_error() -> None:
    # the escape the old converter copied verbatim: llama.cpp refuses (or crashes on) it, here in a child only
    with pytest.raises(InvalidInputError, match=r"grammar llama\.cpp refuses") as info:
        check_in_child('root ::= "\\d"', gguf())
    assert "server is unaffected" in str(info.value)


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "allOf[1].type"),
        ({"type": "integer", "minimum": 0.5, "maximum": 0.7}, "no integer"),
        ({"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 4}, "no integer"),
    ],
)
def test_schemas_that_admit_no_value_are_refused_up_front(schema: dict[str, object], reason: str) -> None:
    with pytest.raises(InvalidInputError, match=re.escape(reason)):
        check_schema(schema)


def test_integer_ranges_with_an_integer_inside_pass() -> None:
    check_schema({"type": "integer", "minimum": 0.5, "maximum": 1.5})
    check_schema({"allOf": [{"type": "number"}, {"type": "integer"}]})


@pytest.mark.parametrize(
    ("schema", "value", "where"),
    [
        ({"type": "integer", "minimum": 0, "maximum": 10}, 692, "maximum"),
        ({"type": "array", "uniqueItems": True}, ["a", "a"], "uniqueItems"),
        ({"type": "object", "properties": {"k": {"type": "string", "pattern": "^[0-9]+$"}}}, {"k": "x"}, "pattern"),
        ({"type": "object", "additionalProperties": False, "patternProperties": {"^x": {}}}, {"y": 1}, "additional"),
    ],
)
def test_output_that_breaks_the_schema_is_an_error_that_keeps_the_text(schema: dict, value: object, where: str) -> None:
    text = json.dumps(value)
    with pytest.raises(OutputRejectedError, match=where) as info:
        check_output(schema, value, text)
    assert repr(text) in str(info.value)


def test_output_that_satisfies_the_schema_passes() -> None:
    schema = {"properties": {"k": {"type": "string", "pattern": r"^\d+$"}}, "additionalProperties": False}
    check_output(schema, {"k": "123"}, '{"k": "123"}')


def test_a_backtracking_pattern_cannot_stall_the_server_while_output_is_checked() -> None:
    ticks = [0]
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.01)

    t = threading.Thread(target=tick)
    t.start()
    try:
        before = ticks[0]
        with pytest.raises(OutputRejectedError, match="could not be checked"):
            # exponential backtracking even for the `regex` module (which copes with (a+)+ on its own)
            check_output({"type": "string", "pattern": "^(a|a)*$"}, "a" * 40 + "!", json.dumps("a" * 40 + "!"))
        during = ticks[0] - before
    finally:
        stop.set()
        t.join()
    assert during >= 20, f"another thread ran only {during} times while the pattern was checked (GIL held?)"


SCRIPT = r"""
import json, sys
import anyio
from mcp import Client
from gpubox.app import build_server, state_of
from gpubox.settings import Settings

state, cases = sys.argv[1], json.loads(sys.argv[2])
mcp = build_server(Settings.load(state_dir=state, allowed_roots=[state], infer_context_length=512))
out = {}

async def main():
    async with Client(mcp) as client:
        for name, schema in cases.items():
            r = await client.call_tool("infer_complete", {"prompt": "x", "max_tokens": 24, "temperature": 0,
                                                          "json_schema": schema})
            out[name] = [r.is_error, r.content[0].text, (r.structured_content or {}).get("parsed_json")]
        r = await client.call_tool("gpu_status", {})
        out["alive"] = not r.is_error

anyio.run(main)
state_of(mcp).close()
print("RESULT " + json.dumps(out))
"""


# string constants whose JSON text holds backslash escapes the grammar must keep as written
LITERALS = {"nul": "a\x00b", "quote": 'say "hi"', "backslash": "a\\b", "emoji": "\U0001f600", "tab": "t\tz"}


def test_literals_keep_the_backslashes_of_their_json_text() -> None:
    assert format_literal(json.dumps("a\x00b")) == '"\\"a\\\\u0000b\\""'
    assert format_literal('say "hi"\n') == '"say \\"hi\\"\\n"'
    check_gbnf(schema_to_gbnf({"enum": [v for v in LITERALS.values()]}))


@pytest.mark.slow
def test_the_real_server_survives_every_schema_that_crashed_it_and_answers_with_matching_text(tmp_path: Path) -> None:
    cases = {p: {"type": "string", "pattern": p} for p in CRASHED}
    email = {"type": "string", "pattern": r"^[\w.-]+@[\w-]+\.\w+$"}
    cases["nested"] = {"type": "object", "properties": {"email": email}, "required": ["email"]}
    cases["unique"] = {"type": "array", "items": {"enum": ["a"]}, "minItems": 2, "uniqueItems": True}
    cases.update({f"literal {k}": {"const": v} for k, v in LITERALS.items()})  # a NUL const aborted the server
    cases["quoted name"] = {"type": "object", "properties": {'a"b': {"const": 1}}, "required": ['a"b']}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "state"), json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, f"server process died ({proc.returncode}): {proc.stderr[-3000:]}"
    out = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT ")).removeprefix("RESULT "))
    assert out.pop("alive") is True
    is_error, text, _ = out.pop("unique")  # the grammar can only produce ["a", "a"]: the check must catch it
    assert is_error and "uniqueItems" in text, text
    for k, v in LITERALS.items():  # each literal's JSON escapes are written out, and read back as the value
        is_error, text, parsed = out.pop(f"literal {k}")
        assert not is_error and parsed == v, (k, text)
    assert out.pop("quoted name")[2] == {'a"b': 1}
    matched = 0
    for name, (is_error, text, parsed) in out.items():
        if is_error:  # max_tokens can end a string early; that is reported, never a crash
            assert "not valid JSON" in text or "does not satisfy" in text, (name, text)
        elif name in CRASHED and parsed is not None:  # None: stopped by max_tokens (finish_reason "length")
            assert isinstance(parsed, str) and re.search(name, parsed, re.ASCII), (name, parsed)
            matched += 1
    assert matched >= len(CRASHED) // 2, out


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": "integer", "minimum": 10**400}, "minimum"),
        ({"type": "number", "maximum": -(10**30)}, "maximum"),
        ({"type": "number", "multipleOf": 0}, "multipleOf"),
        ({"type": "number", "multipleOf": -2}, "multipleOf"),
        ({"type": "number", "multipleOf": "2"}, "multipleOf"),
    ],
)
def test_numeric_keywords_no_float_can_hold_or_divide_by_are_refused_by_name(schema: dict, where: str) -> None:
    with pytest.raises(InvalidInputError, match=where):
        check_schema(schema)


def test_output_that_cannot_be_checked_numerically_is_rejected_with_its_text() -> None:
    # check_schema refuses such a schema first; the check after generation holds on its own too
    with pytest.raises(OutputRejectedError, match="could not be checked: ZeroDivisionError") as err:
        check_output({"type": "number", "multipleOf": 0}, 12.5, "12.5")
    assert "12.5" in str(err.value)
