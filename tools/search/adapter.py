"""Search family: search_index, search_code, search_list, search_drop (thin adapters over SearchService)."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

import anyio
from mcp.server.mcpserver import Context, MCPServer
from pydantic import Field

from gpubox import services
from gpubox.registry import DESTRUCTIVE, READ_ONLY, WRITES, app_state, gpubox_tool
from gpubox.state import AppState
from gpubox.tools.search.schemas import DropResult, IndexList, IndexResult, SearchResults
from gpubox.tools.search.service import SearchService

IndexName = Annotated[str | None, Field(max_length=200, description="Default: the only index, or the directory name")]
Globs = Annotated[list[str] | None, Field(description="Globs relative to the root", max_length=50)]


def search_service(state: AppState) -> SearchService:
    return services.search(state)


def register(mcp: MCPServer[Any]) -> None:
    @gpubox_tool(mcp, annotations=WRITES, title="Index a repository", more=("max_file_bytes", "wait_seconds"))
    async def search_index(
        ctx: Context,
        path: Annotated[str, Field(description="Directory inside the allowed roots", min_length=1, max_length=4096)],
        name: IndexName = None,
        include: Globs = None,
        exclude: Globs = None,
        max_file_bytes: Annotated[int | None, Field(ge=1024, le=100_000_000, description="Skip larger files")] = None,
        dry_run: Annotated[bool, Field(description="Only estimate files, time and disk")] = False,
        wait_seconds: Annotated[
            float | None, Field(ge=0, le=3600, description="Return after this long; indexing continues")
        ] = None,
    ) -> IndexResult:
        """Index or re-index (incrementally) a code directory for search_code. Long runs continue in the
        background: poll search_list."""
        # the first call builds the service (its state dir, a dropped index's leftovers removed): off the event loop
        svc = await anyio.to_thread.run_sync(search_service, app_state(ctx))
        inc, exc = include or [], exclude or []
        if dry_run:
            return await anyio.to_thread.run_sync(lambda: svc.dry_run(path, name, inc, exc, max_file_bytes))
        idx, root, progress = await anyio.to_thread.run_sync(
            lambda: svc.start_index(path, name, inc, exc, max_file_bytes)
        )
        limit = svc.settings.search_index_wait_seconds if wait_seconds is None else wait_seconds
        deadline = time.monotonic() + limit
        last, reported = None, -1.0
        while progress.finished is None and time.monotonic() < deadline:
            msg, percent = progress.message(), round(100 * progress.fraction(), 1)
            if msg != last and percent > reported:  # the counts go in the message; the figure only grows
                await ctx.report_progress(percent, 100, message=msg)
                last, reported = msg, percent
            await anyio.sleep(0.2)
        return svc.result(idx, root, progress)

    @gpubox_tool(mcp, annotations=READ_ONLY, title="Search code", more=("path_glob", "language", "snippet_chars"))
    def search_code(
        ctx: Context,
        query: Annotated[str, Field(description="What the code does, or identifiers", min_length=1, max_length=2000)],
        index: IndexName = None,
        k: Annotated[int, Field(ge=1, le=100, description="Hits per page")] = 10,
        offset: Annotated[int, Field(ge=0, le=10_000)] = 0,
        path_glob: Annotated[str | None, Field(max_length=1000, description="e.g. 'src/*.py'")] = None,
        language: Annotated[str | None, Field(max_length=64, description="e.g. 'python'")] = None,
        mode: Literal["hybrid", "vector", "lexical"] = "hybrid",
        snippet_chars: Annotated[int, Field(ge=80, le=20_000)] = 800,
    ) -> SearchResults:
        """Find code by meaning or name in an index: file, lines, symbol and snippet per hit; page with offset."""
        return search_service(app_state(ctx)).search(query, index, k, offset, path_glob, language, mode, snippet_chars)

    @gpubox_tool(mcp, annotations=READ_ONLY, title="List indexes")
    def search_list(ctx: Context) -> IndexList:
        """Every code index with its root, size, last indexed time and indexing state."""
        return search_service(app_state(ctx)).list()

    @gpubox_tool(mcp, annotations=DESTRUCTIVE, title="Drop an index")
    def search_drop(ctx: Context, name: Annotated[str, Field(min_length=1, max_length=64)]) -> DropResult:
        """Delete a code index (the indexed source is untouched)."""
        return search_service(app_state(ctx)).drop(name)
