"""FAISS indexes built from the stored vectors, by size:

- up to EXACT_MAX vectors: exact inner product over fp16 vectors;
- up to the ANN threshold: a two-pass scan, 4-bit codes first and the best k x K_FACTOR rescored on the fp16
  vectors (the same top-k as the exact scan in bench/results/search.md, at about half its time);
- above it: HNSW.
"""

from __future__ import annotations

from typing import Any

from gpubox.extras import require

# A query streams every vector of an exact index: at 20k x 384 fp16 that is ~3 ms on one core, past it the scan
# dominates a search's latency (100k: ~17 ms), so larger indexes read 4x smaller codes first.
EXACT_MAX = 20_000
# Candidates the 4-bit pass hands to the fp16 rescoring, per hit wanted: SQ4 moves cosines by ~0.01, far less
# than the spread of the top 8k candidates, so the true top-k is among them (bench/results/search.md).
K_FACTOR = 8


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
        base = faiss.IndexRefine(
            faiss.IndexScalarQuantizer(dim, faiss.ScalarQuantizer.QT_4bit, ip),
            faiss.IndexScalarQuantizer(dim, faiss.ScalarQuantizer.QT_fp16, ip),
        )
        base.k_factor = K_FACTOR
        base.train(vecs)  # SQ4 learns each dimension's range: one pass over the vectors
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
    """A filtered search on the two-pass index. IndexIDMap2 translates a selector only for the index it wraps, and
    IndexRefine hands its base pass only the selector nested in its own parameters, so the allowed ids are turned
    into positions here and the labels back into ids."""
    import numpy as np

    faiss = _faiss()
    id_map = faiss.vector_to_array(index.id_map)
    positions = np.flatnonzero(np.isin(id_map, np.asarray(allowed_ids, dtype=np.int64)))
    if positions.size == 0:
        return np.zeros((1, 0), np.float32), np.zeros((1, 0), np.int64)
    refine = faiss.downcast_index(index.index)
    params = faiss.IndexRefineSearchParameters(
        k_factor=refine.k_factor, base_index_params=faiss.SearchParameters(sel=faiss.IDSelectorBatch(positions))
    )
    scores, labels = refine.search(q, min(k, int(positions.size)), params=params)
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
