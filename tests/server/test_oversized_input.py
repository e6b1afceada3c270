"""Input an MCP client can send in process (the stdio and HTTP JSON parsers stop it earlier): a 5,000-digit integer,
a list nested 10,000 deep, and names of megabytes. Each is refused in a line of its own size, never a masked crash
or the whole input echoed back."""

from __future__ import annotations

from typing import Any

import pytest
from mcp import Client, MCPError

from gpubox.calling import call_tool
from gpubox.errors import InvalidInputError
from tests.conftest import call_err

pytestmark = pytest.mark.anyio


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


async def test_a_huge_integer_is_refused_as_an_argument_error(client: Client) -> None:
    huge = await call_err(client, "bench_list", limit=10**5000)
    assert "limit" in huge and "too large or deep to show" in huge and len(huge) < 600, huge[:600]


def test_a_list_nested_past_the_interpreters_limit_is_shown_in_a_few_words() -> None:
    # the SDK's client refuses to send such a list (serialization depth); a raw JSON-RPC request does not
    from gpubox.arguments import _short  # pyright: ignore[reportPrivateUsage]

    assert _short(nested(10_000)) == "a list too large or deep to show"


def test_a_json_schema_nested_past_the_interpreters_limit_is_refused_by_name() -> None:
    from gpubox.tools.inference.grammar import check_schema

    schema: dict[str, Any] = {"type": "string"}
    for _ in range(10_000):
        schema = {"type": "array", "items": schema}
    with pytest.raises(InvalidInputError, match="json_schema at \\(root\\) is nested too deeply"):
        check_schema(schema)  # a RecursionError, masked as "Error executing tool infer_chat"


async def test_names_of_megabytes_come_back_cut(client: Client) -> None:
    name = "x" * 1_000_000
    unload = await call_err(client, "infer_unload", name=name)
    tool = await client.call_tool(name, {})
    assert len(unload) < 2_000 and "x" * 64 + "..." in unload, unload[:200]
    text = " ".join(getattr(b, "text", "") for b in tool.content)
    assert tool.is_error and len(text) < 2_000 and "unknown tool" in text, text[:200]
    with pytest.raises(MCPError) as prompt:
        await client.get_prompt(name, {})
    assert len(str(prompt.value)) < 2_000 and "unknown prompt" in str(prompt.value)


async def test_gpubox_call_refuses_a_deep_argument_in_one_line(server: object) -> None:
    with pytest.raises(InvalidInputError, match=r"nested too deeply|cannot be sent"):
        await call_tool(server, "bench_list", [f"limit={'[' * 5000}1{']' * 5000}"])  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=r"cannot be sent|nested too deeply"):
        await call_tool(server, "bench_list", [f"limit={'[' * 900}1{']' * 900}"])  # type: ignore[arg-type]


async def test_gpubox_call_refuses_a_huge_integer_in_one_line(server: object) -> None:
    with pytest.raises(InvalidInputError, match="cannot be read"):
        await call_tool(server, "bench_list", ["limit=1" + "0" * 5000])  # type: ignore[arg-type]
