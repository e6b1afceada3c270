"""Arguments as a model sends them (server/arguments.py, through the in-memory Client): rarely needed parameters
are listed inside `more` and work there or at the top level; a name no tool takes is refused with the close
matches instead of being dropped; gpubox://tools/{name} has every parameter."""

from __future__ import annotations

import json

import pytest
from mcp import Client, MCPError
from mcp.types import INVALID_PARAMS

from gpubox.arguments import fold, unfold
from gpubox.errors import InvalidInputError
from tests.conftest import call_err, call_ok

pytestmark = pytest.mark.anyio
QUESTION = {"model": "Llama-3.1-8B", "gpu": "A10", "method": "lora", "max_length": 1024}


async def test_a_folded_parameter_is_listed_in_more_and_takes_effect_there_or_at_the_top_level(client: Client) -> None:
    listed = {t.name: t.input_schema for t in (await client.list_tools()).tools}["estimate_training"]
    assert "optim" not in listed["properties"] and "optim" in listed["properties"]["more"]["description"]
    default = await call_ok(client, "estimate_training", **QUESTION)
    inside = await call_ok(client, "estimate_training", **QUESTION, more={"optim": "adamw_torch"})
    top = await call_ok(client, "estimate_training", **QUESTION, optim="adamw_torch")
    assert inside == top != default  # plain AdamW keeps 32-bit optimizer state: another estimate
    assert "adamw_torch" in json.dumps(inside)


async def test_names_a_tool_does_not_take_are_refused_with_the_close_matches(client: Client) -> None:
    typo = await call_err(client, "estimate_inference", model="Llama-3-8B", gpu="A10", contxt_length=4096)
    assert "unknown argument 'contxt_length'" in typo and "context_length" in typo
    inside = await call_err(client, "estimate_training", **QUESTION, more={"optimizer": "sgd"})
    assert "unknown setting 'optimizer'. Did you mean: optim?" in inside, inside
    assert "'more' holds only these settings of estimate_training" in inside
    unlike = await call_err(client, "estimate_training", **QUESTION, more={"bogus": 1})
    assert "Did you mean" not in unlike and "Valid setting names:" in unlike, unlike  # nothing close to 'bogus'
    shown = await call_err(client, "estimate_training", **QUESTION, more={"gpu": "A100"})
    assert "'gpu' is a top-level argument of estimate_training" in shown
    twice = await call_err(client, "estimate_training", **QUESTION, optim="sgd", more={"optim": "adamw_torch"})
    assert "given twice" in twice
    not_object = await call_err(client, "estimate_training", **QUESTION, more="optim=sgd")
    assert "'more' takes an object" in not_object and "optim" in not_object
    bad_value = await call_err(client, "estimate_training", **QUESTION, more={"optim": "nadam"})
    assert "optim" in bad_value  # the SDK's own validation still runs on a folded parameter


async def test_a_name_another_tool_gives_the_same_thing_is_refused_with_this_tools_name_for_it(client: Client) -> None:
    # infer_chat's `model` is infer_load's `name`; finetune_status's `job_id` is finetune_merge's `job`
    unload = await call_err(client, "infer_unload", model="smollm2-135m-instruct")
    assert "unknown argument 'model'" in unload and "infer_unload takes it as 'name'" in unload, unload
    merge = await call_err(client, "finetune_merge", job_id="abc")
    assert "finetune_merge takes it as 'job'" in merge, merge
    search = await call_err(client, "search_code", query="x", name="repo")
    assert "search_code takes it as 'index'" in search, search
    # only where it is the same thing: search_index's `name` is an index's, not a model's
    index = await call_err(client, "search_index", path="/nonexistent", model="minilm")
    assert "unknown argument 'model'" in index and "takes it as" not in index, index


async def test_the_full_schema_resource_has_every_parameter_and_refuses_unknown_tools(client: Client) -> None:
    listed = {t.name: t.input_schema for t in (await client.list_tools()).tools}
    contents = (await client.read_resource("gpubox://tools/finetune_plan")).contents
    full = json.loads(contents[0].text)  # type: ignore[union-attr]
    folded = listed["finetune_plan"]["properties"]["more"]["description"]
    for name in ("optim", "lora_alpha", "probe_steps"):
        assert name in full["properties"] and name in folded and name not in listed["finetune_plan"]["properties"]
    assert full["required"] == ["dataset"] and "more" not in full["properties"]
    with pytest.raises(MCPError) as err:
        await client.read_resource("gpubox://tools/finetune_pln")
    assert err.value.code == INVALID_PARAMS and "finetune_plan" in err.value.message


def test_fold_and_unfold_are_inverse_and_never_fold_a_required_parameter() -> None:
    schema = {"properties": {"a": {"type": "string"}, "b": {"type": "integer"}, "c": {}}, "required": ["a"]}
    folded = fold("t", schema, ("b", "c"))
    assert set(folded["properties"]) == {"a", "more"} and "b, c" in folded["properties"]["more"]["description"]
    assert unfold("t", {"a": "x", "more": {"b": 1}}, {"a", "b", "c"}, ("b", "c")) == {"a": "x", "b": 1}
    assert unfold("t", {"a": "x", "c": 2}, {"a", "b", "c"}, ("b", "c")) == {"a": "x", "c": 2}
    with pytest.raises(ValueError, match="a required parameter cannot be folded"):
        fold("t", schema, ("a",))
    with pytest.raises(InvalidInputError, match="unknown argument 'more'"):  # no folded names: no `more`
        unfold("t", {"a": "x", "more": {}}, {"a"}, ())


def test_gpubox_call_names_the_tools_own_name_for_an_argument_too() -> None:
    from gpubox.calling import parse_arguments

    with pytest.raises(InvalidInputError, match="infer_load takes it as 'name'"):
        parse_arguments(["model=smollm2"], {"properties": {"name": {"type": "string"}}}, "infer_load")


async def test_every_hint_names_a_parameter_the_tool_takes_for_one_it_does_not(client: Client) -> None:
    from gpubox.arguments import SAME_THING

    for tool, names in SAME_THING.items():
        full = json.loads((await client.read_resource(f"gpubox://tools/{tool}")).contents[0].text)  # type: ignore[union-attr]
        for key, target in names.items():
            assert target in full["properties"] and key not in full["properties"], (tool, key, target)


async def test_invalid_values_are_named_with_the_bound_and_what_was_sent_without_pydantics_noise(
    client: Client,
) -> None:
    big = await call_err(client, "search_code", query="retry", k=1000)
    assert "search_code: invalid arguments: k: Input should be less than or equal to 100 (got 1000)" in big, big
    assert "pydantic.dev" not in big and "Arguments" not in big and "\n" not in big
    missing = await call_err(client, "estimate_inference", gpu="A10")
    assert "model: Field required" in missing and "got" not in missing, missing
    several = await call_err(client, "estimate_training", **{**QUESTION, "max_length": "long", "lora_r": 0})
    assert "max_length:" in several and "(got 'long')" in several and ";" in several, several


async def test_a_result_that_fails_its_own_schema_stays_a_masked_crash_not_the_callers_mistake(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpubox.tools.gpu import adapter as gpu_adapter

    # a crash that happens to be a pydantic error (the tool's own output model) must not read "invalid arguments"
    monkeypatch.setattr(gpu_adapter, "status_with_session", lambda state: {"not": "a GpuStatus"})
    result = await client.call_tool("gpu_status", {})
    text = " ".join(getattr(c, "text", "") for c in result.content)
    assert result.is_error and "invalid arguments" not in text, text


def test_gpubox_call_refuses_a_repeated_key_and_its_hint_runs() -> None:
    from gpubox.calling import parse_arguments

    schema = {"properties": {"name_contains": {"type": "string"}, "detail": {"type": "boolean"}}}
    with pytest.raises(InvalidInputError, match="'name_contains' is given twice"):  # the last one won
        parse_arguments(["name_contains=H100", "name_contains=zzz"], schema, "estimate_gpus")
    with pytest.raises(InvalidInputError, match=r"e\.g\. gpubox call estimate_gpus name_contains=<value>") as bad:
        parse_arguments(["H100"], schema, "estimate_gpus")
    assert "top=5" not in str(bad.value)  # the old hint named an argument no tool has


async def test_a_boolean_for_a_number_is_refused(client: Client) -> None:
    """pydantic's lax mode read `true` as 1: max_tokens=true generated one token, nothing said."""
    text = await call_err(client, "box_plan", load="x", context_length=True)
    assert "context_length: a number is wanted, not true" in text, text
    plan = await call_ok(client, "estimate_gpus", detail=False)  # a boolean parameter still takes one
    assert plan


async def test_a_boolean_for_a_number_inside_a_list_is_refused(client: Client) -> None:
    """The check looked at top-level arguments only: seq_len=[true] was read as [1] (refused before the tool asks
    for its confirmation)."""
    text = await call_err(client, "bench_attention", seq_len=[256, True], head_dim=64)
    assert "seq_len[1]: a number is wanted, not true" in text, text
    assert "head_dim" not in text


def test_booleans_for_numbers_are_found_through_refs_unions_and_objects() -> None:
    from gpubox.arguments import no_booleans

    schema = {
        "properties": {
            "shape": {"anyOf": [{"$ref": "#/$defs/Shape"}, {"type": "null"}]},
            "flags": {"type": "array", "items": {"type": "boolean"}},
            "n": {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "integer"}}]},
        },
        "$defs": {"Shape": {"type": "object", "properties": {"dims": {"type": "array", "items": {"type": "number"}}}}},
    }
    no_booleans({"flags": [True, False], "n": [1, 2], "shape": {"dims": [1.5]}}, schema)  # booleans where wanted
    with pytest.raises(InvalidInputError) as bad:
        no_booleans({"shape": {"dims": [2, False]}, "n": [True]}, schema)
    assert "shape.dims[1]: a number is wanted, not false" in str(bad.value)
    assert "n[0]: a number is wanted, not true" in str(bad.value)
