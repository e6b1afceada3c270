"""An exclusive lock on a file, shared by every gpubox server on the box (each MCP client may start its own)."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path
from typing import IO


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if missing). flock belongs to the open file, so a second
    `exclusive` on the same path in the same process waits like any other: callers must not nest it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def try_exclusive(path: Path) -> IO[str] | None:
    """An exclusive flock on `path` taken at once, held until the returned file is closed; None when another
    process (or another open of the file here) holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "a")  # noqa: SIM115  (held open past this call: the lock lives as long as the file)
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        return None
    return fh
