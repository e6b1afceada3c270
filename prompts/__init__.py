"""gpubox.prompts: MCP prompts that steer a client's model through gpubox tools."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, PromptArgument
from pydantic import ValidationError

from gpubox.errors import cut
from gpubox.prompts import bench, finetune, gpu, search

R = TypeVar("R")


def register(mcp: MCPServer[Any], families: set[str] | None = None) -> None:
    for module, family in ((gpu, "gpu"), (search, "search"), (finetune, "finetune"), (bench, "bench")):
        if families is None or family in families:
            module.register(mcp)


async def checked_get(
    mcp: MCPServer[Any], name: str, arguments: Mapping[str, Any] | None, get: Callable[[], Awaitable[R]]
) -> R:
    """Run `get` (the SDK's prompts/get) after checking `name` and `arguments` against the listed prompts.

    The SDK raises a plain ValueError for an unknown prompt, an unknown or missing argument and a value its
    validation refuses, which reaches the client as 'Internal server error'; here each is an invalid-params
    error naming the argument and what it expects."""
    listed = {p.name: p for p in await mcp.list_prompts()}
    if name not in listed:
        raise _invalid(f"unknown prompt '{cut(name)}'. Prompts: {', '.join(sorted(listed))}")
    expected = {a.name: a for a in listed[name].arguments or []}
    given = dict(arguments or {})
    if unknown := sorted(set(given) - set(expected)):
        raise _invalid(f"prompt '{name}' has no {_names(unknown)}; {_expects(name, expected)}")
    if missing := [a for a in expected.values() if a.required and a.name not in given]:
        raise _invalid(f"prompt '{name}' is missing {_names([a.name for a in missing])}; {_expects(name, expected)}")
    try:
        return await get()
    except ValueError as exc:
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, ValidationError):
            cause = cause.__cause__
        if cause is None:
            raise
        bad = "; ".join(_value_error(e, expected) for e in cause.errors())
        raise _invalid(f"prompt '{name}': {bad}") from exc


def _invalid(message: str) -> MCPError:
    return MCPError(code=INVALID_PARAMS, message=message)


def _names(names: list[str]) -> str:
    shown = [cut(n) for n in names[:10]] + (["..."] if len(names) > 10 else [])
    return ("argument " if len(names) == 1 else "arguments ") + ", ".join(f"'{n}'" for n in shown)


def _expects(name: str, expected: Mapping[str, PromptArgument]) -> str:
    if not expected:
        return f"'{name}' takes no arguments"
    parts = [
        f"{a.name} ({'required' if a.required else 'optional'}: {a.description or 'text'})" for a in expected.values()
    ]
    return "its arguments: " + "; ".join(parts)


def _value_error(err: Any, expected: Mapping[str, PromptArgument]) -> str:
    arg = ".".join(str(p) for p in err["loc"]) or "arguments"
    desc = expected[arg].description if arg in expected else None
    return f"argument '{arg}'{f' ({desc})' if desc else ''}: {err['msg']}, got {err.get('input')!r}"
