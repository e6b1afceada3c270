"""build_server(settings) -> MCPServer: the one factory every transport and test uses."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, GetPromptResult, InputRequiredResult, TextContent
from mcp.types import Tool as MCPTool
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse

from gpubox import __version__
from gpubox.auth import StaticTokenVerifier, auth_settings
from gpubox.settings import Settings
from gpubox.state import AppState

log = logging.getLogger("gpubox")

INSTRUCTIONS = """gpubox runs one GPU box as tools:
gpu_status: GPU and host telemetry, this session's cost.
box_plan: what fits in memory now, who holds it.
estimate_*: memory, speed and cost before running.
infer_*: load local models, chat and complete.
serve_*: run a model in vLLM so many clients share it; infer_* for it go there.
search_*: index local repositories, search their code.
finetune_*: plan, run, watch and merge LoRA/QLoRA jobs.
bench_*: measure attention kernels and the device.
Errors name the next step; a missing GPU or extra is reported as data."""


class GpuboxServer(MCPServer[AppState]):
    """An MCPServer that owns its AppState: the state lives exactly as long as the server object.

    Static resources get no Context in the SDK, so they reach the state through the server they were
    registered on; keeping it on the object (not in a module-level table) lets both be freed together.
    """

    def __init__(self, state: AppState, name: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.state = state
        self._parameters: dict[str, set[str]] | None = None  # per tool, the names its signature takes
        self._schemas: dict[str, dict[str, Any]] = {}  # per tool, its full input schema (booleans for numbers)

    async def full_schemas(self) -> dict[str, dict[str, Any]]:
        """Every tool's input schema with all its parameters (nothing folded into `more`) and every bound."""
        from gpubox.schema_compact import compact

        return {t.name: compact(t.input_schema, guards=True) for t in await super().list_tools()}

    async def list_tools(self) -> list[MCPTool]:
        """The SDK's tools/list with compact input schemas (gpubox.schema_compact: same constraints, fewer tokens)
        and rarely needed parameters folded into `more` (gpubox.arguments)."""
        from gpubox.arguments import fold
        from gpubox.registry import folded_parameters
        from gpubox.schema_compact import compact

        folded = folded_parameters(self)
        tools = await super().list_tools()
        for t in tools:
            t.input_schema = compact(fold(t.name, t.input_schema, folded.get(t.name, ())))
            if t.description:  # a docstring's line breaks and indentation are tokens too
                t.description = " ".join(t.description.split())
        return tools

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[AppState, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        """The SDK's tools/call with `more` unfolded, names the tool does not take refused (the SDK ignores them),
        and compact JSON text (the SDK indents it: a third more tokens for nothing)."""
        from gpubox.arguments import invalid_arguments, no_booleans, unfold
        from gpubox.errors import InvalidInputError, UnknownNameError
        from gpubox.registry import folded_parameters

        if self._parameters is None or name not in self._parameters:  # built once; again for a tool added later
            schemas = await self.full_schemas()
            self._parameters = {n: set(s.get("properties", {})) for n, s in schemas.items()}
            self._schemas = schemas
        if name not in self._parameters:  # the SDK's "Unknown tool: <name>" echoed a 1 MB name whole
            text = str(UnknownNameError("tool", name, self._parameters, "tools/list shows them."))
            return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)
        try:
            arguments = unfold(name, arguments, self._parameters[name], folded_parameters(self).get(name, ()))
            no_booleans(arguments, self._schemas[name])
        except InvalidInputError as exc:
            return CallToolResult(content=[TextContent(type="text", text=str(exc))], is_error=True)
        try:
            result = await super().call_tool(name, arguments, context)
        except ToolError as exc:  # pydantic's text names an internal model and links its docs on every error
            # only the caller's arguments: UnexpectedToolError (a crash, a result that fails its schema) stays masked
            if type(exc) is not ToolError or not isinstance(exc.__cause__, ValidationError):
                raise
            raise ToolError(f"Error executing tool {name}: {invalid_arguments(exc.__cause__)}") from exc.__cause__
        if isinstance(result, CallToolResult):
            for block in result.content:
                if isinstance(block, TextContent) and block.text[:1] in ("{", "["):
                    block.text = compact_json_text(block.text)
        return result

    async def get_prompt(
        self, name: str, arguments: dict[str, Any] | None = None, context: Context[AppState, Any] | None = None
    ) -> GetPromptResult | InputRequiredResult:
        """The SDK's prompts/get, with argument errors as invalid params naming the argument (not an internal
        error): see gpubox.prompts.checked_get."""
        from gpubox.prompts import checked_get

        return await checked_get(
            self, name, arguments, lambda: super(GpuboxServer, self).get_prompt(name, arguments, context)
        )


def build_server(settings: Settings | None = None, *, state: AppState | None = None) -> GpuboxServer:
    """Create the gpubox MCP server. Heavy state lives in one AppState per server (shared across SSE
    connections, whose lifespan runs per connection)."""
    settings = settings if settings is not None else Settings.load()
    state = state if state is not None else AppState(settings)

    @asynccontextmanager
    async def lifespan(_: MCPServer[AppState]) -> AsyncIterator[AppState]:
        yield state  # never builds or tears down state: see module docstring of gpubox.state

    token = settings.resolved_token()
    mcp = GpuboxServer(
        state,
        "gpubox",
        title="gpubox",
        version=__version__,
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
        token_verifier=StaticTokenVerifier(token) if token else None,
        auth=auth_settings() if token else None,
        log_level=settings.log_level,
    )

    from gpubox import prompts, resources, tools
    from gpubox.registry import registered_tools
    from gpubox.toolsets import Toolset

    toolset = Toolset(settings.tools)
    for family in tools.families():
        family.register(mcp)
    names = registered_tools(mcp)
    toolset.check(names)
    for name in names:
        if not toolset.exposes_tool(name):
            mcp.remove_tool(name)
    resources.register(mcp, toolset.families())
    prompts.register(mcp, toolset.families())
    _register_tool_schemas(mcp)

    @mcp.custom_route("/health", methods=["GET"])
    async def health(_: Request) -> JSONResponse:
        # Unauthenticated by design (SDK custom routes are): reveals only liveness and version.
        return JSONResponse({"status": "ok", "name": "gpubox", "version": __version__})

    return mcp


def _register_tool_schemas(mcp: GpuboxServer) -> None:
    from gpubox.errors import UnknownNameError
    from gpubox.registry import gpubox_resource

    @gpubox_resource(mcp, "gpubox://tools/{name}", name="tool_schema", title="A tool's full input schema")
    async def tool_schema(name: str) -> str:
        """Every parameter of a tool, those tools/list folds into `more` included: type, bounds, default."""
        schemas = await mcp.full_schemas()
        if name not in schemas:
            raise UnknownNameError("tool", name, schemas)
        return json.dumps(schemas[name], separators=(",", ":"))


def compact_json_text(text: str) -> str:
    try:
        return json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)
    except ValueError:  # text that only starts like JSON stays as it is
        return text


def state_of(mcp: MCPServer[Any]) -> AppState:
    """The AppState build_server created for `mcp`."""
    if not isinstance(mcp, GpuboxServer):
        raise TypeError(f"{mcp!r} was not made by gpubox.app.build_server; it has no AppState")
    return mcp.state
