"""A query's ranked candidates kept for its next pages, so that paging through search_code serves each hit once.

The ranking depends on how many candidates each leg gives (the pool), so pages past the first pool were ranked
afresh and repeated or skipped hits (ten pages of 10 over 70 matching files repeated 9 and skipped 9). A deeper page
ranks a larger pool but keeps what earlier pages served, in their order.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

PAGED_QUERIES = 64  # recent queries whose ranked candidates are kept for their next pages
MAX_PAGED = 10_100  # the deepest page a search_code call can ask for ends there


class RankedPages:
    def __init__(self) -> None:
        # key: (index name, index id, generation, query, mode, glob, language) -> (pool ranked, candidates)
        self._pages: OrderedDict[tuple[Any, ...], tuple[int, list[Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def ranked(self, key: tuple[Any, ...], n: int, rank: Callable[[int], list[Any]]) -> tuple[list[Any], bool]:
        """The candidates for `key` at least `n` deep where there are that many, and whether a deeper ranking may
        find more (the legs gave as many as the pool asked: the index may hold more matches than were ranked);
        `rank(pool)` ranks afresh."""
        with self._lock:
            known = self._pages.get(key)
            if known is not None:
                self._pages.move_to_end(key)
        if known is not None and (len(known[1]) > n or known[0] > n):  # deep enough, or ranked deeper already
            return known[1], _more(*known)
        pool = max(n, 50, 2 * known[0]) if known is not None else max(n, 50)
        fresh = rank(pool)
        if known is not None:
            served = {r.id for r in known[1]}
            fresh = known[1] + [r for r in fresh if r.id not in served]
        fresh = fresh[:MAX_PAGED]
        with self._lock:
            self._pages[key] = (pool, fresh)
            while len(self._pages) > PAGED_QUERIES:
                self._pages.popitem(last=False)
        return fresh, _more(pool, fresh)

    def forget(self, name: str) -> None:
        """Every query of index `name` (dropped)."""
        with self._lock:
            for key in [k for k in self._pages if k[0] == name]:
                del self._pages[key]


def _more(pool: int, ranked: list[Any]) -> bool:
    """Whether a ranking `pool` deep that gave `ranked` may have left matches out: it gave a full pool, and pages
    end at MAX_PAGED."""
    return len(ranked) >= pool and len(ranked) < MAX_PAGED
