"""`gpubox call TOOL key=value ...`: run a tool in-process through the in-memory MCP client."""

from __future__ import annotations

import json
from typing import Any

from mcp import Client, MCPError
from mcp.server.mcpserver import MCPServer
from pydantic import ValidationError

from gpubox.arguments import unknown_argument
from gpubox.errors import ConfigError, GpuboxError, InvalidInputError, UnknownNameError


def _coerce(raw: str, schema: dict[str, Any]) -> Any:
    """Turn a CLI string into the JSON value the tool's input schema wants."""
    types = schema.get("type")
    if types is None and "anyOf" in schema:
        types = [s.get("type") for s in schema["anyOf"]]
    type_list = types if isinstance(types, list) else [types]
    if type_list == ["string"]:
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw
    except RecursionError:
        raise InvalidInputError("an argument is nested too deeply to send; flatten it") from None
    except ValueError as exc:  # an integer over Python's 4,300-digit conversion limit
        raise InvalidInputError(f"an argument cannot be read: {exc}") from None


def parse_arguments(pairs: list[str], input_schema: dict[str, Any], tool: str = "this tool") -> dict[str, Any]:
    props: dict[str, Any] = input_schema.get("properties", {})
    args: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            example = f"{next(iter(props))}=<value>" if props else "(this tool takes no arguments)"
            raise InvalidInputError(f"argument '{pair}' is not key=value; e.g. gpubox call {tool} {example}")
        key, raw = pair.split("=", 1)
        if key not in props:
            raise unknown_argument(tool, key, props.keys())
        if key in args:  # the last one silently won
            raise InvalidInputError(f"argument '{key}' is given twice; give it once")
        args[key] = _coerce(raw, props[key])
    return args


def _from_protocol_error(exc: MCPError) -> GpuboxError:
    if isinstance(exc.data, dict) and exc.data.get("error") == "ConfigError":
        return ConfigError(exc.message)
    return GpuboxError(f"the server answered with protocol error {exc.code}: {exc.message}")


async def call_tool(mcp: MCPServer[Any], name: str, pairs: list[str]) -> tuple[bool, Any]:
    """Returns (is_error, payload): structured content when present, else the text blocks."""
    problem: Exception | None = None
    result = None
    async with Client(mcp) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        try:
            # Raised outside the client's task group, or the caller would get an ExceptionGroup.
            if name not in tools:
                raise UnknownNameError("tool", name, tools.keys())
            # every parameter, those tools/list folds into `more` too (gpubox.arguments): they go at the top level
            full = (await client.read_resource(f"gpubox://tools/{name}")).contents[0]
            args = parse_arguments(pairs, json.loads(getattr(full, "text", "{}")), name)
        except InvalidInputError as exc:
            problem = exc
        else:
            try:
                result = await client.call_tool(name, args)
            except MCPError as exc:  # a protocol error (e.g. ConfigError) is an exit status, not a traceback
                problem = _from_protocol_error(exc)
            except ValidationError:  # a result that fails its schema: the tool ran, not the arguments' fault
                raise
            except ValueError as exc:  # the client's own refusal to send it (serialization depth)
                problem = InvalidInputError(f"the arguments cannot be sent: {exc}")
    if problem is not None:
        raise problem
    assert result is not None
    texts = [getattr(b, "text", "") for b in result.content]
    if result.is_error:
        return True, "\n".join(texts)
    if result.structured_content is not None:
        return False, result.structured_content
    return False, "\n".join(texts)
