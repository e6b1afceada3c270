"""What search_list and search_index report about an index: its state, progress and the error to act on.

Kept apart from service.py, which runs and searches indexes: this only reads an index's store, its run's progress
and the embedder's adapter, and says what they come to.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpubox.errors import InvalidInputError
from gpubox.tools.search.indexer import MIXED
from gpubox.tools.search.runstate import IndexReport, Progress, unfinished_run
from gpubox.tools.search.schemas import IndexInfo, IndexProgress, IndexResult, IndexState
from gpubox.tools.search.store import IndexStore


def progress_model(p: Progress) -> IndexProgress:
    return IndexProgress(
        phase=p.phase,
        files_done=p.files_done,
        files_total=p.files_total,
        chunks_embedded=p.chunks_embedded,
        chunks_to_embed=p.chunks_to_embed,
        elapsed_s=round((p.finished or time.time()) - p.started, 2),
    )


def adapter_changed(name: str, meta: dict[str, Any], adapter: str | None) -> str:
    was = meta.get("adapter")
    had = f"the code adapter {was}" if was and was != MIXED else "no code adapter"
    if was == MIXED:
        had = "and without the code adapter (a re-embedding run was interrupted)"
    now = f"the code adapter {adapter}" if adapter else "none (search_code_adapter is off)"
    return (
        f"index '{name}' holds vectors made with {had}; the server's model now has {now}, and the two do not mix. "
        f"Run search_index on it again (it embeds every chunk afresh), or search "
        "with mode='lexical' meanwhile"
    )


def unbuilt(name: str, job: Progress) -> IndexInfo:
    """An index whose first run has not committed anything (running, or failed before it did)."""
    return IndexInfo(
        name=name,
        root=None,
        files=0,
        chunks=0,
        model=None,
        dim=None,
        size_bytes=0,
        last_indexed=None,
        state="indexing" if job.finished is None else "failed",
        progress=progress_model(job),
        error=job.error,
    )


def damaged(name: str, exc: Exception) -> IndexInfo:
    """An index whose database cannot be read (DamagedIndexError's text says what to do)."""
    error = str(exc) if "search_drop" in str(exc) else f"index '{name}' is damaged ({exc}); search_drop it"
    return IndexInfo(
        name=name, root=None, files=0, chunks=0, model=None, dim=None, size_bytes=0, last_indexed=None,
        state="damaged", error=error,
    )  # fmt: skip


def describe(name: str, store: IndexStore, job: Progress | None, adapter: str | None) -> IndexInfo:
    running = job is not None and job.finished is None
    meta = store.meta()
    files, chunks = store.counts()
    state: IndexState = (
        "indexing" if running else ("failed" if job and job.error else ("ready" if meta.get("generation") else "empty"))
    )
    progress = progress_model(job) if job else None
    error = job.error if job else None
    unfinished = unfinished_run(meta) if job is None else None
    if unfinished is not None:
        state, progress, error = unfinished
    if state == "ready" and error is None and meta.get("adapter") != adapter:
        error = adapter_changed(name, meta, adapter)  # lexical answers, vectors are refused
    updated = meta.get("updated")
    return IndexInfo(
        name=name,
        root=meta.get("root"),
        files=files,
        chunks=chunks,
        model=meta.get("model"),
        dim=meta.get("dim"),
        size_bytes=store.size_bytes(),
        state=state,
        last_indexed=datetime.fromtimestamp(updated, UTC).isoformat(timespec="seconds") if updated else None,
        progress=progress,
        error=error,
    )


def run_result(name: str, root: Path, progress: Progress, report: IndexReport | None) -> IndexResult:
    """What search_index answers about a run: failed with its reason, still indexing, or done with its counts."""
    if progress.error:
        return IndexResult(
            name=name,
            root=str(root),
            state="failed",
            message=progress.error,
            progress=progress_model(progress),
        )
    if progress.finished is None:
        return IndexResult(
            name=name,
            root=str(root),
            state="indexing",
            progress=progress_model(progress),
            message=f"still indexing ({progress.message()}); it continues in the background: poll search_list",
        )
    r = report
    assert r is not None  # a finished run without an error has reported
    return IndexResult(
        name=name,
        root=str(root),
        state="ready",
        files=r.files,
        chunks=r.chunks,
        added_files=r.added_files,
        changed_files=r.changed_files,
        removed_files=r.removed_files,
        embedded_chunks=r.embedded_chunks,
        reused_chunks=r.reused_chunks,
        seconds=round(r.seconds, 3),
        excluded=dict(r.excluded),
        languages=dict(r.languages),
        progress=progress_model(progress),
        message="up to date" if not (r.added_files or r.changed_files or r.removed_files) else "indexed",
    )


def check_embedder(name: str, meta: dict[str, Any], model: str, adapter: str | None) -> None:
    """Refuse a vector search of an index built with another embedding model or adapter than the server's."""
    if meta.get("model") != model:
        raise InvalidInputError(
            f"index '{name}' was built with {meta.get('model')} but the server uses {model}; "
            "use mode='lexical', or search_drop and re-index"
        )
    if meta.get("adapter") != adapter:
        raise InvalidInputError(adapter_changed(name, meta, adapter))
