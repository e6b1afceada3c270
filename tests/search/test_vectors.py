"""Vector index tiers (tools/search/vectors.py): past EXACT_MAX the two-pass index (a 4-bit product-quantiser fast
scan, then the best k x K_FACTOR rescored on fp16 vectors) must give the exact index's answers, filters included."""

from __future__ import annotations

from typing import Any

import pytest

from gpubox.tools.search import vectors

pytestmark = pytest.mark.slow  # builds FAISS indexes up to the two-pass tier (tens of thousands of vectors)
DIM = 384


def clustered(n: int, seed: int = 0) -> Any:
    """Unit vectors in 200 tight groups, like code embeddings (near-duplicates and families of similar
    functions), which is where a coarse first pass could swap close neighbours."""
    import numpy as np  # faiss-cpu's dependency: the folder's requires_search checks faiss

    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((200, DIM)).astype(np.float32)
    x = centres[rng.integers(0, 200, n)] + 0.6 * rng.standard_normal((n, DIM)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def pair() -> tuple[Any, Any, list[int], Any]:
    x = clustered(12_000)
    ids = [1000 + 3 * i for i in range(len(x))]  # row ids are not positions
    exact = vectors.build(ids, x.tobytes(), DIM, ann_threshold=10**9, exact_max=10**9)
    two = vectors.load(vectors.serialize(vectors.build(ids, x.tobytes(), DIM, ann_threshold=10**9, exact_max=1000)))
    queries = clustered(40, seed=1)
    return exact, two, ids, queries


def test_the_tier_follows_the_size_of_the_index() -> None:
    x = clustered(1500)
    ids = list(range(len(x)))
    assert vectors.kind(vectors.build(ids, x.tobytes(), DIM, ann_threshold=10_000, exact_max=2000)) == "exact"
    assert vectors.kind(vectors.build(ids, x.tobytes(), DIM, ann_threshold=10_000, exact_max=1000)) == "two-pass"
    assert vectors.kind(vectors.build(ids, x.tobytes(), DIM, ann_threshold=1000, exact_max=500)) == "hnsw"
    assert vectors.kind(vectors.build([], b"", DIM, ann_threshold=1000)) == "exact"


def test_two_pass_gives_the_exact_top_k_and_scores(pair: tuple[Any, Any, list[int], Any]) -> None:
    exact, two, _, queries = pair
    assert vectors.kind(two) == "two-pass"  # survived serialisation, with its k_factor
    for q in queries:
        want, got = vectors.search(exact, q, 50), vectors.search(two, q, 50)
        assert [i for i, _ in got[:10]] == [i for i, _ in want[:10]]
        assert len({i for i, _ in got} & {i for i, _ in want}) >= 48
        scores = dict(want)
        assert all(abs(s - scores[i]) < 2e-3 for i, s in got if i in scores)  # rescored in fp16, not 4-bit


def test_two_pass_honours_filters_and_returns_row_ids(pair: tuple[Any, Any, list[int], Any]) -> None:
    exact, two, ids, queries = pair
    allowed = ids[::7]
    for q in queries[:10]:
        want, got = vectors.search(exact, q, 10, allowed), vectors.search(two, q, 10, allowed)
        assert [i for i, _ in got] == [i for i, _ in want]
        assert set(i for i, _ in got) <= set(allowed)
    few = ids[5:8]
    assert sorted(i for i, _ in vectors.search(two, queries[0], 10, few)) == sorted(few)
    assert vectors.search(two, queries[0], 10, [7]) == []  # no such row
    assert vectors.search(two, queries[0], 10, []) == []
