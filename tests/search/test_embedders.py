"""Configurable embedding models: a model2vec static model distilled from the bundled MiniLM, through the MCP tools."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import tempfile
from pathlib import Path

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.bundled import minilm_dir
from gpubox.settings import Settings
from gpubox.tools.search.embedder import Embedder, default_model_path, model_backend
from tests.conftest import call_err, call_ok, requires_model2vec
from tests.search.conftest import make_repo

pytestmark = [pytest.mark.anyio, pytest.mark.slow, requires_model2vec]

PCA_DIMS = 32


def _minilm() -> Path:
    path = minilm_dir()
    assert path is not None  # the folder's requires_models checked it
    return path


def _cache_key(src: Path) -> str:
    """Same MiniLM files, model2vec version and recipe -> same cached folder; anything else distils afresh."""
    h = hashlib.sha256(f"{importlib.metadata.version('model2vec')} layers=1 pca={PCA_DIMS}".encode())
    for f in sorted(src.rglob("*")):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.relative_to(src)} {st.st_size} {st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


@pytest.fixture(scope="session")
def m2v_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small real model2vec model distilled from the bundled MiniLM, cached in the temp dir across runs.

    model2vec.distill runs the transformer once per vocabulary token (~30k); keeping only MiniLM's first layer and
    32 PCA dims makes that a few seconds of CPU instead of minutes, and the cache makes later runs free.
    """
    # model2vec.distill imports skeletoken: in pyproject's model2vec extra but not in gpubox.extras.EXTRAS, so the
    # requires_model2vec marker does not check it
    pytest.importorskip("skeletoken", reason="model2vec's distiller needs skeletoken: pip install -e '.[model2vec]'")
    src = _minilm()
    dest = Path(tempfile.gettempdir()) / f"gpubox-test-model2vec-{_cache_key(src)}"
    if (dest / "config.json").is_file():
        return dest
    from model2vec.distill import distill_from_model
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(str(src), num_hidden_layers=1)
    tokenizer = AutoTokenizer.from_pretrained(str(src), use_fast=True)
    static = distill_from_model(model=model, tokenizer=tokenizer, pca_dims=PCA_DIMS)
    tmp = tmp_path_factory.mktemp("m2v") / "model"
    static.save_pretrained(str(tmp))
    try:
        os.replace(tmp, dest)  # atomic: a concurrent or killed run never leaves a half-written cache
    except OSError:
        if not (dest / "config.json").is_file():
            raise
    return dest


async def index_failure(client: Client, path: Path) -> str:
    """search_index refuses up front (a tool error) or its background run fails (state 'failed', with why): either
    is a pass, so this one reads the raw result instead of call_ok / call_err."""
    result = await client.call_tool("search_index", {"path": str(path), "name": "repo"})
    if result.is_error:
        return " ".join(getattr(c, "text", "") for c in result.content)
    res = result.structured_content or {}
    assert res.get("state") == "failed", res
    return str(res["message"])


def test_a_model2vec_folder_is_detected_and_gives_normalised_vectors(m2v_model: Path) -> None:
    assert model_backend(m2v_model) == "model2vec"
    assert model_backend(_minilm()) == "sentence-transformers"
    embedder = Embedder(default_model_path(m2v_model))
    assert embedder.backend == "model2vec" and embedder.dimension() == PCA_DIMS
    vecs = embedder.encode(["def retry_with_backoff(fn, attempts):", "token bucket rate limiter", ""], bulk=True)
    assert vecs.shape == (3, PCA_DIMS) and str(vecs.dtype) == "float32"
    norms = (vecs**2).sum(axis=1)
    assert norms[0] == pytest.approx(1.0, abs=1e-5) and norms[1] == pytest.approx(1.0, abs=1e-5)
    assert norms[2] == 0.0  # an empty text has no tokens: a zero vector, never NaN
    assert embedder.encode([]).shape == (0, PCA_DIMS)


def test_a_model2vec_model_reads_as_many_tokens_as_the_setting_says(m2v_model: Path) -> None:
    # search_embed_max_tokens is recorded per index and re-embeds it when changed: the vectors must change with it
    long = " ".join(
        ["def retry_with_backoff(fn, attempts):"] + [f"token_bucket_{i} = rate_limiter({i})" for i in range(200)]
    )
    short, wide = Embedder(m2v_model, max_seq_length=32), Embedder(m2v_model, max_seq_length=512)
    a, b = short.encode([long, "retry with backoff"]), wide.encode([long, "retry with backoff"])
    assert float(a[0] @ b[0]) < 0.999  # the long text is cut at 32 tokens in one, not the other
    assert float(a[1] @ b[1]) == pytest.approx(1.0, abs=1e-5)  # a short text is read whole by both
    # a query is cut where chunks are, so a long pasted query meets chunks read the same way
    assert float(short.encode_query(long) @ a[0]) == pytest.approx(1.0, abs=1e-5)


def test_a_configured_sentence_transformers_folder_still_loads_with_sentence_transformers() -> None:
    embedder = Embedder(default_model_path(_minilm()))
    assert embedder.backend == "sentence-transformers" and embedder.dimension() == 384
    vecs = embedder.encode(["def retry_with_backoff(fn, attempts):"])
    assert vecs.shape == (1, 384) and float((vecs**2).sum()) == pytest.approx(1.0, abs=1e-4)


async def test_index_and_search_the_sample_repo_with_a_model2vec_model(tmp_path: Path, m2v_model: Path) -> None:
    repo = make_repo(tmp_path / "root" / "repo")
    settings = Settings.load(
        state_dir=tmp_path / "state",
        allowed_roots=[tmp_path / "root"],
        search_index_wait_seconds=120,
        search_embedding_model=m2v_model,
    )
    mcp = build_server(settings)
    try:
        async with Client(mcp) as client:
            res = await call_ok(client, "search_index", path=str(repo), name="repo")
            assert res["state"] == "ready" and res["chunks"] >= 40 and res["embedded_chunks"] == res["chunks"]
            info = (await call_ok(client, "search_list"))["indexes"][0]
            assert info["model"] == str(m2v_model) and info["dim"] == PCA_DIMS
            # the static model's own vectors, alone: its top hits for a query that names the function
            hits = (await call_ok(client, "search_code", query="retry with backoff", index="repo", k=5, mode="vector"))[
                "hits"
            ]
            assert any(h["path"] == "inventory/retry.py" for h in hits), hits
            assert all("vector" in h["matched_by"] for h in hits)
            # and through the default hybrid mode, a description without the identifier
            hits = (await call_ok(client, "search_code", query="edit distance between two strings", index="repo", k=3))[
                "hits"
            ]
            assert any(h["path"] == "engine/src/lib.rs" and h["symbol"] == "levenshtein" for h in hits), hits
    finally:
        state_of(mcp).close()


async def test_switching_the_model_re_embeds_instead_of_mixing_vectors(tmp_path: Path, m2v_model: Path) -> None:
    repo = make_repo(tmp_path / "root" / "repo")
    base = dict(state_dir=tmp_path / "state", allowed_roots=[tmp_path / "root"], search_index_wait_seconds=120)
    first = build_server(Settings.load(**base, search_embedding_model=m2v_model))
    try:
        async with Client(first) as client:
            built = await call_ok(client, "search_index", path=str(repo), name="repo")
            assert built["state"] == "ready"
    finally:
        state_of(first).close()

    # same state dir, default MiniLM (384 dims): the 32-dim index is neither searched by vector nor extended
    second = build_server(Settings.load(**base))
    try:
        async with Client(second) as client:
            msg = await call_err(client, "search_code", query="retry with backoff", index="repo", mode="vector")
            assert str(m2v_model) in msg and "re-index" in msg
            msg = await index_failure(client, repo)
            assert str(m2v_model) in msg and "search_drop" in msg
            info = (await call_ok(client, "search_list"))["indexes"][0]
            assert info["model"] == str(m2v_model) and info["dim"] == PCA_DIMS  # untouched by the refused run
            # lexical search needs no vectors, so it still answers from the old index
            lex = await call_ok(client, "search_code", query="retry_with_backoff", index="repo", mode="lexical", k=1)
            assert lex["hits"][0]["path"] == "inventory/retry.py"

            assert (await call_ok(client, "search_drop", name="repo"))["dropped"]
            rebuilt = await call_ok(client, "search_index", path=str(repo), name="repo")
            # every chunk embedded again by the new model: nothing reused from the old one
            assert rebuilt["embedded_chunks"] == rebuilt["chunks"] == built["chunks"]
            assert rebuilt["reused_chunks"] == 0
            info = (await call_ok(client, "search_list"))["indexes"][0]
            assert info["model"] == str(_minilm()) and info["dim"] == 384
            hits = (await call_ok(client, "search_code", query="retry with backoff", index="repo", mode="vector", k=3))[
                "hits"
            ]
            assert any(h["path"] == "inventory/retry.py" for h in hits), hits
    finally:
        state_of(second).close()


@pytest.mark.parametrize(
    ("configured", "expected"),
    [
        ("minishlab/potion-code-16M", "hf download minishlab/potion-code-16M"),
        ("{tmp}/empty", "has no config.json/modules.json"),
        ("{tmp}/broken", "could not load the model2vec embedding model"),
    ],
    ids=["hub-id-not-downloaded", "folder-without-a-model", "model2vec-config-without-weights"],
)
async def test_a_bad_model_setting_is_a_clear_tool_error_and_the_server_keeps_serving(
    tmp_path: Path, configured: str, expected: str
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text('{"model_type": "model2vec", "hidden_dim": 8}')
    repo = make_repo(tmp_path / "root" / "repo")
    settings = Settings.load(
        state_dir=tmp_path / "state",
        allowed_roots=[tmp_path / "root"],
        search_index_wait_seconds=120,
        search_embedding_model=Path(configured.format(tmp=tmp_path)),
    )
    mcp = build_server(settings)  # start-up never loads the model, so a bad setting cannot stop the server
    try:
        async with Client(mcp) as client:
            # a failed load is not cached as half-loaded: the second call gives the same clear error
            msgs = [await index_failure(client, repo) for _ in range(2)]
            for msg in msgs:
                assert expected in msg and "GPUBOX_SEARCH_EMBEDDING_MODEL" in msg, msg
            # the rest of the server is unaffected
            assert await call_ok(client, "estimate_gpus")
    finally:
        state_of(mcp).close()
