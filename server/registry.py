"""Helpers shared by every family's thin adapter: annotations, error translation, state access.

Families register tools with `gpubox_tool(mcp, ...)` and resources with `gpubox_resource(mcp, uri, ...)`
instead of `mcp.tool(...)` / `mcp.resource(...)`, so a GpuboxError raised by a core module reaches the client
on the SDK's right channel with its message intact (the SDK masks any other exception):

    ConfigError                 -> MCPError (JSON-RPC error): the server is misconfigured; the host must act
    other GpuboxError in a tool -> ToolError (is_error result): the model reads the message and retries
                                   (an UpstreamError's message says the model server, not the arguments, is at
                                   fault, so the model fixes or detaches the server instead of new arguments)
    input errors in a resource  -> ResourceNotFoundError (-32602 invalid params): unknown name, bad path
    other GpuboxError there     -> ResourceError (-32603)
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import INTERNAL_ERROR, ToolAnnotations

from gpubox.errors import ConfigError, GpuboxError, InvalidInputError, NotFoundError, PathNotAllowedError

if TYPE_CHECKING:
    from gpubox.state import AppState

F = TypeVar("F", bound=Callable[..., Any])

# Annotations, defined once: hosts use them to decide what needs a confirmation.
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
COMPUTE = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
# starts new work on every call (a job, a benchmark run, a stored measurement): a host must not retry it on its own
STARTS = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False)


def _protocol_error(exc: ConfigError) -> MCPError:
    return MCPError(code=INTERNAL_ERROR, message=f"configuration error: {exc}", data={"error": "ConfigError"})


def _tool_error(exc: GpuboxError) -> Exception:
    return _protocol_error(exc) if isinstance(exc, ConfigError) else ToolError(str(exc))


def _resource_error(exc: GpuboxError) -> Exception:
    if isinstance(exc, ConfigError):
        return _protocol_error(exc)
    if isinstance(exc, InvalidInputError | NotFoundError | PathNotAllowedError):
        return ResourceNotFoundError(str(exc))
    return ResourceError(str(exc))


def _translating(fn: Callable[..., Any], translate: Callable[[GpuboxError], Exception]) -> Any:
    """`fn` with GpuboxError replaced by `translate(exc)`; sync stays sync (the SDK runs it in a thread)."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except GpuboxError as exc:
                raise translate(exc) from exc

        return awrapper

    @functools.wraps(fn)
    def swrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except GpuboxError as exc:
            raise translate(exc) from exc

    return swrapper


def gpubox_tool(
    mcp: MCPServer[Any], *, annotations: ToolAnnotations, title: str | None = None, more: Iterable[str] = ()
) -> Callable[[F], F]:
    """Register `fn` as a tool; GpuboxError becomes ToolError (ConfigError: MCPError), anything else stays
    masked by the SDK. `more` names the rarely needed parameters tools/list folds into one object
    (gpubox.arguments)."""

    def decorator(fn: F) -> F:
        mcp.tool(title=title, annotations=annotations)(_translating(fn, _tool_error))
        _REGISTERED.setdefault(mcp, []).append(fn.__name__)
        if more:
            _FOLDED.setdefault(mcp, {})[fn.__name__] = tuple(more)
        return fn

    return decorator


_REGISTERED: weakref.WeakKeyDictionary[MCPServer[Any], list[str]] = weakref.WeakKeyDictionary()
_FOLDED: weakref.WeakKeyDictionary[MCPServer[Any], dict[str, tuple[str, ...]]] = weakref.WeakKeyDictionary()


def folded_parameters(mcp: MCPServer[Any]) -> dict[str, tuple[str, ...]]:
    """Per tool, the parameters tools/list shows inside `more` (see gpubox.arguments)."""
    return dict(_FOLDED.get(mcp, {}))


def registered_tools(mcp: MCPServer[Any]) -> list[str]:
    """Names of the tools registered on `mcp` through gpubox_tool (the SDK lists tools only once serving)."""
    return list(_REGISTERED.get(mcp, []))


def gpubox_resource(
    mcp: MCPServer[Any],
    uri: str,
    *,
    name: str | None = None,
    title: str | None = None,
    mime_type: str | None = "application/json",
) -> Callable[[F], F]:
    """Register `fn` as a resource (or template, when `uri` has {variables}) with gpubox error translation."""

    def decorator(fn: F) -> F:
        mcp.resource(uri, name=name, title=title, mime_type=mime_type)(_translating(fn, _resource_error))
        return fn

    return decorator


def app_state(ctx: Context[Any, Any]) -> AppState:
    """The process-wide AppState the lifespan handed out."""
    return ctx.request_context.lifespan_context
