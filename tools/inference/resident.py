"""A model the manager holds loaded, and the load arguments that bring it back if its own process ends."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio

from gpubox.tools.inference.planning import Backend
from gpubox.tools.inference.registry import Discovered
from gpubox.tools.inference.schemas import LoadedInfo, LoadPlan


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


@dataclass
class Resident:
    name: str
    entry: Discovered
    backend: Backend
    plan: LoadPlan
    keep_alive: float
    adapter: str | None = None
    pinned: bool = False
    holder: str | None = None  # the ledger holding while it is being closed (see _detach)
    loaded_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    busy: int = 0
    close_on_release: bool = False  # unloaded while busy: the last request to end closes it (ModelManager.release)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # requests wait for the model here, on the event loop, before they take a worker thread: blocked in r.lock
    # each held one of the pool's threads, and 40 waiting requests stalled every other client's tools
    turn: anyio.CapacityLimiter = field(default_factory=lambda: anyio.CapacityLimiter(1))
    # the arguments of the load that made it (ModelManager._load's): a model whose process ended is loaded again
    # as the caller asked, not with the defaults
    spec: dict[str, Any] = field(default_factory=dict)

    @property
    def dead(self) -> bool:
        """Its own process (llama_process) ended; in-process backends never are."""
        return not getattr(self.backend, "alive", True)

    def reapable(self, now: float) -> bool:
        """Idle and either its process ended or its keep-alive ran out (a pinned model stays)."""
        expired = self.keep_alive > 0 and not self.pinned and now - self.last_used >= self.keep_alive
        return self.busy == 0 and (self.dead or expired)

    def info(self) -> LoadedInfo:
        return LoadedInfo(
            backend=self.backend.name,
            device=self.plan.device,
            n_gpu_layers=self.plan.n_gpu_layers,
            context_length=self.plan.context_length,
            memory_gb=self.plan.estimated_memory_gb,
            loaded_at=iso(self.loaded_at),
            last_used=iso(self.last_used),
            keep_alive_s=self.keep_alive,
            adapter=self.adapter,
            pinned=self.pinned,
        )
