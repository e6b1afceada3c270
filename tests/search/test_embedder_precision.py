"""The MiniLM embedder's query path and precisions: a query (in bf16 where the CPU multiplies bf16 natively) must
rank documents as the fp32 document path does."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpubox.bundled import minilm_dir
from gpubox.tools.search.embedder import Embedder, cpu_has_bf16

pytestmark = pytest.mark.slow

DOCS = [
    "inventory/retry.py retry_with_backoff\ndef retry_with_backoff(fn, attempts=5, base=0.1):\n"
    "    for i in range(attempts):\n        try:\n            return fn()\n        except Exception:\n"
    "            time.sleep(base * 2 ** i)",
    "native/crc32.c crc32\nuint32_t crc32(const uint8_t *buf, size_t len) { uint32_t c = 0xffffffff; "
    "for (size_t i = 0; i < len; i++) c = table[(c ^ buf[i]) & 0xff] ^ (c >> 8); return c ^ 0xffffffff; }",
    "web/src/debounce.js debounce\nexport function debounce(fn, ms) { let t; return (...a) => "
    "{ clearTimeout(t); t = setTimeout(() => fn(...a), ms); }; }",
    "server/ratelimit.go RateLimiter\ntype RateLimiter struct { tokens float64; rate float64; last time.Time }",
]
QUERIES = {
    "exponential backoff retry": 0,
    "compute checksum of a byte buffer": 1,
    "delay a function until the user stops typing": 2,
    "token bucket rate limiting": 3,
}


def _minilm() -> Path:
    path = minilm_dir()
    assert path is not None  # the folder's requires_models checked it
    return path


def test_a_query_is_embedded_like_a_document() -> None:
    import numpy as np

    embedder = Embedder(_minilm(), dtype="float32")
    q = embedder.encode_query("exponential backoff retry")
    assert q.shape == (384,) and q.dtype == np.float32
    assert float(np.linalg.norm(q)) == pytest.approx(1.0, abs=1e-5)
    doc_path = embedder.encode(["exponential backoff retry"])[0]  # MiniLM has no query prompt: same text, same vector
    assert float(q @ doc_path) > 0.9999
    # the direct mean-pooled path (MiniLM qualifies) gives sentence-transformers' own query vector, truncation too
    assert embedder._direct_query
    long_query = " ".join(["parse the yaml document and report the line of each error"] * 60)  # > 256 tokens
    for text in ("exponential backoff retry", long_query):
        st_vec = embedder._load().encode_query([text], convert_to_numpy=True, normalize_embeddings=True)[0]
        assert float(embedder.encode_query(text) @ st_vec) > 0.9999


def test_a_repeated_query_reuses_its_vector_and_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from gpubox.tools.search import embedder as embedder_mod

    monkeypatch.setattr(embedder_mod, "RECENT_QUERIES", 2)
    embedder = Embedder(_minilm(), dtype="float32")
    first = embedder.encode_query("token bucket rate limiting")
    first[:] = 0  # a caller may change what it got: the cache must hand out copies
    calls: list[str] = []
    real = embedder._mean_pooled
    monkeypatch.setattr(embedder, "_mean_pooled", lambda m, t: calls.append(t) or real(m, t))
    again = embedder.encode_query("token bucket rate limiting")
    assert calls == [] and float(np.linalg.norm(again)) == pytest.approx(1.0, abs=1e-5)  # paging: no second forward
    embedder.encode_query("a")
    embedder.encode_query("b")  # the oldest entry is evicted past RECENT_QUERIES
    embedder.encode_query("token bucket rate limiting")
    assert calls == ["a", "b", "token bucket rate limiting"]
    embedder.forget_queries()
    embedder.encode_query("b")
    assert calls[-1] == "b"


def test_bf16_vectors_agree_with_fp32_and_rank_documents_the_same() -> None:
    import numpy as np

    f32, b16 = Embedder(_minilm(), dtype="float32"), Embedder(_minilm(), dtype="bfloat16")
    a, b = f32.encode(DOCS, bulk=True), b16.encode(DOCS, bulk=True)
    assert (f32.dtype, b16.dtype) == ("float32", "bfloat16")
    assert b.dtype == np.float32 and np.allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)
    assert float((a * b).sum(axis=1).min()) > 0.995
    for query, want in QUERIES.items():
        q32, q16 = f32.encode_query(query), b16.encode_query(query)
        assert float(q32 @ q16) > 0.995
        assert int(np.argmax(a @ q32)) == int(np.argmax(b @ q16)) == int(np.argmax(a @ q16)) == want


def test_auto_precision_follows_the_cpu() -> None:
    embedder = Embedder(_minilm())
    embedder.encode_query("warm up")
    if embedder.device == "cuda":
        assert embedder.dtype == "float16"
    else:
        assert embedder.dtype == ("bfloat16" if cpu_has_bf16() else "float32")


def test_queries_run_on_onnx_runtime_with_the_same_vectors(tmp_path: Path) -> None:
    import numpy as np

    reference = Embedder(_minilm(), dtype="float32")
    embedder = Embedder(_minilm(), dtype="float32", onnx_cache=tmp_path / "a", onnx_int8=False)
    embedder.dimension()  # loads the model, exports it once and checks the export against PyTorch
    assert embedder._onnx is not None
    exported = list((tmp_path / "a").glob("*.onnx"))
    assert len(exported) == 1
    for query in [*QUERIES, " ".join(["parse the yaml document and report each error"] * 60)]:
        assert float(embedder.encode_query(query) @ reference.encode_query(query)) > 0.9999
    # a second server on the same state dir reuses the file; one on another state dir gets a copy
    mtime = exported[0].stat().st_mtime_ns
    Embedder(_minilm(), dtype="float32", onnx_cache=tmp_path / "a", onnx_int8=False).dimension()
    assert exported[0].stat().st_mtime_ns == mtime
    other = Embedder(_minilm(), onnx_cache=tmp_path / "b", onnx_int8=False)  # auto: bf16 documents on AMX CPUs
    other.dimension()
    assert other._onnx is not None and len(list((tmp_path / "b").glob("*.onnx"))) == 1
    vec = other.encode_query("exponential backoff retry")
    assert vec.dtype == np.float32 and float(np.linalg.norm(vec)) == pytest.approx(1.0, abs=1e-5)


def test_an_export_that_disagrees_with_pytorch_is_not_used(tmp_path: Path) -> None:
    import numpy as np

    from gpubox.tools.search import onnx_query

    embedder = Embedder(_minilm(), dtype="float32")
    model = embedder._load()
    wrong = lambda text: np.ones(384, dtype=np.float32)  # noqa: E731  (what a broken export would be checked against)
    assert onnx_query.load(model, _minilm(), tmp_path, wrong) is None
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tmp_path.glob("*.onnx"):
        (broken / f.name).write_bytes(b"not an onnx file")  # a corrupt cached export: refused, never a crash
    assert onnx_query.load(model, _minilm(), broken, lambda t: embedder._mean_pooled(model, t)) is None
    assert not list(broken.glob("*.onnx"))  # removed, so the next start exports it afresh
    assert float(np.linalg.norm(embedder.encode_query("exponential backoff retry"))) == pytest.approx(1.0, abs=1e-5)


def _ranking(embedder: Embedder, query: str) -> list[int]:
    import numpy as np

    docs = Embedder(_minilm(), dtype="float32").encode(DOCS)
    return [int(i) for i in np.argsort(-(docs @ embedder.encode_query(query)))]


def test_the_8_bit_query_encoder_matches_fp32_and_is_kept_only_when_checked_and_faster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpubox.tools.search import onnx_query

    real_seconds = onnx_query._seconds
    timed: list[str] = []

    def seconds(encoder: onnx_query.OnnxQueryEncoder, rounds: int = 5) -> float:
        timed.append(encoder.precision)
        real_seconds(encoder, 1)  # it runs on this CPU either way
        return {"int8": 1.0, "float32": 2.0}[encoder.precision]  # the speed check, isolated from this VM's noise

    monkeypatch.setattr(onnx_query, "_seconds", seconds)
    reference = Embedder(_minilm(), dtype="float32")
    embedder = Embedder(_minilm(), dtype="float32", onnx_cache=tmp_path)
    embedder.dimension()
    assert embedder._onnx is not None and embedder._onnx.precision == "int8", embedder._onnx
    assert sorted(timed) == ["float32", "int8"]
    assert len(list(tmp_path.glob("*-q8b32.onnx"))) == 1
    for query, want in QUERIES.items():
        assert float(embedder.encode_query(query) @ reference.encode_query(query)) > 0.999
        assert _ranking(embedder, query) == _ranking(reference, query) and _ranking(embedder, query)[0] == want

    # slower than fp32 on this CPU (no int8 dot products: ONNX Runtime dequantises each block): not used
    monkeypatch.setattr(onnx_query, "_seconds", lambda e, rounds=5: {"int8": 2.0, "float32": 1.0}[e.precision])
    slow = Embedder(_minilm(), dtype="float32", onnx_cache=tmp_path)
    slow.dimension()
    assert slow._onnx is not None and slow._onnx.precision == "float32"
    # vectors that disagree with fp32: not used either
    monkeypatch.setattr(onnx_query, "_seconds", seconds)
    monkeypatch.setattr(onnx_query, "INT8_MIN_COSINE", 1.01)
    strict = Embedder(_minilm(), dtype="float32", onnx_cache=tmp_path)
    strict.dimension()
    assert strict._onnx is not None and strict._onnx.precision == "float32"
    # a corrupt 8-bit file: removed (made afresh by the next start), queries on fp32, never a crash
    monkeypatch.setattr(onnx_query, "INT8_MIN_COSINE", 0.999)
    [q8] = tmp_path.glob("*-q8b32.onnx")
    q8.write_bytes(b"not an onnx file")
    broken = Embedder(_minilm(), dtype="float32", onnx_cache=tmp_path)
    assert broken.encode_query("exponential backoff retry") is not None
    assert broken._onnx is not None and broken._onnx.precision == "float32" and not q8.exists()
    # another state dir in this process gets a copy of the 8-bit file, not a second quantisation
    made: list[Path] = []
    real_quantize = onnx_query._quantize
    monkeypatch.setattr(onnx_query, "_quantize", lambda src, dest: made.append(dest) or real_quantize(src, dest))
    Embedder(_minilm(), dtype="float32", onnx_cache=tmp_path / "a").dimension()  # made afresh (removed above)
    second = Embedder(_minilm(), dtype="float32", onnx_cache=tmp_path / "b")
    second.dimension()
    assert len(made) == 1 and second._onnx.precision == "int8" and list((tmp_path / "b").glob("*-q8b32.onnx"))
    # switched off by the setting
    off = Embedder(_minilm(), dtype="float32", onnx_cache=tmp_path, onnx_int8=False)
    off.dimension()
    assert off._onnx is not None and off._onnx.precision == "float32"


@pytest.mark.parametrize("tokens", [256, 512])
def test_the_model_reads_as_many_tokens_of_a_chunk_as_set(tokens: int) -> None:
    body = "value = compute(value)\n" * 60  # ~6 tokens a line: about 360 tokens, past a 256-token cut
    a, b = body + "raise TimeoutError('deadline passed')", body + "return sorted(items, key=len)"
    va, vb = Embedder(_minilm(), max_seq_length=tokens, dtype="float32").encode([a, b], bulk=True)
    same = float(va @ vb) > 0.9999
    assert same == (tokens == 256)  # a 256-token cut never reaches the last line; 512 tokens do
