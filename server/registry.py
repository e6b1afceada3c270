"""Helpers shared by every family's thin adapter: annotations, error translation, state access.

Families register tools with `gpubox_tool(mcp, ...)` instead of `mcp.tool(...)` so that a GpuboxError
raised by a core module reaches the client as a ToolError whose message the model can act on.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from gpubox.errors import GpuboxError

if TYPE_CHECKING:
    from gpubox.state import AppState

F = TypeVar("F", bound=Callable[..., Any])

# Annotations, defined once: hosts use them to decide what needs a confirmation.
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
COMPUTE = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False)


def _translate(exc: GpuboxError) -> ToolError:
    return ToolError(str(exc))


def gpubox_tool(mcp: MCPServer[Any], *, annotations: ToolAnnotations, title: str | None = None) -> Callable[[F], F]:
    """Register `fn` as a tool; GpuboxError becomes ToolError, everything else stays masked by the SDK."""

    def decorator(fn: F) -> F:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def awrapper(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await fn(*args, **kwargs)
                except GpuboxError as exc:
                    raise _translate(exc) from exc

            wrapped: Any = awrapper
        else:

            @functools.wraps(fn)
            def swrapper(*args: Any, **kwargs: Any) -> Any:
                try:
                    return fn(*args, **kwargs)
                except GpuboxError as exc:
                    raise _translate(exc) from exc

            wrapped = swrapper
        mcp.tool(title=title, annotations=annotations)(wrapped)
        return fn

    return decorator


def app_state(ctx: Context[Any, Any]) -> AppState:
    """The process-wide AppState the lifespan handed out."""
    return ctx.request_context.lifespan_context
