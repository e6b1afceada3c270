"""Code search through the MCP tools with the bundled MiniLM model on a small real repository."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.settings import Settings
from gpubox.tools.search.adapter import search_service
from tests.conftest import call_err, call_ok, wait_until
from tests.search.conftest import finished, make_repo

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

# query -> (path, symbol) of the right answer
KNOWN = {
    "exponential backoff retry": ("inventory/retry.py", "retry_with_backoff"),
    "token bucket rate limiting": ("server/ratelimit.go", "RateLimiter"),
    "compute checksum of a byte buffer": ("native/crc32.c", "crc32"),
    "delay a function until the user stops typing": ("web/src/debounce.js", "debounce"),
    "charge a customer's card": ("billing/src/main/java/billing/PaymentGateway.java", "PaymentGateway"),
    "evict the least recently used entry": ("inventory/cache.py", "LRUCache"),
    "edit distance between two strings": ("engine/src/lib.rs", "levenshtein"),
    "hash a password with a salt": ("inventory/auth.py", "hash_password"),
}


@pytest.fixture(scope="module")
def repo(search_env: tuple[object, Path, Any]) -> Path:
    """The sample repository indexed as 'repo' (each test that reads it gets it built, so any test runs alone)."""
    path = make_repo(search_env[1] / "repo")
    svc = search_service(state_of(search_env[0]))
    finished(svc.start_index(str(path), "repo", [], [], None)[2])
    return path


async def test_index_then_known_queries_find_their_definitions(search_env: Any, repo: Path) -> None:
    mcp = search_env[0]
    async with Client(mcp) as client:
        res = await call_ok(client, "search_index", path=str(repo), name="repo")
        assert res["state"] == "ready" and res["files"] >= 20 and res["chunks"] >= 40
        assert set(res["languages"]) >= {"python", "go", "rust", "java", "c", "cpp", "javascript", "typescript"}
        for query, (path, symbol) in KNOWN.items():
            hits = (await call_ok(client, "search_code", query=query, index="repo", k=3))["hits"]
            assert any(h["path"] == path and h["symbol"] == symbol for h in hits), (query, hits)


async def test_identifiers_in_the_query_find_their_definition_first(search_env: Any, repo: Path) -> None:
    async with Client(search_env[0]) as client:
        for ident, path in [
            ("verify_password", "inventory/auth.py"),
            ("levenshtein", "engine/src/lib.rs"),
            ("RateLimiter", "server/ratelimit.go"),
            ("ringbuffer_pop", "native/ringbuffer.c"),
        ]:
            top = (await call_ok(client, "search_code", query=ident, index="repo", k=1))["hits"][0]
            assert top["path"] == path and top["symbol"] == ident and "symbol" in top["matched_by"]


async def test_hits_carry_lines_language_and_a_trimmed_snippet(search_env: Any, repo: Path) -> None:
    async with Client(search_env[0]) as client:
        hit = (await call_ok(client, "search_code", query="crc32", index="repo", k=1, snippet_chars=120))["hits"][0]
    lines = (repo / hit["path"]).read_text().splitlines()
    assert "crc32(" in "\n".join(lines[hit["start_line"] - 1 : hit["end_line"]])
    assert hit["language"] == "c" and len(hit["snippet"]) <= 120 and hit["snippet_truncated"]


async def test_ignore_rules_and_default_excludes_keep_files_out(search_env: Any, repo: Path) -> None:
    async with Client(search_env[0]) as client:
        res = await call_ok(client, "search_index", path=str(repo), name="repo", dry_run=True)
        excluded = res["excluded"]
        assert excluded.get(".gitignore", 0) >= 3  # app.log, secrets.txt, generated/, build/
        assert excluded.get("lock file") == 1 and excluded.get("generated") == 1  # package-lock, *.min.js
        assert any("node_modules" in k for k in excluded)
        res = await call_ok(client, "search_code", query="api_key do-not-index-me leftpad", index="repo", k=20)
        hits = res["hits"]
        assert hits  # an empty result would pass the next line
        assert not {h["path"] for h in hits} & {"secrets.txt", "node_modules/leftpad/index.js", "app.log"}


async def test_filters_modes_and_paging(search_env: Any, repo: Path) -> None:
    async with Client(search_env[0]) as client:
        go = await call_ok(client, "search_code", query="request handling", index="repo", language="go", k=5)
        assert go["hits"] and all(h["language"] == "go" for h in go["hits"])
        py = await call_ok(client, "search_code", query="items", index="repo", path_glob="inventory/*.py", k=5)
        assert py["hits"] and all(h["path"].startswith("inventory/") for h in py["hits"])
        lex = await call_ok(client, "search_code", query="pbkdf2_hmac", index="repo", mode="lexical", k=3)
        assert lex["hits"][0]["symbol"] == "hash_password" and lex["hits"][0]["matched_by"] == ["lexical"]
        vec = await call_ok(client, "search_code", query="circular queue of bytes", index="repo", mode="vector", k=3)
        assert any("ringbuffer" in h["path"] for h in vec["hits"])
        first = await call_ok(client, "search_code", query="function", index="repo", k=5)
        assert first["next_offset"] == 5
        second = await call_ok(client, "search_code", query="function", index="repo", k=5, offset=5)
        key = lambda h: (h["path"], h["start_line"])  # noqa: E731
        assert not {key(h) for h in first["hits"]} & {key(h) for h in second["hits"]}


@pytest.mark.parametrize("mode", ["vector", "lexical", "hybrid"])
async def test_following_next_offset_reaches_every_match_once(search_env: Any, mode: str) -> None:
    # 160 chunks that all match: the pages went on past the first ranked pool (next_offset was null at 50)
    many = search_env[1] / f"many_{mode}"
    many.mkdir()
    for i in range(80):
        body = "".join(
            f"def compute_thing_{i}_{j}(x):\n    return x * {i} + {j}  # compute thing number\n\n\n" for j in (0, 1)
        )
        (many / f"m{i}.py").write_text(body)
    async with Client(search_env[0]) as client:
        built = await call_ok(client, "search_index", path=str(many), name=f"many_{mode}")
        seen: list[tuple[str, int]] = []
        offset: int | None = 0
        while offset is not None:
            page = await call_ok(
                client, "search_code", query="compute thing number", index=f"many_{mode}", k=25, offset=offset,
                mode=mode,
            )  # fmt: skip
            seen += [(h["path"], h["start_line"]) for h in page["hits"]]
            offset = page["next_offset"]
            assert len(seen) <= built["chunks"] + 25
    assert len(seen) == len(set(seen)) == built["chunks"] == 160, (len(seen), len(set(seen)), built["chunks"])


async def test_dry_run_previews_counts_time_and_disk_without_embedding(search_env: Any, tmp_path: Path) -> None:
    fresh = make_repo(search_env[1] / "fresh")
    async with Client(search_env[0]) as client:
        res = await call_ok(client, "search_index", path=str(fresh), name="fresh", dry_run=True)
        assert res["state"] == "dry_run" and res["dry_run"]["chunks_to_embed"] == res["chunks"] > 0
        assert res["dry_run"]["estimated_seconds"] > 0 and res["dry_run"]["estimated_disk_bytes"] > 0
        assert res["dry_run"]["files_by_language"]["python"] >= 8
        names = {i["name"] for i in (await call_ok(client, "search_list"))["indexes"]}
        assert "fresh" not in names  # nothing was written
    shutil.rmtree(fresh)


async def test_incremental_reindex_after_edit_add_delete_and_rename(search_env: Any) -> None:
    repo = make_repo(search_env[1] / "inc")
    async with Client(search_env[0]) as client:
        first = await call_ok(client, "search_index", path=str(repo), name="inc")
        again = await call_ok(client, "search_index", path=str(repo), name="inc")
        assert again["message"] == "up to date" and again["embedded_chunks"] == 0 and again["chunks"] == first["chunks"]

        (repo / "inventory" / "retry.py").write_text(
            (repo / "inventory" / "retry.py").read_text() + "\n\ndef circuit_breaker_open(failures: int) -> bool:\n"
            '    """Trip the breaker after five consecutive failures."""\n    return failures >= 5\n'
        )  # edit
        (repo / "inventory" / "geo.py").write_text(
            'def haversine_km(lat1, lon1, lat2, lon2):\n    """Great-circle distance on Earth in kilometres."""\n'
            "    return 0.0\n"
        )  # add
        (repo / "inventory" / "csv_export.py").unlink()  # delete
        os.rename(repo / "engine" / "src" / "parser.rs", repo / "engine" / "src" / "lexer.rs")  # rename
        res = await call_ok(client, "search_index", path=str(repo), name="inc")
        assert (res["added_files"], res["changed_files"], res["removed_files"]) == (2, 1, 2)
        # the new function, the new file, and the renamed file's 3 chunks (the path is part of the embedded text)
        assert 0 < res["embedded_chunks"] <= 5
        assert res["reused_chunks"] >= 2  # retry.py's unchanged chunks

        hit = (await call_ok(client, "search_code", query="circuit_breaker_open", index="inc", k=1))["hits"][0]
        assert hit["path"] == "inventory/retry.py"
        hit = (await call_ok(client, "search_code", query="distance on earth", index="inc", k=1))["hits"][0]
        assert hit["path"] == "inventory/geo.py"
        hits = (await call_ok(client, "search_code", query="export_items_to_csv", index="inc", k=10))["hits"]
        assert all(h["path"] != "inventory/csv_export.py" for h in hits)
        hits = (await call_ok(client, "search_code", query="next_token", index="inc", k=3))["hits"]
        assert hits[0]["path"] == "engine/src/lexer.rs"
        info = await call_ok(client, "search_list")
        row = next(i for i in info["indexes"] if i["name"] == "inc")
        assert row["state"] == "ready" and row["files"] == first["files"] and row["last_indexed"]


async def test_paths_outside_the_allowed_roots_are_refused(search_env: Any, tmp_path: Path) -> None:
    root: Path = search_env[1]
    (root / "escape").symlink_to(tmp_path, target_is_directory=True)
    async with Client(search_env[0]) as client:
        for path in [str(tmp_path), str(root / ".." / ".."), str(root / "escape"), "/etc"]:
            assert "outside the allowed roots" in await call_err(client, "search_index", path=path)
    (root / "escape").unlink()


async def test_a_long_index_returns_early_and_finishes_in_the_background(search_env: Any) -> None:
    repo = make_repo(search_env[1] / "bg")
    events: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        events.append((progress, total, message))

    async with Client(search_env[0]) as client:
        result = await client.call_tool(
            "search_index", {"path": str(repo), "name": "bg", "wait_seconds": 0.5}, progress_callback=on_progress
        )
        first = result.structured_content
        assert first is not None
        if first["state"] == "indexing":
            assert "search_list" in first["message"]

        async def ready() -> dict[str, Any] | None:
            row = next(i for i in (await call_ok(client, "search_list"))["indexes"] if i["name"] == "bg")
            assert row["state"] == "ready" or (row["state"] == "indexing" and row["progress"] is not None), row
            return row if row["state"] == "ready" else None

        row = await wait_until(ready, timeout=120)
        assert row["chunks"] > 0
        res = await call_ok(client, "search_index", path=str(repo), name="bg")
        assert res["message"] == "up to date"
    assert events, "MCP progress notifications were expected"
    values = [e[0] for e in events]
    assert values == sorted(set(values)) and {e[1] for e in events} == {100}, events  # MCP: progress only grows


async def test_resources_prompt_and_drop(search_env: Any, repo: Path) -> None:
    async with Client(search_env[0]) as client:
        listed = json.loads((await client.read_resource("search://indexes")).contents[0].text)  # type: ignore[union-attr]
        assert "repo" in {i["name"] for i in listed["indexes"]}
        one = json.loads((await client.read_resource("search://indexes/repo")).contents[0].text)  # type: ignore[union-attr]
        assert one["chunks"] > 0 and one["model"].endswith("model")
        prompt = await client.get_prompt("explain_code", {"question": "how are passwords checked?", "index": "repo"})
        assert "search_code" in prompt.messages[0].content.text  # type: ignore[union-attr]
        repo2 = make_repo(search_env[1] / "todrop")
        await call_ok(client, "search_index", path=str(repo2), name="todrop")
        dropped = await call_ok(client, "search_drop", name="todrop")
        assert dropped["dropped"] and dropped["freed_bytes"] > 0
        assert "search_index" in await call_err(client, "search_code", query="x", index="todrop")


async def test_a_different_embedding_model_is_detected(search_env: Any) -> None:
    path = make_repo(search_env[1] / "othermodel")
    svc = search_service(state_of(search_env[0]))
    finished(svc.start_index(str(path), "othermodel", [], [], None)[2])
    store = svc.store("othermodel")
    with store.transaction() as db:
        store.set_meta(db, model="/models/other-embedder")
    async with Client(search_env[0]) as client:
        assert "other-embedder" in await call_err(client, "search_code", query="retry", index="othermodel")
        lexical = await call_ok(client, "search_code", query="retry", index="othermodel", mode="lexical")
        assert lexical["hits"]


async def test_large_index_tier_answers_like_the_exact_one_through_the_tool(search_env: Any, repo: Path) -> None:
    """The two-pass index (used past vectors.EXACT_MAX chunks) swapped in for this small index: search_code must
    return the same hits, filters included (its filtered search maps row ids to positions and back)."""
    from gpubox.tools.search import vectors

    svc = search_service(state_of(search_env[0]))
    store = svc.store("repo")
    ids, blob = store.all_vectors(store.connect())
    gen = int(store.meta()["generation"])
    tiers = {"exact": vectors.build(ids, blob, 384, 200_000), "two-pass": vectors.build(ids, blob, 384, 200_000, 0)}
    cases: list[dict[str, Any]] = [{"query": q} for q in KNOWN] + [
        {"query": "request handling", "language": "go"},
        {"query": "items", "path_glob": "inventory/*.py"},
    ]
    got: dict[str, list[list[tuple[str, int]]]] = {}
    try:
        async with Client(search_env[0]) as client:
            for tier, index in tiers.items():
                assert vectors.kind(index) == tier
                svc._faiss["repo"] = (gen, index)
                got[tier] = []
                for c in cases:
                    for m in ("vector", "hybrid"):
                        res = await call_ok(client, "search_code", index="repo", mode=m, **c)
                        got[tier].append([(h["path"], h["start_line"]) for h in res["hits"]])
    finally:
        svc._faiss.pop("repo", None)  # the next search loads the index from disk again
    assert got["two-pass"] == got["exact"]
    assert all(hits for hits in got["exact"])


def test_an_indexing_run_above_its_estimate_is_remembered_for_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpubox import services
    from gpubox.app import build_server
    from gpubox.settings import Settings
    from gpubox.tools.search import service as search_mod

    monkeypatch.setattr(search_mod, "INDEXING_HOST_GB", 0.001)  # far below the embedder it loads
    mcp = build_server(Settings.load(state_dir=tmp_path / "s", allowed_roots=[tmp_path]))
    try:
        svc = search_service(state_of(mcp))
        finished(svc.start_index(str(make_repo(tmp_path / "r")), "r", [], [], None)[2])
        led = services.ledger(state_of(mcp))
        stored = json.loads((tmp_path / "s" / "box" / "footprints.json").read_text(encoding="utf-8"))
        keys = [(k, v) for k, v in stored.items() if k.startswith("indexing|")]
        assert len(keys) == 1, stored
        key, took = keys[0]
        assert took["host"] > 0.01  # the server grew by the embedding model and its batches
        assert led.expected(key, {"host": 0.001})["host"] == took["host"]  # the next indexing run reserves that
        assert led.holding("indexing r") is None  # and the run's own reservation was released
    finally:
        state_of(mcp).close()


async def test_an_index_built_by_an_older_chunker_is_chunked_again_keeping_its_vectors(search_env: Any) -> None:
    from gpubox.tools.search.chunker import CHUNKER_VERSION

    repo = make_repo(search_env[1] / "old")
    store = search_service(state_of(search_env[0])).store("old", create=True)
    async with Client(search_env[0]) as client:
        first = await call_ok(client, "search_index", path=str(repo), name="old")
        assert store.meta()["chunker"] == CHUNKER_VERSION
        with store.transaction() as db:
            store.set_meta(db, chunker=CHUNKER_VERSION - 1)  # as an index from the previous release reads
        res = await call_ok(client, "search_index", path=str(repo), name="old")
        assert res["changed_files"] == first["files"] and res["added_files"] == 0 and res["removed_files"] == 0
        assert res["embedded_chunks"] == 0 and res["chunks"] == first["chunks"]  # same texts: vectors reused
        assert store.meta()["chunker"] == CHUNKER_VERSION
        again = await call_ok(client, "search_index", path=str(repo), name="old")
        assert again["message"] == "up to date"


async def test_a_header_holding_cpp_is_indexed_as_cpp_and_a_c_header_as_c(search_env: Any) -> None:
    repo = search_env[1] / "headers"
    repo.mkdir()
    (repo / "widget.h").write_text(
        "#pragma once\n#include <string>\n\nnamespace ui {\n\n// A titled box on the screen.\n"
        "class Widget {\n public:\n"
        "  explicit Widget(std::string title);\n  int Area() const { return w_ * h_; }\n\n"
        " private:\n  std::string title_;\n  int w_ = 0, h_ = 0;\n};\n\n}  // namespace ui\n"
    )
    # the class's members defined out of line: the Widget constructor is a member, the class is in the header
    (repo / "widget.cc").write_text(
        '#include "widget.h"\n\nnamespace ui {\n\nWidget::Widget(std::string title) : title_(title) {\n'
        '  if (title_.empty()) title_ = "Widget";\n}\n\n'
        "Widget Widget::Copy() const {\n  Widget widget(title_);\n  return widget;\n}\n\n}  // namespace ui\n"
    )
    (repo / "ring.h").write_text(
        '#ifndef RING_H\n#define RING_H\n#ifdef __cplusplus\nextern "C" {\n#endif\n\n'
        "struct ring { int head, tail; };\n\n"
        "int ring_push(struct ring *r, int v);\n\n#ifdef __cplusplus\n}\n#endif\n#endif\n"
    )
    async with Client(search_env[0]) as client:
        await call_ok(client, "search_index", path=str(repo), name="headers")
        hits = (await call_ok(client, "search_code", query="Widget", index="headers", k=10))["hits"]
        ring = (await call_ok(client, "search_code", query="ring", index="headers", k=10))["hits"]
        dry = (await call_ok(client, "search_index", path=str(repo), name="headers", dry_run=True))["dry_run"]
    assert dry["files_by_language"] == {"cpp": 2, "c": 1} and dry["chunks_to_embed"] == 0  # as the run chunked them
    assert hits[0]["path"] == "widget.h" and hits[0]["language"] == "cpp"  # the class, not its constructor in .cc
    # the C grammar sees no namespace; a namespace is no definition: the class inside it is
    assert (hits[0]["symbol"], hits[0]["kind"]) == ("Widget", "class")
    assert {h["language"] for h in ring if h["path"] == "ring.h"} == {"c"}


async def test_an_index_embedded_without_the_code_adapter_is_refused_for_vectors_then_embedded_again(
    search_env: Any,
) -> None:
    """An index from before the code adapter (no `adapter` in its meta) holds plain-MiniLM vectors: a vector search
    would compare them with adapted query vectors, so it is refused with the way out; lexical still answers, the
    dry run counts the re-embedding, and search_index makes every vector again."""
    repo = make_repo(search_env[1] / "adapter")
    server = build_server(
        Settings.load(state_dir=search_env[1].parent / "adapter-state", allowed_roots=[search_env[1]],
                      search_index_wait_seconds=120, search_code_adapter=True)
    )  # fmt: skip
    try:
        await _index_refuse_and_re_embed(server, repo)
    finally:
        state_of(server).close()


async def _index_refuse_and_re_embed(server: Any, repo: Path) -> None:
    store = search_service(state_of(server)).store("adapter", create=True)
    async with Client(server) as client:
        first = await call_ok(client, "search_index", path=str(repo), name="adapter")
        assert store.meta()["adapter"] == "code-v1"
        with store.transaction() as db:
            db.execute("DELETE FROM meta WHERE key = 'adapter'")  # as an index of the previous release
        err = await call_err(client, "search_code", query="levenshtein distance", index="adapter")
        assert "no code adapter" in err and "search_index" in err and "mode='lexical'" in err
        listed = {i["name"]: i for i in (await call_ok(client, "search_list"))["indexes"]}
        assert "no code adapter" in listed["adapter"]["error"]  # the listing says why vectors are refused
        lexical = await call_ok(client, "search_code", query="levenshtein", index="adapter", mode="lexical")
        assert lexical["hits"]
        dry = await call_ok(client, "search_index", path=str(repo), name="adapter", dry_run=True)
        assert dry["dry_run"]["chunks_to_embed"] == first["chunks"]
        res = await call_ok(client, "search_index", path=str(repo), name="adapter")
        assert res["embedded_chunks"] == first["chunks"] and store.meta()["adapter"] == "code-v1"
        hits = (await call_ok(client, "search_code", query="levenshtein distance", index="adapter"))["hits"]
        assert hits[0]["symbol"] == "levenshtein"
        listed = {i["name"]: i for i in (await call_ok(client, "search_list"))["indexes"]}
        assert listed["adapter"]["error"] is None


async def test_an_index_embedded_reading_another_number_of_tokens_is_embedded_again(search_env: Any) -> None:
    repo = make_repo(search_env[1] / "tokens")
    store = search_service(state_of(search_env[0])).store("tokens", create=True)
    tokens = state_of(search_env[0]).settings.search_embed_max_tokens
    async with Client(search_env[0]) as client:
        first = await call_ok(client, "search_index", path=str(repo), name="tokens")
        assert store.meta()["embed_tokens"] == tokens
        with store.transaction() as db:
            store.set_meta(db, embed_tokens=tokens // 2)  # as if built with a shorter cut: its vectors differ
        dry = await call_ok(client, "search_index", path=str(repo), name="tokens", dry_run=True)
        assert dry["dry_run"]["chunks_to_embed"] == first["chunks"]  # the preview says so too
        res = await call_ok(client, "search_index", path=str(repo), name="tokens")
        assert res["embedded_chunks"] == first["embedded_chunks"] and res["chunks"] == first["chunks"]
        assert store.meta()["embed_tokens"] == tokens
        again = await call_ok(client, "search_index", path=str(repo), name="tokens")
        assert again["message"] == "up to date"
