from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpubox.app import build_server, state_of
from gpubox.settings import Settings
from gpubox.tools.search import vectors
from gpubox.tools.search.indexer import Progress
from gpubox.tools.search.store import IndexStore
from tests.conftest import DATA

# Every test here is marked requires_search and requires_models (the bundled MiniLM): FOLDER_MARKS in
# tests/conftest.py.


def make_repo(dest: Path) -> Path:
    """A copy of tests/data/sample_repo plus the files its .gitignore must keep out (git would not commit them)."""
    shutil.copytree(DATA / "sample_repo", dest)
    (dest / "app.log").write_text("2026-01-01 started\n")
    (dest / "secrets.txt").write_text("api_key=do-not-index-me\n")
    (dest / "generated").mkdir()
    (dest / "generated" / "schema.py").write_text("SCHEMA = 'ignored by .gitignore'\n")
    (dest / "build").mkdir()
    (dest / "build" / "out.js").write_text("console.log('built');\n")
    return dest


def finished(progress: Progress, timeout: float = 600) -> Progress:
    """Wait for an indexing job (event-driven, no polling) and require that it succeeded."""
    assert progress.done.wait(timeout), "indexing did not finish"
    assert progress.error is None, progress.error
    return progress


def faiss_ids(index: Any) -> list[int]:
    """The row ids a FAISS IndexIDMap holds, sorted."""
    import faiss

    return sorted(int(i) for i in faiss.vector_to_array(index.id_map))


def snapshot(directory: Path) -> dict[str, Any]:
    """What an index folder has committed: files with hashes, chunks, the FAISS pointer and the ids in that FAISS
    file (test_crash_safety.py's killed child writes this too, so it lives here, not in a test module)."""
    store = IndexStore(directory)
    try:
        db = store.connect()
        meta = store.meta()
        index = vectors.load((directory / meta["faiss_file"]).read_bytes())
        return {
            "files": sorted(db.execute("SELECT path, hash FROM files").fetchall()),
            "chunks": sorted(db.execute("SELECT id, path, start_line, text_hash FROM chunks").fetchall()),
            "generation": meta["generation"],
            "faiss_file": meta["faiss_file"],
            "faiss_ids": faiss_ids(index),
            "run": meta["run"],
        }
    finally:
        store.close()


@pytest.fixture(scope="module")
def search_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, Path, Settings]]:
    """One server per module so the embedding model loads once."""
    base = tmp_path_factory.mktemp("search")
    root = base / "root"
    root.mkdir()
    settings = Settings.load(state_dir=base / "state", allowed_roots=[root], search_index_wait_seconds=120)
    mcp = build_server(settings)
    yield mcp, root, settings
    state_of(mcp).close()
