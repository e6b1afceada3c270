"""Process-wide application state.

SSE runs the MCP lifespan once per connection, so heavy state (loaded models, indexes, job stores)
cannot live in the lifespan: it lives here, created once per process by build_server, and every
lifespan run only hands out a reference.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from gpubox.settings import Settings

log = logging.getLogger("gpubox")

S = TypeVar("S")


class Closable(Protocol):
    def close(self) -> None: ...


class AppState:
    """Holds settings and lazily-built family services (one instance of each per process)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._services: dict[str, Any] = {}
        self._lock = threading.Lock()  # guards the two dicts only; never held while a service is built
        # one lock per service being built, so a slow build (a database opened, jobs reconciled) holds up only the
        # callers of that service, not every other client's tools (one lock held through every build did). A
        # factory may ask for the services it depends on (the ledger for the model manager): it takes their locks.
        # The services depend on each other without cycles, so no two builds wait on each other; a cycle added by
        # mistake fails on its first build (_builders) rather than waiting forever
        self._building: dict[str, threading.Lock] = {}
        self._builders: dict[str, int] = {}  # key -> the thread building it
        self._closed = False

    def service(self, key: str, factory: Callable[[Settings], S]) -> S:
        """Return the service stored under `key`, building it on first use (thread-safe, built once).

        A factory that needs its own service again, directly or through another (a dependency cycle), fails at
        once with RuntimeError instead of waiting on itself forever. A service built while close() ran is closed
        and the call fails: nothing is left running in a closed state."""
        me = threading.get_ident()
        with self._lock:
            if key in self._services:
                return self._services[key]
            if self._builders.get(key) == me:
                raise RuntimeError(f"service {key!r} asked for itself while being built (a dependency cycle)")
            building = self._building.setdefault(key, threading.Lock())
        with building:
            with self._lock:
                if key in self._services:  # another caller built it while this one waited
                    return self._services[key]
                self._builders[key] = me
            try:
                svc = factory(self.settings)
            finally:
                with self._lock:
                    self._builders.pop(key, None)
            with self._lock:
                closed = self._closed
                if not closed:
                    self._services[key] = svc
                    self._building.pop(key, None)
            if closed:
                _close(key, svc)
                raise RuntimeError(f"service {key!r} was built after the server closed; it was closed again")
            return svc

    def peek(self, key: str) -> Any | None:
        """The service under `key` if it was already built; never builds one."""
        with self._lock:
            return self._services.get(key)

    def close(self) -> None:
        with self._lock:
            self._closed = True  # a build still running closes what it built (service())
            services = list(self._services.items())
            self._services.clear()
        for key, svc in services:
            _close(key, svc)


def _close(key: str, svc: Any) -> None:
    close = getattr(svc, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # closing must not hide the others
            log.exception("closing service %s failed", key)
