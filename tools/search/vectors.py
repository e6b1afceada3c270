"""FAISS indexes built from the stored vectors, by size:

- up to EXACT_MAX vectors: exact inner product over fp16 vectors;
- up to the ANN threshold: two passes, a 4-bit product-quantiser fast scan (FAISS "fast scan": the codes of 32
  vectors per SIMD register) for the best k x K_FACTOR candidates, rescored on the fp16 vectors;
- above it: HNSW.

bench/results/search.md, 100k random unit vectors (the hardest case: no clusters, near-equal cosines), one core:
exact fp16 21.9 ms a query, two-pass 4.1 ms with the same top 10 and 99.3% of the top 50.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpubox.extras import require

log = logging.getLogger("gpubox.search")

# A query streams every vector of an exact index: at 20k x 384 fp16 that is ~4 ms on one core; past it the scan
# dominates a search's latency, so larger indexes scan 8x smaller codes first.
EXACT_MAX = 20_000
# Candidates the fast scan hands to the fp16 rescoring, per hit wanted (k is 50 in search_code's legs).
K_FACTOR = 16
# Product-quantiser training sample: k-means on 16 centroids per sub-space converges long before this, and the
# training cost (seconds) is paid at every index commit
TRAIN_SAMPLE = 20_000


def _faiss() -> Any:
    require("faiss", "search", "Vector search")
    import faiss

    return faiss


def build(ids: list[int], blob: bytes, dim: int, ann_threshold: int, exact_max: int | None = None) -> Any:
    import numpy as np

    faiss = _faiss()
    exact_max = EXACT_MAX if exact_max is None else exact_max
    ip = faiss.METRIC_INNER_PRODUCT
    vecs = np.frombuffer(blob, dtype=np.float32).reshape(-1, dim) if ids else np.zeros((0, dim), np.float32)
    if len(ids) > ann_threshold:
        base = faiss.IndexHNSWFlat(dim, 32, ip)
        base.hnsw.efConstruction = 64
        base.hnsw.efSearch = 128
    elif len(ids) > exact_max:
        # two 4-bit codes per byte: dim/2 sub-quantisers of 2 dimensions each (96 bytes a MiniLM vector); an odd
        # dimension falls back to a 4-bit scalar quantiser (a slower first pass, the same rescoring)
        first = (
            faiss.IndexPQFastScan(dim, dim // 2, 4, ip)
            if dim % 2 == 0
            else faiss.IndexScalarQuantizer(dim, faiss.ScalarQuantizer.QT_4bit, ip)
        )
        base = faiss.IndexRefine(first, faiss.IndexScalarQuantizer(dim, faiss.ScalarQuantizer.QT_fp16, ip))
        base.k_factor = K_FACTOR
        sample = np.random.default_rng(0).choice(len(vecs), min(len(vecs), TRAIN_SAMPLE), replace=False)
        base.train(vecs[np.sort(sample)])
    else:
        # Exact search over vectors stored as fp16: a query streams every vector, so halving the bytes read cuts
        # its time (100k x 384: 28 -> 20 ms on 2 cores) while the top-10 stays the same as fp32 (cosines of unit
        # vectors move by < 1e-3, far below the gaps between neighbours).
        base = faiss.IndexScalarQuantizer(dim, faiss.ScalarQuantizer.QT_fp16, ip)
    index = faiss.IndexIDMap2(base)
    if ids:
        index.add_with_ids(vecs, np.asarray(ids, dtype=np.int64))
    return index


def serialize(index: Any) -> bytes:
    return bytes(_faiss().serialize_index(index))


def load_or(path: Path, rebuilt: Callable[[], Any]) -> Any:
    """The index in `path`, or `rebuilt()` when the file cannot be read back (a truncated or damaged file failed
    every vector search, and the next index run found nothing to change)."""
    try:
        return load(path.read_bytes())
    except (OSError, RuntimeError, ValueError) as exc:  # faiss raises RuntimeError on a bad stream
        log.warning("%s cannot be read (%s); vectors rebuilt from the index database", path, exc)
        return rebuilt()


def load(data: bytes) -> Any:
    import numpy as np

    faiss = _faiss()
    index = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
    if faiss.get_num_gpus() > 0 and hasattr(faiss, "index_cpu_to_all_gpus"):  # faiss-gpu installed and a GPU
        try:
            return faiss.index_cpu_to_all_gpus(index)
        except Exception:  # HNSW and the two-pass index have no GPU version; stay on CPU
            return index
    return index


def kind(index: Any) -> str:
    """'exact', 'two-pass' or 'hnsw': which of build()'s indexes this is."""
    faiss = _faiss()
    inner = faiss.downcast_index(index.index) if hasattr(index, "index") else index
    if isinstance(inner, faiss.IndexRefine):
        return "two-pass"
    return "hnsw" if isinstance(inner, faiss.IndexHNSW) else "exact"


def _search_two_pass(index: Any, q: Any, k: int, allowed_ids: list[int]) -> tuple[Any, Any]:
    """A filtered search on the two-pass index: FAISS's fast scan takes no selector, so the allowed vectors are
    scored exactly on the fp16 copy. IndexIDMap2 translates a selector only for the index it wraps, so the allowed
    ids become positions here and the positions found become ids again."""
    import numpy as np

    faiss = _faiss()
    id_map = faiss.vector_to_array(index.id_map)
    positions = np.flatnonzero(np.isin(id_map, np.asarray(allowed_ids, dtype=np.int64)))
    if positions.size == 0:
        return np.zeros((1, 0), np.float32), np.zeros((1, 0), np.int64)
    exact = faiss.downcast_index(faiss.downcast_index(index.index).refine_index)
    params = faiss.SearchParameters(sel=faiss.IDSelectorBatch(positions))
    scores, labels = exact.search(q, min(k, int(positions.size)), params=params)
    return scores, np.where(labels >= 0, id_map[np.maximum(labels, 0)], -1)


def search(index: Any, query: Any, k: int, allowed_ids: list[int] | None = None) -> list[tuple[int, float]]:
    """Top-k (id, cosine) pairs; `allowed_ids` restricts the search (path/language filters)."""
    import numpy as np

    faiss = _faiss()
    if index.ntotal == 0 or k <= 0 or (allowed_ids is not None and not allowed_ids):
        return []
    q = np.asarray(query, dtype=np.float32).reshape(1, -1)
    # One OpenMP thread for a single query (more only adds fork/join overhead and jitter), restored afterwards:
    # the setting is per calling thread and torch shares the OpenMP runtime, so leaving it at 1 made every later
    # query embedding on this thread ~1.5x slower.
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        if allowed_ids is None:
            scores, ids = index.search(q, min(k, index.ntotal))
        elif kind(index) == "two-pass":
            scores, ids = _search_two_pass(index, q, k, allowed_ids)
        else:
            sel = faiss.IDSelectorBatch(np.asarray(allowed_ids, dtype=np.int64))
            scores, ids = index.search(q, min(k, index.ntotal), params=faiss.SearchParameters(sel=sel))
    finally:
        faiss.omp_set_num_threads(before)
    return [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if i != -1]
