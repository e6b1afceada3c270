"""A crash mid-index keeps every committed batch, says so in search_list, and the next run resumes from there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpubox.settings import Settings
from gpubox.tools.search import vectors
from gpubox.tools.search.service import SearchService
from gpubox.tools.search.store import IndexStore
from tests.conftest import child_env
from tests.search.conftest import faiss_ids, finished, make_repo, snapshot

pytestmark = pytest.mark.slow

# The child indexes with small batches and kills itself (SIGKILL: no cleanup, no finally) right after commit
# STOP, first writing what that commit left on disk, read through a connection of its own.
CHILD = """
import json, os, signal, sys
from pathlib import Path
from gpubox.settings import Settings
from gpubox.tools.search.indexer import Progress, run_index
from gpubox.tools.search.service import SearchService
from gpubox.tools.search.walker import WalkOptions
from tests.search.conftest import snapshot

state, repo, out, stop = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
svc = SearchService(Settings.load(state_dir=Path(state), allowed_roots=[repo]))
store = svc.store("k", create=True)

def on_commit(n):
    if n == stop:
        out.write_text(json.dumps(snapshot(store.dir)))
        os.kill(os.getpid(), signal.SIGKILL)

run_index(repo, store, svc.embedder, WalkOptions(), Progress(), 200_000,
          commit_chunks=8, write_share=float("inf"), on_commit=on_commit)
raise SystemExit("the run finished before commit %d" % stop)
"""


def consistent(store: IndexStore) -> int:
    """The committed FAISS file matches the committed chunks; returns the chunk count."""
    meta = store.meta()
    _, chunks = store.counts()
    index = vectors.load((store.dir / meta["faiss_file"]).read_bytes())
    ids = sorted(r[0] for r in store.connect().execute("SELECT id FROM chunks"))
    assert faiss_ids(index) == ids
    assert sorted(p.name for p in store.dir.glob("vectors.*")) == [meta["faiss_file"]]
    return chunks


def test_a_failure_between_the_faiss_write_and_the_commit_keeps_the_old_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_repo(tmp_path / "repo")
    svc = SearchService(Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path]))
    finished(svc.start_index(str(repo), "r", [], [], None)[2])
    before = consistent(svc.store("r"))
    (repo / "inventory" / "extra.py").write_text("def brand_new_function():\n    return 42\n")
    real = IndexStore.set_meta

    def boom(db: Any, **values: Any) -> None:
        if "faiss_file" in values:  # the new FAISS file is on disk; the pointer to it never commits
            raise OSError("disk full (injected)")
        real(db, **values)

    monkeypatch.setattr(IndexStore, "set_meta", staticmethod(boom))
    progress = svc.start_index(str(repo), "r", [], [], None)[2]
    assert progress.done.wait(600)
    assert svc.info("r").state == "failed" and "disk full" in (svc.info("r").error or "")
    monkeypatch.undo()
    svc.close()
    reopened = SearchService(Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path]))
    assert consistent(reopened.store("r")) == before
    hits = reopened.search("retry_with_backoff", "r", 3, 0, None, None, "hybrid", 400).hits
    assert hits[0].symbol == "retry_with_backoff"
    hits = reopened.search("brand_new_function", "r", 20, 0, None, None, "lexical", 400).hits
    assert all(h.path != "inventory/extra.py" for h in hits)
    reopened.close()


def test_a_killed_run_keeps_its_last_committed_batch_and_the_next_run_resumes(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    settings = Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path])
    out = tmp_path / "committed.json"
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(settings.state_dir), str(repo), str(out), "2"],
        env={**child_env(tmp_path), "PYTHONPATH": str(root)},
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == -9, proc.stderr[-3000:]
    committed = json.loads(out.read_text())
    assert committed["run"]["commits"] == 2 and committed["run"]["state"] == "running"

    svc = SearchService(settings)
    store = svc.store("k")
    recovered = json.loads(json.dumps(snapshot(store.dir)))  # the same JSON shapes as the child's file
    assert recovered == committed  # exactly the last committed batch: nothing lost, nothing half-written
    assert consistent(store) == len(committed["chunks"]) > 0
    total_files = committed["run"]["files_total"]
    assert 0 < len(committed["files"]) < total_files

    info = svc.info("k")
    assert info.state == "interrupted" and info.progress is not None
    assert info.progress.files_done == len(committed["files"]) and info.progress.files_total == total_files
    assert "resume" in (info.error or "")
    some_path = committed["files"][0][0]
    hits = svc.search(Path(some_path).stem, "k", 10, 0, None, None, "lexical", 200).hits
    assert any(h.path == some_path for h in hits)  # committed batches are searchable meanwhile

    finished(svc.start_index(str(repo), "k", [], [], None)[2])
    report = svc._reports["k"]
    # only what the killed run had not committed is embedded again
    to_embed, embedded_before = committed["run"]["chunks_to_embed"], committed["run"]["chunks_embedded"]
    assert report.embedded_chunks == to_embed - embedded_before
    assert report.added_files == total_files - len(committed["files"]) and report.changed_files == 0
    assert svc.info("k").state == "ready" and svc.info("k").error is None
    assert consistent(store) == report.chunks
    hit = svc.search("levenshtein", "k", 1, 0, None, None, "hybrid", 400).hits[0]
    assert hit.symbol == "levenshtein"
    svc.close()


def _interrupted_after_first_commit(svc: SearchService, repo: Path) -> None:
    from gpubox.tools.search.indexer import Progress, run_index
    from gpubox.tools.search.walker import WalkOptions

    def stop(n: int) -> None:
        if n == 1:
            raise RuntimeError("killed after the first commit")

    with pytest.raises(RuntimeError, match="killed"):
        run_index(repo, svc.store("k"), svc.embedder, WalkOptions(), Progress(), 200_000,
                  commit_chunks=8, write_share=float("inf"), on_commit=stop)  # fmt: skip


def test_an_interrupted_rechunk_of_an_index_from_before_embed_tokens_keeps_its_vectors(tmp_path: Path) -> None:
    """An index built before `embed_tokens` was recorded was embedded at 256 tokens: an interrupted re-chunk of it
    must not turn that into 'unknown' and cost a full re-embedding next time."""
    from gpubox.tools.search.chunker import CHUNKER_VERSION

    repo = make_repo(tmp_path / "repo")
    svc = SearchService(Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path]))
    try:
        finished(svc.start_index(str(repo), "k", [], [], None)[2])
        store = svc.store("k")
        with store.transaction() as db:
            db.execute("DELETE FROM meta WHERE key = 'embed_tokens'")  # as an index of the previous release
            store.set_meta(db, chunker=CHUNKER_VERSION - 1)
        for i in range(20):  # new texts enough for several commits of 8
            (repo / f"helper_{i}.py").write_text(f"def helper_{i}():\n    return {i}\n")
        _interrupted_after_first_commit(svc, repo)
        assert store.meta()["embed_tokens"] == 256  # still known: this run only re-chunks
        finished(svc.start_index(str(repo), "k", [], [], None)[2])
        assert svc._reports["k"].embedded_chunks <= 20 - 8  # the new texts not yet committed, nothing else
    finally:
        svc.close()


def _indexed_with_defaults(tmp_path: Path) -> tuple[Path, Path, int]:
    """A repository indexed as 'k' with default settings: (repo, state dir, chunks embedded)."""
    repo = make_repo(tmp_path / "repo")
    state = tmp_path / "state"
    svc = SearchService(Settings.load(state_dir=state, allowed_roots=[tmp_path]))
    try:
        finished(svc.start_index(str(repo), "k", [], [], None)[2])
        return repo, state, svc._reports["k"].embedded_chunks
    finally:
        svc.close()


def test_an_interrupted_re_embedding_is_redone_whatever_the_setting_is_after(tmp_path: Path) -> None:
    """Cut from 256 to 128 tokens, killed after one commit, set back to 256: the files the killed run committed
    hold 128-token vectors, so the next run must embed everything again rather than trust their hashes."""
    repo, state, everything = _indexed_with_defaults(tmp_path)
    short = SearchService(Settings.load(state_dir=state, allowed_roots=[tmp_path], search_embed_max_tokens=128))
    try:
        _interrupted_after_first_commit(short, repo)
        assert short.store("k").meta()["embed_tokens"] is None  # mixed
    finally:
        short.close()
    back = SearchService(Settings.load(state_dir=state, allowed_roots=[tmp_path]))
    try:
        finished(back.start_index(str(repo), "k", [], [], None)[2])
        assert back._reports["k"].embedded_chunks == everything
        assert back.store("k").meta()["embed_tokens"] == 256
    finally:
        back.close()


def test_an_interrupted_switch_of_the_code_adapter_refuses_vectors_whatever_the_setting_is_after(
    tmp_path: Path,
) -> None:
    """Adapter turned on, the re-embedding killed after one commit: the index holds vectors of both variants, which
    no query vector suits, so vector search is refused with the adapter on or off until a run completes."""
    from gpubox.errors import InvalidInputError

    repo, state, everything = _indexed_with_defaults(tmp_path)
    on = SearchService(Settings.load(state_dir=state, allowed_roots=[tmp_path], search_code_adapter=True))
    try:
        _interrupted_after_first_commit(on, repo)
        assert on.store("k").meta()["adapter"] == "mixed"
        with pytest.raises(InvalidInputError, match="interrupted"):
            on.search("levenshtein", "k", 1, 0, None, None, "hybrid", 400)
    finally:
        on.close()
    off = SearchService(Settings.load(state_dir=state, allowed_roots=[tmp_path]))
    try:
        with pytest.raises(InvalidInputError, match="search_index"):
            off.search("levenshtein", "k", 1, 0, None, None, "vector", 400)
        assert off.search("levenshtein", "k", 1, 0, None, None, "lexical", 400).hits  # lexical still answers
        finished(off.start_index(str(repo), "k", [], [], None)[2])
        assert off._reports["k"].embedded_chunks == everything
        assert off.store("k").meta()["adapter"] is None
        assert off.search("levenshtein", "k", 1, 0, None, None, "hybrid", 400).hits[0].symbol == "levenshtein"
    finally:
        off.close()
