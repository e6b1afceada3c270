"""An indexing run's state: its progress while it runs, its report, how it can end (cancelled, nothing to index),
and what an index's meta['run'] says about its last run when no job in this process is building it."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from gpubox.errors import BusyError, InvalidInputError
from gpubox.filelock import try_exclusive
from gpubox.tools.search.schemas import IndexProgress, IndexState


class Cancelled(Exception):
    pass


@dataclass
class Progress:
    phase: str = "queued"
    files_total: int = 0
    files_done: int = 0
    chunks_to_embed: int = 0
    chunks_embedded: int = 0
    started: float = field(default_factory=time.time)
    finished: float | None = None
    error: str | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)  # set once finished or error is final

    def fraction(self) -> float:
        """How far the run is, 0-1, over all its phases: reading files is the first tenth, embedding (and writing
        its batches) the rest. MCP progress must only increase: files, then chunks, went back to 0."""
        if self.phase in ("embedding", "writing"):
            return 0.1 + 0.9 * (self.chunks_embedded / self.chunks_to_embed if self.chunks_to_embed else 1.0)
        if self.phase == "ready":
            return 1.0
        return 0.1 * (self.files_done / self.files_total if self.files_total else 0.0)

    def message(self) -> str:
        if self.phase == "embedding":
            return f"embedding {self.chunks_embedded}/{self.chunks_to_embed} chunks"
        return f"{self.phase}: {self.files_done}/{self.files_total} files"


@dataclass
class IndexReport:
    files: int
    chunks: int
    added_files: int
    changed_files: int
    removed_files: int
    embedded_chunks: int
    reused_chunks: int
    seconds: float
    excluded: Counter[str]
    languages: Counter[str]


def ensure_not_running(progress: Progress | None, name: str, refused: str = "") -> None:
    """BusyError while a run of index `name` goes on; `refused` says what waits for it (a drop)."""
    # running until `finished`, which is set after the run's memory reservation is released: a run whose phase is
    # already "ready" (or that failed) still holds it for an instant, and a second start then would be refused by
    # the ledger with a confusing "already holds a reservation"
    if progress is not None and progress.finished is None:
        raise BusyError(
            f"index '{name}' is already being built ({progress.message()}){refused}; poll search_list until its state "
            "is no longer 'indexing'"
        )


class NothingToIndex(InvalidInputError):
    """The walk found no file to index in a tree with no index yet: nothing is kept, and the reason is given."""

    def __init__(self, root: str, excluded: Counter[str]) -> None:
        skipped = ", ".join(f"{n} {why}" for why, n in excluded.most_common(4))
        super().__init__(
            f"nothing to index under {root}: no source file found"
            + (f" (skipped: {skipped})" if skipped else " (the folder is empty)")
            + "; check the path, include/exclude globs and max_file_bytes (search_index dry_run=true previews)"
        )


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by another user
        return True
    return True


def unfinished_run(meta: dict[str, Any]) -> tuple[IndexState, IndexProgress, str | None] | None:
    """None when the last run finished; else its state ('indexing' in another live process, or 'interrupted'),
    progress as of its last committed batch, and for an interrupted run the message saying how to resume."""
    run = meta.get("run") or {}
    if run.get("state") != "running":
        return None
    pid = int(run.get("pid") or 0)
    started = float(run.get("started") or 0)
    progress = IndexProgress(
        phase="embedding",
        files_done=int(run.get("files_done") or 0),
        files_total=int(run.get("files_total") or 0),
        chunks_embedded=int(run.get("chunks_embedded") or 0),
        chunks_to_embed=int(run.get("chunks_to_embed") or 0),
        elapsed_s=round(max(0.0, float(meta.get("updated") or 0) - started), 2),
    )
    if pid != os.getpid() and pid_alive(pid):
        return "indexing", progress, None  # another server process on this state dir is building it
    progress.phase = "interrupted"
    return (
        "interrupted",
        progress,
        f"the last indexing run stopped before finishing: {progress.files_done}/{progress.files_total} changed files "
        f"committed ({progress.chunks_embedded}/{progress.chunks_to_embed} chunks embedded); the index keeps those. "
        "Call search_index again to resume from there.",
    )


def run_lock_of(base: Path, name: str, then: str = "search it") -> IO[str]:
    """The index's lock for a run (or a drop), across every gpubox server on the box: two servers indexing one
    index at once stored every chunk twice, for good."""
    held = try_exclusive(base / name / "run.lock")
    if held is None:
        raise BusyError(
            f"index '{name}' is being built by another gpubox server on this box; {then} when that run ends"
        )
    return held


def built_elsewhere(base: Path, name: str) -> bool:
    """Whether another server's run holds the index's lock now (a server's own runs are in its jobs)."""
    try:
        run_lock_of(base, name).close()
    except BusyError:
        return True
    return False
