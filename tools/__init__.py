"""gpubox.tools: one package per tool family; this tuple is the registry."""

from __future__ import annotations

from types import ModuleType


def families() -> tuple[ModuleType, ...]:
    """Every family module, each exposing `register(mcp)`. Importing them loads no heavy library."""
    from gpubox.tools import estimate, gpu, inference, search

    return (gpu, estimate, search, inference)
