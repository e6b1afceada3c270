"""A crash mid-index never leaves an index that loads wrong."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpubox.settings import Settings
from gpubox.tools.search import vectors
from gpubox.tools.search.service import SearchService
from gpubox.tools.search.store import IndexStore
from tests.conftest import GPUBOX, child_env
from tests.search.conftest import make_repo

pytestmark = pytest.mark.slow


def consistent(store: IndexStore) -> int:
    """The committed FAISS file matches the committed chunks; returns the chunk count."""
    meta = store.meta()
    _, chunks = store.counts()
    data = (store.dir / meta["faiss_file"]).read_bytes()
    assert vectors.load(data).ntotal == chunks
    assert sorted(p.name for p in store.dir.glob("vectors.*")) == [meta["faiss_file"]]
    return chunks


def wait_ready(svc: SearchService, name: str) -> None:
    for _ in range(1200):
        info = svc.info(name)
        if info.state in ("ready", "failed"):
            assert info.state == "ready", info.error
            return
        time.sleep(0.05)
    raise AssertionError("indexing did not finish")


def test_a_failure_between_the_faiss_write_and_the_commit_keeps_the_old_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_repo(tmp_path / "repo")
    svc = SearchService(Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path]))
    svc.start_index(str(repo), "r", [], [], None)
    wait_ready(svc, "r")
    before = consistent(svc.store("r"))
    (repo / "inventory" / "extra.py").write_text("def brand_new_function():\n    return 42\n")

    def boom(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full (injected)")

    monkeypatch.setattr(IndexStore, "set_meta", staticmethod(boom))
    svc.start_index(str(repo), "r", [], [], None)
    for _ in range(1200):
        if svc.info("r").state == "failed":
            break
        time.sleep(0.05)
    assert "disk full" in (svc.info("r").error or "")
    monkeypatch.undo()
    reopened = SearchService(Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path]))
    assert consistent(reopened.store("r")) == before
    hits = reopened.search("retry_with_backoff", "r", 3, 0, None, None, "hybrid", 400).hits
    assert hits[0].symbol == "retry_with_backoff"
    svc.close()
    reopened.close()


def test_a_killed_indexing_process_leaves_a_loadable_index(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    settings = Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path])
    svc = SearchService(settings)
    svc.start_index(str(repo), "k", [], [], None)
    wait_ready(svc, "k")
    before = consistent(svc.store("k"))
    svc.close()
    # many changed files so the second run spends seconds embedding before it writes
    for i in range(12):
        d = repo / f"copy{i}"
        d.mkdir()
        for src in (repo / "inventory").glob("*.py"):
            (d / src.name).write_text(src.read_text() + f"\n# variant {i}\nVARIANT_{i} = {i}\n")
    env = child_env(tmp_path, GPUBOX_ALLOWED_ROOTS=str(tmp_path), GPUBOX_LOG_LEVEL="INFO")
    log = tmp_path / "child.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [GPUBOX, "call", "search_index", f"path={repo}", "name=k", "wait_seconds=600", "--log-level", "INFO"],
            env=env, stdout=subprocess.DEVNULL, stderr=fh,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and b"loaded on" not in log.read_bytes():
            assert proc.poll() is None, log.read_text()
            time.sleep(0.05)
        time.sleep(0.5)  # inside the embedding loop
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    reopened = SearchService(settings)
    store = reopened.store("k")
    assert consistent(store) in (before, store.counts()[1])
    assert reopened.search("levenshtein", "k", 1, 0, None, None, "hybrid", 400).hits[0].symbol == "levenshtein"
    reopened.start_index(str(repo), "k", [], [], None)  # and the next run completes
    wait_ready(reopened, "k")
    assert consistent(reopened.store("k")) > before
    reopened.close()
