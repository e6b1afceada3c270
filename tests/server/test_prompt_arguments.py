"""Prompt argument errors (issue #25, item 6): an unknown, missing or refused argument is an invalid-params error
that names the argument and what is expected, never 'Internal server error'."""

from __future__ import annotations

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, Prompt

pytestmark = pytest.mark.anyio


async def refused(client: Client, name: str, arguments: dict[str, str] | None) -> str:
    with pytest.raises(MCPError) as info:
        await client.get_prompt(name, arguments)
    err = info.value
    assert err.code == INVALID_PARAMS and "Internal server error" not in err.message, err.message
    return err.message


def required(prompt: Prompt) -> dict[str, str]:
    return {a.name: "x" for a in prompt.arguments or [] if a.required}


async def test_every_prompt_names_an_unknown_argument_and_lists_its_valid_ones(client: Client) -> None:
    prompts = (await client.list_prompts()).prompts
    assert len(prompts) >= 5
    for p in prompts:
        msg = await refused(client, p.name, {**required(p), "bogus_arg": "1"})
        assert "'bogus_arg'" in msg and p.name in msg, msg
        for a in p.arguments or []:
            assert a.name in msg, (p.name, msg)
        if not p.arguments:
            assert "takes no arguments" in msg


async def test_every_prompt_says_which_required_argument_is_missing(client: Client) -> None:
    prompts = (await client.list_prompts()).prompts
    with_required = [p for p in prompts if required(p)]
    assert with_required, "no prompt has a required argument to test"
    for p in with_required:
        msg = await refused(client, p.name, {})
        assert "missing" in msg, msg
        for name in required(p):
            assert f"'{name}'" in msg and "required" in msg, (p.name, msg)


async def test_every_prompt_still_renders_with_its_required_arguments(client: Client) -> None:
    for p in (await client.list_prompts()).prompts:
        result = await client.get_prompt(p.name, required(p))
        assert result.messages, p.name


@pytest.mark.parametrize(("value", "said"), [("0", "greater than or equal to 1"), ("many", "valid integer")])
async def test_a_refused_value_names_the_argument_and_the_bound(client: Client, value: str, said: str) -> None:
    msg = await refused(client, "pick_attention_kernel", {"heads": value})
    assert "'heads'" in msg and said in msg and repr(value) in msg, msg


async def test_an_unknown_prompt_lists_the_prompts(client: Client) -> None:
    msg = await refused(client, "no_such_prompt", {})
    assert "unknown prompt 'no_such_prompt'" in msg and "plan_finetune" in msg and "explain_code" in msg
