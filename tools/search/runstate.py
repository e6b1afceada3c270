"""What an index's meta['run'] says about its last indexing run when no job in this process is building it."""

from __future__ import annotations

import os
from typing import Any

from gpubox.tools.search.schemas import IndexProgress, IndexState


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
