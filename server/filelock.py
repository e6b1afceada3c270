"""An exclusive lock on a file, shared by every gpubox server on the box (each MCP client may start its own)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from gpubox.errors import GpuboxError


def _open(path: Path) -> IO[str]:
    """The lock file, created if missing; never through a symlink (a planted link had gpubox create files outside
    its state dir), and refused in one clear line when it cannot be opened (a folder in its place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise GpuboxError(
            f"the lock file {path} cannot be opened ({exc.strerror or exc}); remove whatever is in its place"
        ) from None
    return os.fdopen(fd, "a")


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if missing). flock belongs to the open file, so a second
    `exclusive` on the same path in the same process waits like any other: callers must not nest it."""
    with _open(path) as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def try_exclusive(path: Path) -> IO[str] | None:
    """An exclusive flock on `path` taken at once, held until the returned file is closed; None when another
    process (or another open of the file here) holds it."""
    fh = _open(path)  # held open past this call: the lock lives as long as the file
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException as exc:
        fh.close()  # ENOLCK and the like left the file open
        if isinstance(exc, BlockingIOError):
            return None
        raise
    return fh
