"""Moved to gpubox.paths (resolve_root is resolve_inside); kept until search/service.py imports from there."""

from gpubox.paths import read_inside, resolve_inside as resolve_root  # noqa: I001

__all__ = ["read_inside", "resolve_root"]
