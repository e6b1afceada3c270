"""Allowed-root checks: every path a tool reads must resolve inside one of the configured roots.

Two rules keep the checks honest:
- relative paths are taken against the one allowed root, never the server's working directory (which is
  wherever the MCP host happened to start us); with several roots they are ambiguous and refused;
- errors never say where a symlink points or whether something outside the roots exists, so the tools
  cannot be used to probe the rest of the file system.

Checking a path and opening it later is a race (the file can be swapped for a symlink in between), so
`open_inside` re-checks at open time: it walks the resolved path from `/` one component at a time with
O_NOFOLLOW, so a symlink that appeared anywhere on the way fails the open.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from gpubox.errors import InvalidInputError, NotFoundError, PathNotAllowedError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # opening a FIFO must not block; it is refused as not regular after
_AT_OPEN_CHECK = bool(_NOFOLLOW and _DIRECTORY) and os.open in os.supports_dir_fd


def _outside(what: str, given: str, roots: Sequence[Path]) -> PathNotAllowedError:
    shown = ", ".join(str(r) for r in roots)
    return PathNotAllowedError(
        f"{what} {given} is outside the allowed roots ({shown}). "
        "Add its directory with --allowed-root / GPUBOX_ALLOWED_ROOTS, or pass a path inside them."
    )


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == r or path.is_relative_to(r) for r in roots)


def resolve_inside(path: str | Path, roots: Sequence[Path], *, what: str = "path", must_exist: bool = True) -> Path:
    """Resolve `path` (following symlinks, collapsing ..) and require it inside a root.

    A symlink that points outside is refused even when the link itself lies inside, because reading it
    would read outside. Raises InvalidInputError (NUL byte, ambiguous relative path), PathNotAllowedError
    (outside every root; the message does not reveal what is there) or NotFoundError (inside, missing).
    """
    given = str(path)
    if "\x00" in given:
        raise InvalidInputError(f"{what} contains a NUL byte; pass a plain path inside the allowed roots")
    if not roots:
        raise PathNotAllowedError("no allowed roots are configured; set GPUBOX_ALLOWED_ROOTS or --allowed-root")
    resolved_roots = [Path(r).resolve() for r in roots]
    raw = Path(given).expanduser() if given.startswith("~") else Path(given)
    if not raw.is_absolute():
        if len(resolved_roots) != 1:
            shown = ", ".join(str(r) for r in resolved_roots)
            raise InvalidInputError(
                f"relative {what} '{given}' is ambiguous with several allowed roots ({shown}); pass an absolute path"
            )
        raw = resolved_roots[0] / raw
    try:
        resolved = raw.resolve()
    except (OSError, RuntimeError):  # a symlink loop, a name too long
        raise _outside(what, given, resolved_roots) from None
    if not _inside(resolved, resolved_roots):
        raise _outside(what, given, resolved_roots)
    if must_exist and not resolved.exists():
        raise NotFoundError(f"{what} {given} does not exist inside the allowed roots")
    return resolved


def open_inside(path: str | Path, roots: Sequence[Path], *, what: str = "file") -> BinaryIO:
    """Open a regular file inside the allowed roots for binary reading, checked again at open time.

    The caller closes the returned file (use it in a `with`). A path that was swapped for a symlink, or
    is not a regular file (directory, FIFO, device), is refused without saying what it turned into.
    """
    resolved = resolve_inside(path, roots, what=what)
    if not _AT_OPEN_CHECK:  # no O_NOFOLLOW / dir_fd (Windows): re-resolve and verify right before opening
        if resolved.is_symlink() or not _inside(resolved.resolve(), [Path(r).resolve() for r in roots]):
            raise _outside(what, str(path), roots)
        if not resolved.is_file():
            raise InvalidInputError(f"{what} {path} is not a regular file")
        return resolved.open("rb")
    fd = _open_nofollow(resolved, what, str(path), roots)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InvalidInputError(f"{what} {path} is not a regular file")
    os.set_blocking(fd, True)  # opened non-blocking only so that a FIFO could not hang the open
    return os.fdopen(fd, "rb")


def _open_nofollow(resolved: Path, what: str, given: str, roots: Sequence[Path]) -> int:
    names = resolved.parts[1:]
    if not names:
        raise InvalidInputError(f"{what} {given} is not a regular file")
    try:
        fd = os.open(resolved.anchor or "/", os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    except OSError as exc:
        raise NotFoundError(f"{what} {given} cannot be opened ({os.strerror(exc.errno or 0)})") from None
    try:
        for name in names[:-1]:
            nxt = os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.open(names[-1], os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a component became a symlink after the check
            raise _outside(what, given, roots) from None
        if exc.errno == errno.ENOENT:
            raise NotFoundError(f"{what} {given} does not exist inside the allowed roots") from None
        raise NotFoundError(f"{what} {given} cannot be opened ({os.strerror(exc.errno or 0)})") from None
    finally:
        os.close(fd)
