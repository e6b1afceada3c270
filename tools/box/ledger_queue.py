"""The box ledger's memory queue: who waits for memory, in what order, and whose turn it is.

Separate from ledger.py because the order is a policy of its own (first in line first among the waiters whose
own condition holds) over state of its own (the line, each waiter's last look); the ledger owns the reservations
and asks here only whether a waiter may try. It shares the ledger's condition, so a release wakes the waiters.
"""

from __future__ import annotations

import threading


class MemoryQueue:
    def __init__(self, cond: threading.Condition) -> None:
        self._cond = cond
        self._line: list[str] = []
        self._ready: dict[str, bool] = {}  # each waiter's own condition at its last look (see Ledger.wait_reserve)

    def enter(self, owner: str) -> None:
        with self._cond:
            if owner not in self._line:
                self._line.append(owner)

    def leave(self, owner: str) -> None:
        """Out of line now: the waiters are woken, so one that was cancelled sees it and returns."""
        with self._cond:
            if owner in self._line:
                self._line.remove(owner)
            self._cond.notify_all()

    def done(self, owner: str) -> None:
        """Out of line with its last look forgotten (its waiter returned or raised); the others are woken."""
        with self._cond:
            if owner in self._line:
                self._line.remove(owner)
            self._ready.pop(owner, None)
            self._cond.notify_all()

    def position(self, owner: str) -> int | None:
        """1-based place in the line, None when not queued."""
        with self._cond:
            return self._line.index(owner) + 1 if owner in self._line else None

    def turn(self, owner: str, ok: bool) -> bool:
        """Record `owner`'s own condition (`ok`) and say whether it may try to reserve now (caller holds the
        condition): first in line among the waiters whose own condition holds, so a benchmark waiting for a model
        to stop generating does not hold up a fine-tune job that only waits for memory; one not yet checked keeps
        its place until its first check (which comes at once)."""
        self._ready[owner] = ok
        return next((o for o in self._line if self._ready.get(o, True)), None) == owner

    def queued(self) -> list[str]:
        """The line, first first (caller holds the condition)."""
        return list(self._line)
