"""Search hardening: connections closed, queries during indexing, reads contained at open time, bad paths."""

from __future__ import annotations

import os
import shutil
import sysconfig
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.errors import InvalidInputError
from gpubox.settings import Settings
from gpubox.tools.search import indexer
from gpubox.tools.search.service import SearchService
from gpubox.tools.search.store import IndexStore
from tests.conftest import call_err
from tests.search.conftest import finished, make_repo


def open_db_files(directory: Path) -> list[str]:
    """Files under `directory` this process holds open (Linux /proc)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory)):
            out.append(target)
    return out


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[SearchService]:
    root = tmp_path / "root"
    root.mkdir()
    service = SearchService(Settings.load(state_dir=tmp_path / "state", allowed_roots=[root]))
    yield service
    service.close()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux /proc to see open files")
def test_closing_a_store_closes_the_connections_of_every_thread(tmp_path: Path) -> None:
    store = IndexStore(tmp_path / "idx")
    with ThreadPoolExecutor(max_workers=3) as pool:  # threads that outlive their request, like anyio's workers
        barrier = threading.Barrier(3)

        def use() -> int:
            barrier.wait()  # all three threads exist at once, so each opens its own connection
            return store.counts()[1]

        assert list(pool.map(lambda _: use(), range(3))) == [0, 0, 0]
        assert store.open_connections() >= 3 and open_db_files(tmp_path / "idx")
        store.close()
        assert open_db_files(tmp_path / "idx") == []
    assert store.counts() == (0, 0)  # a closed store reconnects on demand
    store.close()
    assert open_db_files(tmp_path / "idx") == []


@pytest.mark.slow
def test_a_query_answers_within_a_few_small_batches_while_another_index_embeds(
    svc: SearchService, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = svc.settings.allowed_roots[0]
    sample = make_repo(root / "sample")
    big = root / "starlette"  # a real repository with more than 256 chunks to embed
    shutil.copytree(
        Path(sysconfig.get_paths()["purelib"]) / "starlette", big, ignore=shutil.ignore_patterns("__pycache__")
    )
    finished(svc.start_index(str(sample), "sample", [], [], None)[2])
    assert svc.search("retry", "sample", 1, 0, None, None, "hybrid", 200).hits  # FAISS loaded, model warm

    embedding = threading.Event()
    real = svc.embedder.encode

    def spy(texts: list[str], *args: Any, **kwargs: Any) -> Any:
        if len(texts) > 1:  # indexing (a query encodes one text)
            embedding.set()
        return real(texts, *args, **kwargs)

    monkeypatch.setattr(svc.embedder, "encode", spy)
    _, _, progress = svc.start_index(str(big), "big", [], [], None)
    try:
        assert embedding.wait(600)
        before = progress.chunks_embedded
        hits = svc.search("exponential backoff retry", "sample", 3, 0, None, None, "hybrid", 200).hits
        after = progress.chunks_embedded
        assert hits[0].symbol == "retry_with_backoff"
        # the query waited for the one small batch in flight, not for a 256-chunk batch or the whole run
        assert progress.chunks_to_embed > 256 and after - before < 256, (before, after, progress.chunks_to_embed)
    finally:
        progress.cancel.set()
        progress.done.wait(600)


def test_a_symlinked_gitignore_outside_the_root_is_not_read(svc: SearchService, tmp_path: Path) -> None:
    repo = make_repo(svc.settings.allowed_roots[0] / "repo")
    outside = tmp_path / "outside-rules"
    outside.write_text("*.py\n*.go\n")
    (repo / ".gitignore").unlink()
    (repo / ".gitignore").symlink_to(outside)
    res = svc.dry_run(str(repo), "repo", [], [], None)
    # the outside rules would have excluded every Python and Go file
    assert res.languages["python"] >= 8 and res.languages["go"] >= 1
    assert "symlink" in res.excluded


@pytest.mark.slow
def test_a_file_swapped_for_a_symlink_after_the_walk_is_not_read(
    svc: SearchService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_repo(svc.settings.allowed_roots[0] / "repo")
    secret = tmp_path / "secret.py"
    secret.write_text("def leaked_secret():\n    return 'TOPSECRET-7f3a'\n")
    real_walk = indexer.walk

    def walk_then_swap(root: Path, options: Any) -> Any:
        result = real_walk(root, options)  # the walker saw a regular file...
        (repo / "inventory" / "auth.py").unlink()
        (repo / "inventory" / "auth.py").symlink_to(secret)  # ...which becomes a link before it is read
        return result

    monkeypatch.setattr(indexer, "walk", walk_then_swap)
    _, _, progress = svc.start_index(str(repo), "repo", ["inventory/*.py"], [], None)
    finished(progress)
    report = svc._reports["repo"]
    assert report.excluded["unreadable or replaced since the walk"] == 1
    texts = [t for (t,) in svc.store("repo").connect().execute("SELECT text FROM chunks")]
    assert texts and not any("TOPSECRET" in t or "leaked_secret" in t for t in texts)
    assert not svc.search("TOPSECRET leaked_secret", "repo", 5, 0, None, None, "lexical", 200).hits


def test_relative_paths_resolve_against_the_only_root_not_the_working_directory(
    svc: SearchService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_repo(svc.settings.allowed_roots[0] / "repo")
    elsewhere = tmp_path / "cwd"
    (elsewhere / "repo").mkdir(parents=True)
    monkeypatch.chdir(elsewhere)
    res = svc.dry_run("repo", None, [], [], None)
    assert res.root == str(svc.settings.allowed_roots[0] / "repo") and res.files >= 20


def test_a_relative_path_with_several_roots_asks_for_an_absolute_one(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    make_repo(a / "repo")
    (b / "repo").mkdir(parents=True)
    svc = SearchService(Settings.load(state_dir=tmp_path / "state", allowed_roots=[a, b]))
    with pytest.raises(InvalidInputError, match="absolute"):
        svc.dry_run("repo", None, [], [], None)
    assert svc.dry_run(str(a / "repo"), None, [], [], None).files >= 20
    svc.close()


@pytest.mark.anyio
async def test_bad_paths_get_clean_errors_that_reveal_nothing_outside_the_roots(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    hidden = tmp_path / "hidden-target-dir"
    hidden.mkdir()
    (root / "escape").symlink_to(hidden, target_is_directory=True)
    (root / "dangling").symlink_to(tmp_path / "no-such-dir", target_is_directory=True)
    mcp = build_server(Settings.load(state_dir=tmp_path / "state", allowed_roots=[root]))
    try:
        async with Client(mcp) as client:
            assert "NUL" in await call_err(client, "search_index", path=f"{root}/re\x00po", dry_run=True)
            texts = {}
            for link in ("escape", "dangling"):
                texts[link] = await call_err(client, "search_index", path=str(root / link), dry_run=True)
                assert "outside the allowed roots" in texts[link]
                assert "hidden-target-dir" not in texts[link] and "no-such-dir" not in texts[link]
            # an existing and a missing target read the same, so the error is no probe for what exists outside
            assert texts["escape"].replace("escape", "X") == texts["dangling"].replace("dangling", "X")
    finally:
        state_of(mcp).close()


def test_a_dry_runs_default_rate_follows_the_precision_the_model_will_run_in(tmp_path: Path) -> None:
    from gpubox.tools.search import preview

    (tmp_path / "root").mkdir()
    repo = make_repo(tmp_path / "root" / "repo")
    rates = {}
    for dtype in ("float32", "bfloat16"):
        settings = Settings.load(
            state_dir=tmp_path / dtype, allowed_roots=[tmp_path / "root"], search_embed_dtype=dtype
        )
        service = SearchService(settings)
        try:
            res = service.dry_run(str(repo), "repo", [], [], None)
            assert not service.embedder.loaded  # a dry run loads no model
        finally:
            service.close()
        assert res.dry_run is not None
        rates[dtype] = (res.dry_run.rate_source, res.dry_run.estimated_seconds)
    assert rates["float32"][0].startswith("default for cpu ") and "cpu-bf16" in rates["bfloat16"][0], rates
    ratio = preview.DEFAULT_RATE["cpu-bf16"] / preview.DEFAULT_RATE["cpu"]
    assert rates["float32"][1] == pytest.approx(rates["bfloat16"][1] * ratio, rel=0.05), rates


def test_a_second_start_while_a_finished_run_still_releases_its_memory_is_told_it_runs(
    svc: SearchService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between a run's phase turning "ready" and its reservation's release, a second start of the same index gets
    'already being built', not the ledger's 'already holds a reservation' (a drop is told it waits for the run);
    once released, it starts."""
    from gpubox.errors import BusyError

    root = svc.settings.allowed_roots[0]
    repo = make_repo(root / "settling")
    settling, go_on = threading.Event(), threading.Event()
    settle = SearchService._settle

    def slow_settle(self: SearchService, owner: str, growth: Any) -> None:
        settling.set()
        assert go_on.wait(60)
        settle(self, owner, growth)

    monkeypatch.setattr(SearchService, "_settle", slow_settle)
    progress = svc.start_index(str(repo), "settling", [], [], None)[2]
    try:
        assert settling.wait(600)
        assert progress.phase == "ready" and progress.finished is None
        with pytest.raises(BusyError, match="already being built"):
            svc.start_index(str(repo), "settling", [], [], None)
        with pytest.raises(BusyError, match="not dropped while the run goes on"):
            svc.drop("settling")
    finally:
        go_on.set()
    finished(progress)
    again = finished(svc.start_index(str(repo), "settling", [], [], None)[2])
    assert again.phase == "ready"


@pytest.mark.parametrize(
    ("folder", "name"), [(".dotrepo", "dotrepo"), ("ñandú", "nandu"), ("my repo", "my-repo"), ("中文", "root")]
)
def test_a_folder_name_no_index_name_can_hold_still_gives_one(svc: SearchService, folder: str, name: str) -> None:
    (svc.settings.allowed_roots[0] / folder).mkdir()
    (svc.settings.allowed_roots[0] / folder / "a.py").write_text("def a():\n    return 1\n")
    assert svc.dry_run(str(svc.settings.allowed_roots[0] / folder), None, [], [], None).name == name


def test_index_progress_only_grows_across_its_phases() -> None:
    """search_index reported files, then chunks, then files again: MCP progress must only increase."""
    from gpubox.tools.search.runstate import Progress

    p = Progress(files_total=200)
    seen = []
    for phase, files, chunks in [
        ("walking", 0, 0), ("chunking", 100, 0), ("chunking", 200, 0), ("embedding", 200, 0), ("embedding", 200, 300),
        ("writing", 120, 300), ("embedding", 120, 600), ("writing", 200, 1000), ("ready", 200, 1000),
    ]:  # fmt: skip
        p.phase, p.files_done, p.chunks_embedded, p.chunks_to_embed = phase, files, chunks, 1000
        seen.append(p.fraction())
    assert seen == sorted(seen) and seen[0] == 0.0 and seen[-1] == 1.0, seen
