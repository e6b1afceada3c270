"""Hostile JSON schemas get an InvalidInputError naming the bad part, never a llama.cpp crash.

llama.cpp's grammar parser segfaults on an empty rule, which would take pytest down with it; so the real
server runs in a subprocess and a crash shows up as a non-zero exit status instead."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpubox.errors import InvalidInputError
from gpubox.tools.inference.grammar import check_gbnf, check_schema, schema_to_gbnf

HOSTILE = {
    "empty enum": ({"enum": []}, "enum"),
    "empty anyOf": ({"anyOf": []}, "anyOf"),
    "empty type list": ({"type": []}, "type"),
    "anyOf of an empty enum": ({"anyOf": [{"enum": []}]}, "anyOf[0].enum"),
    "property with an empty enum": (
        {"type": "object", "properties": {"colour": {"enum": []}}, "required": ["colour"]},
        "properties.colour.enum",
    ),
}

SCRIPT = r"""
import json, sys, threading
import anyio
from mcp import Client
from gpubox.app import build_server, state_of
from gpubox.errors import InvalidInputError
from gpubox.settings import Settings
from gpubox.tools.inference.adapter import manager
from gpubox.tools.inference.backends import GenParams

state, cases = sys.argv[1], json.loads(sys.argv[2])
mcp = build_server(Settings.load(state_dir=state, allowed_roots=[state], infer_context_length=512))
out = {}

async def main():
    async with Client(mcp) as client:
        for name, schema in cases.items():
            for tool, args in (
                ("infer_chat", {"messages": [{"role": "user", "content": "Pick one."}]}),
                ("infer_complete", {"prompt": "Answer:"}),
            ):
                r = await client.call_tool(tool, {**args, "json_schema": schema, "max_tokens": 8})
                out[f"{tool} {name}"] = [r.is_error, r.content[0].text]
        ok = await client.call_tool("infer_chat", {
            "messages": [{"role": "user", "content": "Ann is 30. Reply as JSON."}], "max_tokens": 48,
            "temperature": 0, "json_schema": {"type": "object", "properties": {"age": {"type": "integer"}},
            "required": ["age"]}})
        out["valid afterwards"] = [ok.is_error, (ok.structured_content or {}).get("parsed_json")]
    # the backend checks too, for callers that skip the service layer
    r = manager(state_of(mcp)).acquire(None)
    try:
        for name, schema in cases.items():
            try:
                r.backend.generate(None, "x", GenParams(max_tokens=4, json_schema=schema), print, threading.Event())
                out[f"backend {name}"] = "accepted"
            except InvalidInputError as exc:
                out[f"backend {name}"] = str(exc)
    finally:
        manager(state_of(mcp)).release(r)

anyio.run(main)
state_of(mcp).close()
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow  # a real server with the model, in a subprocess
def test_hostile_schemas_are_refused_by_the_real_server_without_crashing_it(tmp_path: Path) -> None:
    cases = {name: schema for name, (schema, _) in HOSTILE.items()}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "state"), json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, f"server process died ({proc.returncode}): {proc.stderr[-3000:]}"
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line.removeprefix("RESULT "))
    for name, (_, where) in HOSTILE.items():
        for tool in ("infer_chat", "infer_complete"):
            is_error, text = out[f"{tool} {name}"]
            assert is_error and f"json_schema at {where} " in text, (name, text)
        assert f"json_schema at {where} " in out[f"backend {name}"], name
    is_error, parsed = out["valid afterwards"]
    assert not is_error and isinstance(parsed, dict) and isinstance(parsed["age"], int)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_the_grammar_check_alone_catches_what_the_converter_makes_of_each_hostile_schema(name: str) -> None:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    grammar = json_schema_to_gbnf(json.dumps(HOSTILE[name][0]))
    with pytest.raises(InvalidInputError, match=r"grammar rule '[\w-]+' .* is empty"):
        check_gbnf(grammar)


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": "strnig"}, "type"),
        ({"$ref": "https://example.com/schema.json"}, "$ref"),
        ({"$ref": "#/$defs/missing"}, "$ref"),
        ({"type": "array", "minItems": 5, "maxItems": 2}, "minItems"),
        ({"type": "array", "maxItems": 10**6}, "maxItems"),
        ({"oneOf": "string"}, "oneOf"),
        ({"properties": {"a": False}, "not": 3}, "not"),
    ],
)
def test_schema_check_names_the_bad_part(schema: dict[str, object], where: str) -> None:
    with pytest.raises(InvalidInputError, match=f"json_schema at {where.replace('$', '[$]')} "):
        check_schema(schema)


def test_deep_and_large_schemas_are_bounded() -> None:
    deep: dict[str, object] = {"type": "string"}
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    with pytest.raises(InvalidInputError, match="deeper than"):
        check_schema(deep)
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 20} for i in range(3000)}}
    with pytest.raises(InvalidInputError, match="characters"):
        check_schema(wide)


def test_ordinary_schemas_pass_both_checks() -> None:
    for schema in (
        {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}}, "required": ["n"]},
        {"type": "array", "items": {"enum": ["a", "b", 3]}, "minItems": 1, "maxItems": 4},
        {"anyOf": [{"type": "string", "pattern": "^[a-z]+$"}, {"type": "null"}]},
        {"type": ["string", "integer"]},
        {"type": "object", "properties": {"kept": {"type": "boolean"}}, "additionalProperties": False},
    ):
        assert "root ::=" in schema_to_gbnf(schema)
