"""Session meter for a rented GPU box: what has this server's session cost, and what did the GPU do for it.

Cost accrues with wall time from server start at the box's hourly price (a setting, or the estimator's dated
price catalog for the local GPU and a named provider). GPU busy share comes from NVML utilisation sampled in a
background thread; without NVML it is reported as unavailable rather than guessed. Families say what they are
doing through `activity(kind)` / `begin(kind)` or a probe, so the report can split the session by use.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from gpubox.errors import UnknownNameError
from gpubox.settings import Settings
from gpubox.tools.gpu.nvml import load_pynvml
from gpubox.tools.gpu.schemas import ActivityUse, SessionInfo

log = logging.getLogger("gpubox.session")

BUSY_UTIL_PCT = 5  # NVML utilisation at or above this counts as busy (a GPU at 1-4% is only polling)
ACTIVITY_KINDS = ("inference", "finetune", "indexing", "benchmark")


@dataclass
class _Use:
    active: int = 0
    since: float | None = None
    wall_s: float = 0.0
    gpu_busy_s: float = 0.0


@dataclass
class PriceInfo:
    usd_per_hour: float | None
    source: str
    observed: str | None = None


@dataclass
class _Samples:
    busy_s: float = 0.0
    idle_s: float = 0.0
    last_util: float | None = None
    last_at: float | None = None
    reason: str | None = None
    gpu_names: list[str] = field(default_factory=list)


def resolve_price(settings: Settings, gpu_names: list[str]) -> PriceInfo:
    """The box's $/hour: the `hourly_usd` setting, else the catalog price of `price_provider` for the local GPU."""
    if settings.hourly_usd is not None:
        return PriceInfo(settings.hourly_usd, "setting hourly_usd")
    if settings.price_provider is None:
        return PriceInfo(None, "no price configured: set hourly_usd or price_provider")
    from gpubox.tools.estimate.catalog import package_catalog

    catalog = package_catalog()
    names = [settings.price_gpu] if settings.price_gpu else gpu_names
    if not names:
        return PriceInfo(None, f"price_provider {settings.price_provider}: no GPU visible; set price_gpu or hourly_usd")
    try:
        gpu_id = catalog.gpu(names[0]).id
    except UnknownNameError:
        return PriceInfo(None, f"GPU '{names[0]}' is not in the price catalog; set hourly_usd or price_gpu")
    wanted = settings.price_provider.lower()
    for p in catalog.prices_for(gpu_id):
        if p.provider.lower() == wanted:
            count = 1 if settings.price_gpu else len(gpu_names) or 1
            return PriceInfo(
                p.usd_per_hour * count,
                f"{p.provider} on-demand price for {count} x {gpu_id} ({p.source})",
                p.observed,
            )
    return PriceInfo(None, f"no {settings.price_provider} price for {gpu_id} in the catalog; set hourly_usd")


class SessionMeter:
    """Per-server session accounting. Thread-safe; cheap to query."""

    def __init__(
        self,
        settings: Settings,
        *,
        started_at: float | None = None,
        clock: Callable[[], float] = time.time,
        sample: bool = True,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.started_at = started_at if started_at is not None else clock()
        self.last_request = self.started_at
        self._lock = threading.Lock()
        self._uses: dict[str, _Use] = {k: _Use() for k in ACTIVITY_KINDS}
        self._probes: dict[str, Callable[[], bool]] = {}
        self._samples = _Samples()
        # per connection, its latest request's session facade (the SDK makes one per request; the connection
        # object lives as long as the client stays connected, so entries vanish with it)
        self._sessions: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._price: PriceInfo | None = None
        self._nv: Any = None  # set once nvmlInit succeeded, so close() can balance it
        self._handles: list[Any] = []
        self._last_tick = self.started_at
        if sample:
            self._open_nvml()
            # One cheap ticker: polls the families' probes (minutes per kind of work) and NVML utilisation.
            self._thread = threading.Thread(target=self._tick_loop, name="gpubox-session", daemon=True)
            self._thread.start()
        else:
            self._samples.reason = "sampling off"

    def _open_nvml(self) -> None:
        nv = load_pynvml()
        if nv is None:
            self._samples.reason = "nvidia-ml-py is not installed"
            return
        try:
            nv.nvmlInit()
            self._nv = nv
            count = nv.nvmlDeviceGetCount()
            self._handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            names = [nv.nvmlDeviceGetName(h) for h in self._handles]
            self._samples.gpu_names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        except Exception as exc:  # no driver / no GPU: data, not an error
            self._samples.reason = f"NVML unavailable: {exc}"
            return
        if not self._handles:
            self._samples.reason = "no GPU visible to NVML"

    # --- inputs ---------------------------------------------------------------------------------
    def touch(self, session: Any = None) -> None:
        """An MCP request arrived (from the middleware): the box is in use."""
        self.last_request = self.clock()
        if session is not None:
            conn = sdk_session_facts(session).connection
            if conn is not None:
                with suppress(TypeError):  # not weak-referenceable: no broadcast to it
                    self._sessions[conn] = session
            with suppress(RuntimeError):
                self._loop = asyncio.get_running_loop()

    def begin(self, kind: str) -> None:
        with self._lock:
            use = self._uses.setdefault(kind, _Use())
            if use.active == 0:
                use.since = self.clock()
            use.active += 1

    def end(self, kind: str) -> None:
        with self._lock:
            use = self._uses.setdefault(kind, _Use())
            if use.active == 0:
                return
            use.active -= 1
            if use.active == 0 and use.since is not None:
                use.wall_s += self.clock() - use.since
                use.since = None

    @contextmanager
    def activity(self, kind: str) -> Iterator[None]:
        self.begin(kind)
        try:
            yield
        finally:
            self.end(kind)

    def add_probe(self, kind: str, probe: Callable[[], bool]) -> None:
        """`probe()` says whether work of `kind` runs outside this process (e.g. a fine-tuning worker)."""
        with self._lock:
            self._probes[kind] = probe

    def active(self) -> list[str]:
        with self._lock:
            kinds = {k for k, u in self._uses.items() if u.active}
            probes = list(self._probes.items())
        for kind, probe in probes:
            try:
                if probe():
                    kinds.add(kind)
            except Exception:  # a broken probe must not stop the meter
                log.debug("activity probe %s failed", kind, exc_info=True)
        return sorted(kinds)

    # --- GPU sampling ---------------------------------------------------------------------------
    def _tick_loop(self) -> None:
        while not self._stop.wait(self.settings.session_sample_seconds):
            try:
                self.tick()
            except Exception:  # the meter must never take the server down
                log.debug("session meter tick failed", exc_info=True)

    def tick(self) -> None:
        """Credit the time since the last tick to work the probes report, then sample NVML utilisation."""
        now = self.clock()
        with self._lock:
            dt, self._last_tick = now - self._last_tick, now
            probes = list(self._probes.items())
        for kind, probe in probes:
            try:
                running = probe()
            except Exception:
                continue
            if running and dt > 0:
                with self._lock:
                    use = self._uses.setdefault(kind, _Use())
                    if not use.active:  # begin()/end() already time it otherwise
                        use.wall_s += dt
        if self._handles and self._nv is not None:
            try:
                util = sum(self._nv.nvmlDeviceGetUtilizationRates(h).gpu for h in self._handles) / len(self._handles)
            except Exception:
                return
            self.record_sample(util)

    def record_sample(self, util_pct: float) -> None:
        """Account the time since the previous sample as busy or idle (and busy time to the active kinds)."""
        now = self.clock()
        active = self.active()
        with self._lock:
            s = self._samples
            dt = now - (s.last_at if s.last_at is not None else self.started_at)
            s.last_at, s.last_util = now, util_pct
            if dt <= 0:
                return
            if util_pct >= BUSY_UTIL_PCT:
                s.busy_s += dt
                for kind in active:
                    self._uses.setdefault(kind, _Use()).gpu_busy_s += dt / len(active)
            else:
                s.idle_s += dt

    def gpu_idle(self) -> bool | None:
        """True/False from the latest NVML sample; None when utilisation is not measured."""
        with self._lock:
            last = self._samples.last_util
        return None if last is None else last < BUSY_UTIL_PCT

    # --- output ---------------------------------------------------------------------------------
    def price(self) -> PriceInfo:
        if self._price is None:
            self._price = resolve_price(self.settings, self._samples.gpu_names)
        return self._price

    def report(self) -> SessionInfo:
        now = self.clock()
        price = self.price()
        uptime = max(0.0, now - self.started_at)
        cost = None if price.usd_per_hour is None else price.usd_per_hour * uptime / 3600
        budget = self.settings.budget_usd
        left = runs_out = None
        if budget is not None and cost is not None and price.usd_per_hour:
            left = budget - cost
            runs_out = _iso_or_none(now + max(0.0, left) / price.usd_per_hour * 3600)
        with self._lock:
            s = self._samples
            measured = s.busy_s + s.idle_s
            uses = [
                ActivityUse(
                    kind=k,
                    active=bool(u.active),
                    wall_minutes=round((u.wall_s + (now - u.since if u.since is not None else 0.0)) / 60, 3),
                    gpu_busy_minutes=round(u.gpu_busy_s / 60, 3) if measured else None,
                )
                for k, u in sorted(self._uses.items())
            ]
            busy_share = round(s.busy_s / measured, 4) if measured else None
            idle_minutes = round(s.idle_s / 60, 3) if measured else None
            reason = s.reason
        active = self.active()
        for use in uses:
            use.active = use.kind in active
        return SessionInfo(
            started_at=_iso(self.started_at),
            uptime_s=round(uptime, 1),
            usd_per_hour=price.usd_per_hour,
            price_source=price.source,
            price_observed=price.observed,
            cost_usd=None if cost is None else round(cost, 4),
            budget_usd=budget,
            budget_left_usd=None if left is None else round(left, 4),
            budget_runs_out_at=runs_out,
            gpu_busy_share=busy_share,
            gpu_idle_minutes=idle_minutes,
            gpu_utilisation=reason or "measured",
            minutes_since_last_request=round((now - self.last_request) / 60, 3),
            uses=uses,
        )

    def broadcast_warning(self, message: str) -> int:
        """Send `message` as an MCP log notification to every connected client that can receive one unasked;
        returns how many. Sessions on 2026-07-28+ protocol versions only get log messages inside their own
        requests (SEP-2577), so they read the warning from the server log and box://session instead."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return 0
        sent = 0
        for session in list(self._sessions.values()):
            if sdk_session_facts(session).log_is_request_scoped:
                continue
            try:
                asyncio.run_coroutine_threadsafe(_send_warning(session, message), loop)
                sent += 1
            except RuntimeError:  # loop stopped meanwhile
                pass
        return sent

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._nv is not None:
            with suppress(Exception):
                self._nv.nvmlShutdown()
            self._nv = None


class SessionFacts(NamedTuple):
    connection: Any  # None when the SDK no longer has it
    log_is_request_scoped: bool


_SDK_PRIVATE = ("_connection", "_log_is_request_scoped")
_sdk_change_logged = False


def sdk_session_facts(session: Any) -> SessionFacts:
    """What the meter needs from the MCP SDK's per-request `ServerSession` (mcp 2.3, mcp.server.session) that the
    SDK does not make public. The only place gpubox reads SDK private attributes; tests/test_sdk_private.py checks
    them on a real session, so an SDK upgrade that renames or drops one fails there.

    - `session._connection` (mcp.server.connection.Connection): the SDK builds a new ServerSession for every
      request, but its Connection lives as long as the client stays connected. The meter keys the latest session
      by it (weakly), so a broadcast reaches each connected client once and the entry goes when the client does.
      Neither the session nor the middleware's ServerRequestContext exposes the connection publicly.
    - `session._log_is_request_scoped` (bool): the SDK's own decision that log notifications of this session may
      only ride the stream of the request they belong to (protocol 2026-07-28+, SEP-2577); an unsolicited warning
      cannot reach such a session, so broadcast_warning skips it.

    When an attribute is missing the answer degrades to "no unsolicited messages" (connection None, request
    scoped True) and a warning is logged once, rather than failing the request that carried the session.
    """
    global _sdk_change_logged
    missing = [name for name in _SDK_PRIVATE if not hasattr(session, name)]
    if missing and not _sdk_change_logged:
        _sdk_change_logged = True
        log.warning(
            "the MCP SDK's ServerSession has no %s (SDK changed); idle warnings are not broadcast to clients",
            ", ".join(missing),
        )
    return SessionFacts(
        connection=getattr(session, "_connection", None),
        log_is_request_scoped=bool(getattr(session, "_log_is_request_scoped", True)),
    )


async def _send_warning(session: Any, message: str) -> None:
    with warnings.catch_warnings():
        # the SDK flags the logging capability as deprecated for new protocol versions; older clients still use it
        warnings.simplefilter("ignore", UserWarning)
        try:
            await session.send_log_message(level="warning", data=message, logger="gpubox.idle")
        except Exception:  # a client that went away must not break the guard
            log.debug("idle warning not delivered", exc_info=True)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def _iso_or_none(ts: float) -> str | None:
    """None for a moment past what a datetime holds (year 9999): a large budget at a small price lasts that long,
    and a report that fails on it would take gpu_status down with it."""
    try:
        return _iso(ts)
    except (OverflowError, ValueError, OSError):
        return None
