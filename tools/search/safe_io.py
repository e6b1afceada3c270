"""Paths and reads on a user's behalf that stay inside the allowed roots at the moment a file is opened.

Checking a path and reading it later is a race: a file swapped for a symlink in between would be read from
wherever the link points. So every read here walks the path one component at a time from `/` with O_NOFOLLOW
(a symlink anywhere fails the open) and only reads regular files. Failures are reported as "unreadable", never
with where a link points or whether something outside the roots exists.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from gpubox.errors import InvalidInputError, PathNotAllowedError
from gpubox.paths import resolve_inside

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO must not block the open; it is refused as not regular after
_ATOMIC = bool(_NOFOLLOW and _DIRECTORY) and os.open in os.supports_dir_fd


def resolve_root(path: str, roots: Sequence[Path], *, what: str = "directory") -> Path:
    """A user-given directory, resolved inside the allowed roots.

    Relative paths are taken against the only allowed root (never the server's working directory); with
    several roots they are ambiguous and refused. The error for a path outside does not echo where it resolves.
    """
    if "\x00" in path:
        raise InvalidInputError(f"{what} path contains a NUL byte; pass a plain path inside the allowed roots")
    roots = list(roots)
    shown = ", ".join(str(r) for r in roots)
    raw = Path(os.path.expanduser(path) if path == "~" or path.startswith("~/") else path)
    if not raw.is_absolute():
        if len(roots) != 1:
            raise InvalidInputError(
                f"relative {what} '{path}' is ambiguous with several allowed roots ({shown}); pass an absolute path"
            )
        raw = roots[0] / raw
    try:
        return resolve_inside(raw, roots, what=what)
    except PathNotAllowedError:
        # resolve_inside names the resolved target; a symlink's destination is not the caller's business
        raise PathNotAllowedError(
            f"{what} {path} is outside the allowed roots ({shown}). Add its directory with --allowed-root / "
            "GPUBOX_ALLOWED_ROOTS, or pass a path inside them."
        ) from None


def read_inside(root: Path, rel: str, limit: int | None = None) -> bytes | None:
    """The bytes of `root/rel` (at most `limit`), or None if any component is a symlink, the file is not a
    regular file, or it cannot be read. `root` is an absolute, resolved directory."""
    if not _ATOMIC:  # no O_NOFOLLOW/dir_fd (Windows): re-resolve and check right before reading
        full = root / rel
        try:
            if full.is_symlink() or not full.resolve().is_relative_to(root) or not full.is_file():
                return None
            with full.open("rb") as fh:
                return fh.read(limit) if limit is not None else fh.read()
        except OSError:
            return None
    root = root if root.is_absolute() else Path(os.path.abspath(root))
    names = [*root.parts[1:], *rel.split("/")]
    if any(n in ("", ".", "..") for n in names):
        return None
    try:
        fd = os.open(root.anchor or "/", os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    except OSError:
        return None
    try:
        for name in names[:-1]:
            nxt = os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        file_fd = os.open(names[-1], os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC, dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    with os.fdopen(file_fd, "rb") as fh:
        try:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return None
            return fh.read(limit) if limit is not None else fh.read()
        except OSError:
            return None
