"""The one progress callback type every family reports long work through: MCP's progress notification
(`ctx.report_progress(progress, total, message)`), so a tool passes it straight through."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

Progress = Callable[[float, float | None, str | None], Awaitable[None]]
