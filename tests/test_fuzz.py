"""Property-based fuzzing (Hypothesis) of JSON schemas and tool arguments: the server stays up and every error
is specific. Bounded example counts keep this in the fast tier; set HYPOTHESIS_PROFILE=long for a deeper run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.errors import InvalidInputError
from gpubox.settings import Settings

EXAMPLES = 400 if os.environ.get("HYPOTHESIS_PROFILE") == "long" else 60
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)

# regex pieces: the everyday escapes that crashed llama.cpp, the constructs a grammar cannot express, huge bounds
REGEX_PIECES = [
    "a", "\\d", "\\w", "\\s", "\\D", "\\W", "\\S", "\\.", "\\/", "\\-", "\\b", "\\1", "[\\d]", "[^@]", "[a-z]",
    "[\\]\\\\\"]", ".", "|", "(", ")", "(?:", "(?=", "(?i)", "*", "+", "?", "{3}", "{2,5}", "{100000000}",
    "{1,}", "é", "😀", '"', "\\\\", "\\u00e9", "\\x41", "^", "$", "\\n", "\\t",
]  # fmt: skip
patterns = st.lists(st.sampled_from(REGEX_PIECES), max_size=12).map("".join)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=20))
leaf_schemas = st.one_of(
    st.fixed_dictionaries({"type": st.just("string"), "pattern": patterns}),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["integer", "number"])},
        optional={"minimum": st.floats(-10, 10), "maximum": st.floats(-10, 10), "exclusiveMinimum": scalars},
    ),
    st.fixed_dictionaries({"enum": st.lists(scalars, max_size=3)}),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["string", "array", "bogus", "null", "boolean"])},
        optional={"minLength": st.integers(-2, 5000), "maxItems": st.integers(-2, 5000), "const": scalars},
    ),
    st.sampled_from([True, False, {}, {"$ref": "#/nowhere"}, {"$ref": "http://x/y"}]),
)
schemas = st.recursive(
    leaf_schemas,
    lambda inner: st.one_of(
        st.fixed_dictionaries({"type": st.just("object"), "properties": st.dictionaries(st.text(max_size=5), inner)}),
        st.fixed_dictionaries({"type": st.just("array"), "items": inner}),
        st.fixed_dictionaries({"anyOf": st.lists(inner, max_size=3)}),
        st.fixed_dictionaries({"allOf": st.lists(inner, max_size=3)}),
        st.fixed_dictionaries({"type": st.just("object"), "patternProperties": st.dictionaries(patterns, inner)}),
    ),
    max_leaves=8,
)


@pytest.mark.requires_llama
@FUZZ
@given(schema=st.one_of(schemas, st.dictionaries(st.text(max_size=8), scalars)))
def test_any_schema_becomes_a_checked_grammar_or_a_specific_error(schema: Any) -> None:
    from gpubox.tools.inference.grammar import check_gbnf, schema_to_gbnf

    try:
        grammar = schema_to_gbnf(schema)
    except InvalidInputError as exc:
        assert str(exc).startswith("json_schema") and len(str(exc)) < 2000, str(exc)
        return
    check_gbnf(grammar)  # structurally sound: root defined, no empty rule or alternative
    assert len(grammar) < 1_000_000


# tools that answer from memory or the state dir; the ones that load models, index or start workers are
# exercised by their own (slow) tests
FAST_TOOLS = [
    "estimate_inference", "estimate_training", "estimate_gpus", "estimate_calibrations",
    "estimate_record_measurement", "gpu_status", "search_list", "search_drop", "search_code", "infer_models",
    "infer_unload", "finetune_list", "finetune_status", "finetune_cancel", "bench_list", "bench_plot",
]  # fmt: skip
json_values = st.recursive(
    scalars, lambda v: st.lists(v, max_size=3) | st.dictionaries(st.text(max_size=6), v), max_leaves=6
)


@pytest.fixture(scope="module")
def portal_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BlockingPortal, Client, Any]]:
    tmp = tmp_path_factory.mktemp("fuzz")
    root = tmp / "root"
    root.mkdir()
    server = build_server(Settings.load(state_dir=tmp / "state", allowed_roots=[root]))
    with start_blocking_portal() as portal, portal.wrap_async_context_manager(Client(server)) as client:  # type: ignore[arg-type]
        tools = {t.name: t for t in portal.call(client.list_tools).tools}
        yield portal, client, tools
    state_of(server).close()


@FUZZ
@given(data=st.data())
def test_fuzzed_tool_arguments_get_a_result_or_a_specific_error(
    portal_client: tuple[BlockingPortal, Client, Any], data: st.DataObject
) -> None:
    portal, client, tools = portal_client
    name = data.draw(st.sampled_from([t for t in FAST_TOOLS if t in tools]))
    props = list(tools[name].input_schema.get("properties", {}))
    keys = st.sampled_from(props) if props else st.text(max_size=6)
    args = data.draw(st.dictionaries(keys | st.text(max_size=6), json_values | patterns, max_size=4))
    result = portal.call(client.call_tool, name, args)
    text = " ".join(getattr(c, "text", "") for c in result.content)
    if result.is_error:
        assert text.strip() not in (f"Error executing tool {name}", "Internal server error"), (name, args, text)
        assert "Traceback" not in text and len(text) > len(f"Error executing tool {name}") + 10, (name, args, text)
    # the server is still up and answering
    assert not portal.call(client.call_tool, "estimate_gpus", {}).is_error


def test_no_fuzzed_tool_has_been_dropped_from_the_server(portal_client: tuple[BlockingPortal, Client, Any]) -> None:
    missing = [t for t in FAST_TOOLS if t not in portal_client[2]]
    assert not missing, f"rename FAST_TOOLS: {missing}"
