"""Resident models: load with the estimator's fit plan, LRU eviction, memory budget, keep-alive, one request
at a time per model.

Concurrency rules (one client's work must never stall another's):
- `_lock` guards only the bookkeeping (`resident`, `_loading`, busy counts) and is held for microseconds,
  never across a load, a close or file I/O; so status, listing and generation on other models never wait.
- A load marks its key in `_loading`; a second load or acquire of the same key waits for that one only.
- A model is closed only once it left `resident` (under the lock) with `busy == 0`: the reaper and LRU
  eviction skip busy models, and `unload` waits for the running requests to finish before closing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from gpubox.errors import CapacityError, InvalidInputError, UnknownNameError
from gpubox.settings import Settings
from gpubox.tools.box.ledger import Ledger
from gpubox.tools.box.schemas import Admission
from gpubox.tools.inference import room
from gpubox.tools.inference.catalog import ModelCatalog
from gpubox.tools.inference.measure import LoadMeasurements, config_key, with_last_load
from gpubox.tools.inference.planning import open_backend, plan
from gpubox.tools.inference.registry import DEFAULT_MODEL, Discovered, check_files, describe
from gpubox.tools.inference.resident import Resident
from gpubox.tools.inference.room import idle_first, ledger_needs, owner_of, reload_needs, shortfall_victims
from gpubox.tools.inference.schemas import LoadedInfo, LoadPlan, LoadResult, ModelEntry, ModelList, UnloadResult

log = logging.getLogger("gpubox.inference")


class ModelManager(ModelCatalog):
    def __init__(self, settings: Settings, ledger: Ledger | None = None) -> None:
        super().__init__(settings)
        self.ledger = ledger if ledger is not None else Ledger(settings)
        self.resident: dict[str, Resident] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a request finished or a load ended
        self._loading: dict[str, float] = {}  # key -> GB reserved while its backend is being built
        self._loads_started = 0  # a load is measured only if no other started while it ran (see measure.py)
        self._unload_asked: set[str] = set()  # keys an infer_unload waits on while they load
        self._closing: list[Resident] = []  # unloaded, closed by their last running request (unload wait=False)
        self._respawn: dict[str, dict[str, Any]] = {}  # key -> load arguments of a model whose process ended
        self.measured = LoadMeasurements(settings.state_dir)
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, name="gpubox-keepalive", daemon=True)
        self._reaper.start()

    # --- registry (ModelCatalog: roots, discovered, find, base_of, _resolve) ---------------------
    def entry(self, d: Discovered) -> ModelEntry:
        r = self.resident.get(d.name)
        return describe(self.meta, d, r.info() if r else None)

    def list(self) -> ModelList:
        return ModelList(
            models=[self.entry(d) for d in self.discovered().values()],
            resident_limit=self.settings.infer_max_resident,
            memory_budget_gb=self.settings.infer_memory_budget_gb,
        )

    # --- load / unload --------------------------------------------------------------------------
    def load(
        self,
        name: str,
        backend: Literal["auto", "llama.cpp", "transformers"] = "auto",
        context_length: int | None = None,
        n_gpu_layers: int | None = None,
        kv_cache_type: str = "f16",
        quantization: Literal["4bit", "8bit"] | None = None,
        adapter: str | None = None,
        keep_alive_s: float | None = None,
        pin: bool = False,
    ) -> LoadResult:
        """Load (or reload, with the new settings) `name`; `pin` keeps it loaded until infer_unload."""
        res = self._load(
            name, backend, context_length, n_gpu_layers, kv_cache_type, quantization, adapter, keep_alive_s, pin=pin
        )
        assert res is not None  # only if_absent loads return None
        return res

    def _load(
        self,
        name: str,
        backend: Literal["auto", "llama.cpp", "transformers"] = "auto",
        context_length: int | None = None,
        n_gpu_layers: int | None = None,
        kv_cache_type: str = "f16",
        quantization: Literal["4bit", "8bit"] | None = None,
        adapter: str | None = None,
        keep_alive_s: float | None = None,
        *,
        if_absent: bool = False,
        pin: bool = False,
        restoring: dict[str, Any] | None = None,
    ) -> LoadResult | None:
        t0 = time.perf_counter()
        spec = {"name": name, "backend": backend, "context_length": context_length, "n_gpu_layers": n_gpu_layers,
                "kv_cache_type": kv_cache_type, "quantization": quantization, "adapter": adapter,
                "keep_alive_s": keep_alive_s, "pin": pin}  # fmt: skip
        d, adapter_d, chosen = self._resolve(name, backend, adapter)
        if quantization and d.format == "gguf":  # refused before a loaded copy is unloaded for it
            raise InvalidInputError("4/8-bit quantisation needs an HF folder, not a GGUF file (transformers limit)")
        key = adapter_d.name if adapter_d else d.name
        with self._changed:
            while key in self._loading:  # one load per key; other keys load in parallel
                self._changed.wait()
            if (if_absent and key in self.resident) or (
                restoring is not None and self._respawn.get(key) is not restoring
            ):
                return None  # loaded already, or an infer_unload came before this restore began
            self._loading[key] = 0.0
            self._loads_started += 1
            before = self.resident.get(key)
        failed = True
        try:
            self._check_files(d, adapter_d)
            self.unload(key, missing_ok=True, forget=False)
            estimate = plan(self.settings, self.meta, d, chosen, context_length, n_gpu_layers, kv_cache_type)
            mkey = config_key(d, estimate, adapter_d, quantization)
            p = with_last_load(estimate, self.measured.known(mkey))
            adm, evicts = self._room_for(key, p, ledger_needs(p))
            if not (adm.fits or evicts):  # refused before the limits evict a model for a load that cannot fit
                raise CapacityError(adm.reason)
            evicted = self._make_room(key, p.estimated_memory_gb)
            evicted += self._reserve(key, p, pin)
            try:
                be, used = self.measured.around(
                    lambda: open_backend(self.settings, d, adapter_d, chosen, p, kv_cache_type, quantization),
                    alone=self._alone(key, self._loads_started),
                )
            except BaseException:
                self.ledger.release(owner_of(key))
                raise
            try:
                if used is not None:  # judged against the estimate, not a figure remembered from an earlier load
                    self.measured.settle(self.ledger, owner_of(key), mkey, ledger_needs(estimate), used)
                keep = self.settings.infer_keep_alive_seconds if keep_alive_s is None else keep_alive_s
                r = Resident(key, adapter_d or d, be, p, keep, adapter_d.name if adapter_d else None, pin, spec=spec)
            except BaseException:  # a model nobody can reach must not stay loaded (or its process run)
                with contextlib.suppress(Exception):
                    be.close()
                self.ledger.release(owner_of(key))
                raise
            with self._lock:
                self.resident[key] = r
                self._respawn.pop(key, None)
            failed = False
        finally:
            with self._changed:
                before = None if key in self._unload_asked else before  # infer_unload came meanwhile: no restore
                if failed and before is not None:  # a request let in below reloads it as it was, not with defaults
                    self._respawn[key] = before.spec
                self._loading.pop(key, None)
                self._changed.notify_all()
            if failed and before is not None:
                self._restore(before.spec)
        # from this load's own copy: another load of the key may already have replaced it (last one wins)
        entry = describe(self.meta, adapter_d or d, r.info())
        return LoadResult(model=entry, plan=p, evicted=evicted, load_seconds=round(time.perf_counter() - t0, 3))

    def _restore(self, spec: dict[str, Any]) -> None:
        """A refused reload unloaded the working copy: load it again as it was (pinned if it was)."""
        try:
            self._load(**spec, if_absent=True, restoring=spec)
        except Exception:
            log.exception("loading %s again with its earlier settings", spec.get("name"))

    def loading(self, name: str | None) -> bool:
        """Whether `name` (None: acquire's pick) is loading; no lock: atomic under the GIL, read on the loop."""
        if name is None:
            recent = max(list(self.resident.values()), key=lambda r: r.last_used, default=None)
            name = recent.name if recent else DEFAULT_MODEL
        return name.lower() in self._loading

    def _alone(self, key: str, started: int) -> Callable[[], bool]:
        """Whether the load of `key` is the only one in flight and none started since `started`."""

        def alone() -> bool:
            with self._lock:
                return set(self._loading) == {key} and self._loads_started == started

        return alone

    def plan_load(self, name: str, context_length: int | None = None) -> tuple[LoadPlan, Admission, list[str]]:
        """What infer_load would do now, loading nothing: its plan, the ledger's answer and the idle models it
        would evict to make room (empty when it fits as is or cannot fit at all)."""
        d, adapter_d, chosen = self._resolve(name, "auto", None)
        p = plan(self.settings, self.meta, d, chosen, context_length, None, "f16")
        p = with_last_load(p, self.measured.known(config_key(d, p, adapter_d, None)))
        key = adapter_d.name if adapter_d else d.name
        try:
            adm, evicts = self._room_for(key, p, reload_needs(ledger_needs(p), self.ledger.holding(owner_of(key))))
        except CapacityError as exc:  # the resident-count or budget limit, which no eviction can meet
            return p, Admission(fits=False, needs=ledger_needs(p), reason=str(exc)), []
        return p, adm, evicts

    def _room_for(self, key: str, p: LoadPlan, needs: dict[str, float]) -> tuple[Admission, list[str]]:
        """The ledger's answer for a load of `key` and the idle models it would evict (for the limits, then for
        the ledger's shortfall): an answer that does not fit with no evictions means no eviction makes room.
        Raises CapacityError when the resident-count or budget limits cannot be met."""
        with self._lock:
            evicts = [r.name for r in self._limit_victims(key, p.estimated_memory_gb)]
        if not any(needs.values()):
            return Admission(fits=True, needs={}, reason=f"{key} is loaded; its reservation covers it"), evicts
        adm = self.ledger.check(needs)
        if adm.fits:
            return adm, evicts
        with self._lock:
            victims = shortfall_victims(adm, [r for r in self._evictable() if r.name != key])
        return adm, ([] if victims is None else evicts + [r.name for r in victims if r.name not in evicts])

    def _check_files(self, d: Discovered, adapter_d: Discovered | None) -> None:
        check_files(d, adapter_d, self.roots(), self.meta)

    def _make_room(self, key: str, need_gb: float) -> list[str]:
        with self._lock:
            victims = self._limit_victims(key, need_gb)
            for r in victims:
                self._detach(self.resident.pop(r.name))
            self._loading[key] = need_gb
        for r in victims:  # popped while idle, so no request can reach them: close outside the lock
            self._close(r)
        return [r.name for r in victims]

    def _evictable(self) -> list[Resident]:
        """Idle, unpinned residents, least recently used first (caller holds the lock)."""
        return idle_first(self.resident.values())

    def _limit_victims(self, key: str, need_gb: float) -> list[Resident]:
        """What infer_max_resident and infer_memory_budget_gb make a load of `key` evict (caller holds the lock)."""
        limit, budget = self.settings.infer_max_resident, self.settings.infer_memory_budget_gb
        return room.limit_victims(list(self.resident.values()), self._loading, key, need_gb, limit, budget)

    def _reserve(self, key: str, p: LoadPlan, pin: bool) -> list[str]:
        """Reserve the plan's memory in the box ledger, evicting idle unpinned models only when that frees
        enough; otherwise the ledger's refusal (naming the holders) reaches the caller and nothing is evicted."""
        needs = ledger_needs(p)
        owner, frees = owner_of(key), f"infer_unload name='{key}'"
        try:
            self.ledger.reserve(owner, "inference", needs, frees, pinned=pin)
            return []
        except CapacityError:
            admission = self.ledger.check(needs)
            with self._lock:
                victims = shortfall_victims(admission, self._evictable())
                if victims is None:
                    raise
                for r in victims:
                    self._detach(self.resident.pop(r.name))
        for r in victims:
            self._close(r)
        self.ledger.reserve(owner, "inference", needs, frees, pinned=pin)
        return [r.name for r in victims]

    def unload(self, name: str, *, missing_ok: bool = False, forget: bool = True, wait: bool = True) -> UnloadResult:
        """`forget`: an unload the user asked for, after which a model whose process died is not brought back
        (a reload, which unloads first, keeps the arguments until it has succeeded). `wait=False`: a model still
        running requests is closed by the last of them to end (`closing` counts them) instead of here."""
        key = name.lower()
        with self._changed:
            while forget and key in self._loading:  # unload what that load leaves, and stop a failed one's restore
                self._unload_asked.add(key)
                self._changed.wait()
            if forget:
                self._unload_asked.discard(key)
                self._respawn.pop(key, None)
            r = self.resident.pop(key, None)
            if r is not None:
                self._detach(r)
            if r is not None and r.busy > 0 and not wait:
                r.close_on_release = True
                self._closing.append(r)
                return UnloadResult(name=name, unloaded=True)
            while r is not None and r.busy > 0:  # new requests cannot find it; wait for the running ones
                self._changed.wait()
        if r is None:
            if not missing_ok and key not in self.discovered():
                raise UnknownNameError("model", name, self.discovered().keys())
            return UnloadResult(name=name, unloaded=False)
        self._close(r)
        return UnloadResult(name=name, unloaded=True)

    def _close(self, r: Resident) -> None:
        try:
            r.backend.close()
        except Exception:  # the model is gone from the registry either way
            log.exception("closing %s", r.name)
        finally:
            self.ledger.release(r.holder or owner_of(r.name))

    def _detach(self, r: Resident) -> Resident:
        """Called under the lock as `r` leaves `resident`: its memory stays reserved until it is closed, under a
        name of its own, so a new load of the same model can reserve at once."""
        r.holder = f"{owner_of(r.name)} (unloading {id(r):x})"
        self.ledger.rename(owner_of(r.name), r.holder)
        return r

    def acquire(self, name: str | None) -> Resident:
        """The model to run: the named one (loading it if needed), else the most recently used, else the default.
        One whose own process ended (llama_process) is loaded again with the arguments of its last load, once the
        requests that still hold it have failed and let go."""
        for _ in range(3):  # a fresh load can be reaped or evicted before we mark it busy: retry
            with self._changed:
                if name is None:
                    recent = max(self.resident.values(), key=lambda r: r.last_used) if self.resident else None
                    name = recent.name if recent else DEFAULT_MODEL
                key = name.lower()
                while key in self._loading or ((r := self.resident.get(key)) is not None and r.dead and r.busy):
                    self._changed.wait()
                r = self.resident.get(key)
                if r is not None and not r.dead:
                    r.busy += 1
                    r.last_used = time.time()
                    return r
                if r is not None:
                    self._respawn[key] = r.spec  # a concurrent acquire reloads it the same way
                    self._detach(self.resident.pop(key))
                spec = self._respawn.get(key) or {"name": key}
            if r is not None:
                self._close(r)
            self._load(**spec, if_absent=True)
        raise CapacityError(f"{name} was unloaded again right after loading; raise infer_max_resident or retry")

    def release(self, r: Resident) -> None:
        with self._changed:
            r.busy -= 1
            r.last_used = time.time()
            last = r.close_on_release and r.busy == 0
            self._changed.notify_all()
        if last:  # an infer_unload did not wait for this request; its caller does not wait for the close either
            threading.Thread(target=self._close_unloaded, args=(r,), name="gpubox-unload", daemon=True).start()

    def _close_unloaded(self, r: Resident) -> None:
        try:
            self._close(r)
        finally:  # counted by closing() until its memory is released, so infer_unload answers after that
            with self._changed:
                self._closing = [x for x in self._closing if x is not r]
                self._changed.notify_all()

    def closing(self, name: str) -> int:
        """Unloaded copies of `name` not closed yet (their running requests close them as the last one ends)."""
        with self._lock:
            return sum(1 for r in self._closing if r.name.lower() == name.lower())

    # --- probes for other families (taken under the lock) ----------------------------------------
    def loaded(self) -> dict[str, LoadedInfo]:
        with self._lock:
            return {name: r.info() for name, r in self.resident.items()}

    def busy_models(self) -> list[str]:
        """Models generating right now."""
        with self._lock:
            return [name for name, r in self.resident.items() if r.busy > 0]

    # --- keep-alive -----------------------------------------------------------------------------
    def reap(self, now: float | None = None) -> list[str]:
        now = now or time.time()
        with self._lock:  # choose and remove in one step, so an acquire cannot slip in between
            idle = [r for r in self.resident.values() if r.reapable(now)]
            for r in idle:
                if r.dead:  # its process ended while idle: free its memory now; the next request reloads it as it was
                    self._respawn[r.name] = r.spec
                self._detach(self.resident.pop(r.name))
        for r in idle:
            log.info("unloading %s (%s)", r.name, "its process ended" if r.dead else f"{r.keep_alive:.0f} s idle")
            self._close(r)
        return [r.name for r in idle]

    def _reap_loop(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.reap()
            except Exception:  # the reaper must survive a failed unload
                log.exception("keep-alive reaper")

    def close(self) -> None:
        self._stop.set()
        for name in list(self.resident):
            self.unload(name, missing_ok=True)
