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
        # reentrant: a factory may ask for the services it depends on (the model manager for the ledger)
        self._lock = threading.RLock()

    def service(self, key: str, factory: Callable[[Settings], S]) -> S:
        """Return the service stored under `key`, building it on first use (thread-safe)."""
        with self._lock:
            if key not in self._services:
                self._services[key] = factory(self.settings)
            return self._services[key]

    def peek(self, key: str) -> Any | None:
        """The service under `key` if it was already built; never builds one."""
        with self._lock:
            return self._services.get(key)

    def close(self) -> None:
        with self._lock:
            services = list(self._services.items())
            self._services.clear()
        for key, svc in services:
            close = getattr(svc, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:  # closing must not hide the others
                    log.exception("closing service %s failed", key)
