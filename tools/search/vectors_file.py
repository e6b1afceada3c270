"""An index's FAISS file rebuilt from the vectors its database holds: when the file is missing or cannot be read
back (a truncated file failed every vector search, and an index run that found nothing changed left it so)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpubox.filelock import try_exclusive
from gpubox.settings import Settings
from gpubox.tools.search import vectors
from gpubox.tools.search.store import IndexStore, fsync_write


def rebuild_vectors(store: IndexStore, path: Path | None, dim: int, settings: Settings) -> Any:
    """The index built from SQLite's vectors, written back to `path` for the next start unless a run holds the
    index (it writes its own file)."""
    ids, blob = store.all_vectors(store.connect())
    index = vectors.build(ids, blob, dim, settings.search_ann_threshold)
    if path is not None and (held := try_exclusive(store.dir / "run.lock")) is not None:
        with held:
            fsync_write(path, vectors.serialize(index))
    return index
