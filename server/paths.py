"""Allowed-root checks: every path a tool reads must resolve inside one of the configured roots."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpubox.errors import NotFoundError, PathNotAllowedError


def resolve_inside(path: str | Path, roots: Sequence[Path], *, what: str = "path") -> Path:
    """Resolve `path` (following symlinks, collapsing ..) and require it inside a root.

    Relative paths are taken relative to the first root. A symlink that points outside is refused even
    when the link itself lies inside, because reading it would read outside.
    """
    if not roots:
        raise PathNotAllowedError("no allowed roots are configured; set GPUBOX_ALLOWED_ROOTS or --allowed-root")
    raw = Path(path).expanduser()
    candidate = raw if raw.is_absolute() else roots[0] / raw
    resolved = candidate.resolve()
    for root in roots:
        root_r = root.resolve()
        if resolved == root_r or resolved.is_relative_to(root_r):
            if not resolved.exists():
                raise NotFoundError(f"{what} {resolved} does not exist")
            return resolved
    shown = ", ".join(str(r) for r in roots)
    raise PathNotAllowedError(
        f"{what} {raw} resolves to {resolved}, outside the allowed roots ({shown}). "
        "Add its directory with --allowed-root / GPUBOX_ALLOWED_ROOTS, or pass a path inside them."
    )
