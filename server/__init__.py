"""gpubox: an MCP server that turns one GPU box into tools.

Importing this package starts nothing and loads no heavy library; `build_server` is the one factory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from gpubox.app import build_server as build_server
    from gpubox.settings import Settings as Settings

__all__ = ["Settings", "__version__", "build_server"]


def __getattr__(name: str) -> Any:
    # Lazy so `import gpubox` stays cheap (mcp itself takes ~1 s to import).
    if name == "build_server":
        from gpubox.app import build_server

        return build_server
    if name == "Settings":
        from gpubox.settings import Settings

        return Settings
    raise AttributeError(name)
