"""The box's memory ledger: every family reserves its estimated memory per device before work starts.

Rules (one ledger per server process; its state file makes it survive a restart):
- `reserve` is atomic across devices: work that does not fit on every device it needs is refused with a
  CapacityError naming the holders and the calls that would free enough; nothing is half-reserved.
- What may be reserved on a device is the smaller of the budget left (budget minus reservations) and what the
  device physically has left: total minus headroom, minus memory held by processes gpubox does not own, minus
  gpubox's own use (the larger of its reservations and what its processes measure, so memory reserved but not
  yet allocated and memory allocated beyond the estimate both count); see accounts.py.
- Each holding names a process; when that process ends (a fine-tune worker exits, the server restarts) the
  holding is released, so a crash never leaks a reservation.
- `wait_reserve` queues: first in line first among the waiters whose own condition holds (a later, smaller
  request never overtakes it), woken by every release; direct `reserve` calls are answered at once and do not
  queue; `reserve_or_queue` reserves what fits now and queues the rest in one step; see ledger_queue.py.
- Work that names its configuration (`key`) reserves what that configuration measured last time where that is
  more than its estimate; its peak while it runs is remembered (footprints.py).
The lock is held only for bookkeeping; device readings are taken outside it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from gpubox.errors import CapacityError, InvalidInputError
from gpubox.settings import Settings
from gpubox.tools.box import accounts
from gpubox.tools.box.admission import admission
from gpubox.tools.box.capacity import Reading, drift, pid_alive, read_devices, start_time
from gpubox.tools.box.footprints import FootprintStore, Peaks, raised
from gpubox.tools.box.ledger_file import LedgerFile, adopted_at_start, orphans, others
from gpubox.tools.box.ledger_queue import MemoryQueue
from gpubox.tools.box.schemas import Admission, BoxState, DeviceAccount, Holding, Kind

log = logging.getLogger("gpubox.box")
Reader = Callable[[Iterable[int]], dict[str, Reading]]


class Ledger:
    def __init__(self, settings: Settings, read: Reader = read_devices) -> None:
        self.settings = settings
        self.file = LedgerFile(settings.state_dir / "box" / "ledger.json")
        self.read = read
        self._cond = threading.Condition()
        self._queue = MemoryQueue(self._cond)  # shares the condition: a release wakes the waiters
        self._holdings: dict[str, Holding] = {}  # this server's
        self._others: dict[str, Holding] = {}  # other gpubox servers' on this box, as their last write says
        self.restored: list[str] = []  # what the state file held that still runs (shown once in box_plan)
        self.footprints = FootprintStore(settings.state_dir / "box" / "footprints.json")
        self.peaks = Peaks(self.footprints)  # measured peaks of keyed work (see footprints)
        self._load()

    # --- persistence: one file shared by every gpubox server on the box (see ledger_file) -------------
    def _load(self) -> None:
        with self.file.lock():
            for h in adopted_at_start(self.file.read()):
                self._holdings[h.owner] = h
                self.restored.append(h.owner)
            self.file.write(self._holdings.values())

    def _sync(self) -> None:
        """Refresh the other servers' holdings (caller holds self._cond and the file lock)."""
        held = self.file.read()
        adopted = orphans(held, self._holdings)
        for h in adopted:
            self._holdings[h.owner] = h
            self.restored.append(h.owner)
        if adopted:  # written now, so a second live server does not adopt the same orphan too
            self._save_locked()
            held = self.file.read()
        self._others = others(held)

    def _save(self) -> None:
        with self.file.lock():
            self._save_locked()

    def _save_locked(self) -> None:
        self.file.write(self._holdings.values())

    def _all(self) -> dict[str, Holding]:
        return {**self._others, **self._holdings}

    def _prune(self) -> list[str]:
        """Release holdings whose process ended (caller holds self._cond and the file lock)."""
        gone = [o for o, h in self._holdings.items() if not pid_alive(h.pid, h.pid_started)]
        for owner in gone:
            log.info("releasing %s: its process %s ended", owner, self._holdings[owner].pid)
            del self._holdings[owner]
            self.peaks.end(owner)
        if gone:
            self._save_locked()
            self._cond.notify_all()
        return gone

    def _refresh(self) -> None:
        """The other servers' holdings re-read, ended ones released (caller holds self._cond)."""
        with self.file.lock():
            self._sync()
            self._prune()

    # --- arithmetic (see accounts) --------------------------------------------------------------
    def budget(self, device: str, total_gb: float | None) -> float:
        return accounts.budget(self.settings, device, total_gb)

    def headroom(self, total_gb: float | None) -> float:
        return accounts.headroom(self.settings, total_gb)

    def _owned_pids(self) -> set[int]:
        return {h.pid for h in self._all().values() if h.pid is not None} | {
            h.server_pid for h in self._others.values() if h.server_pid is not None
        }

    def _accounts(self, readings: dict[str, Reading]) -> dict[str, DeviceAccount]:
        """Each device's account (caller holds self._cond)."""
        return accounts.accounts(self.settings, readings, self._all().values(), self._owned_pids() | {os.getpid()})

    # --- public ---------------------------------------------------------------------------------
    def check(self, needs: dict[str, float]) -> Admission:
        """Would `needs` fit now? Reserves nothing."""
        readings = self._read()
        with self._cond:
            self._refresh()
            return admission(needs, self._accounts(readings), self._all().values())

    def reserve(
        self,
        owner: str,
        kind: Kind,
        needs: dict[str, float],
        frees_with: str,
        *,
        pinned: bool = False,
        pid: int | None = None,
        source: str = "estimator",
        key: str | None = None,
    ) -> Holding:
        """Reserve `needs` for `owner` now, or raise CapacityError saying who holds the memory. With a `key`
        (the work's configuration) it reserves what that configuration last took where that is more, and its
        peak is remembered (see footprints)."""
        readings = self._read()
        wanted = raised(needs, self._known(key))
        source = source if wanted == needs else "measured earlier"
        try:
            with self._cond:
                h = self._try_reserve(self._new_holding(owner, kind, wanted, frees_with, pinned, pid, source), readings)
        except CapacityError as exc:
            if wanted == needs:
                raise
            took = ", ".join(f"{gb:.2f} GB on {d}" for d, gb in wanted.items())
            raise CapacityError(
                f"{exc}. It reserves {took}: what this configuration took when it last ran (estimate "
                f"{sum(needs.values()):.2f} GB; kept in {self.footprints.path}, forgotten after a run within its "
                "estimate)"
            ) from None
        if key is not None:
            self.peaks.track(owner, key, needs)
        return h

    def reserve_or_queue(self, owner: str, kind: Kind, needs: dict[str, float], frees_with: str) -> Holding | None:
        """Reserve `needs` for `owner` if they fit now; else put `owner` in the memory queue and return None (its
        `wait_reserve` keeps that place). One step under the ledger's locks, for work that asked to wait: a
        `check` then a `reserve` lets another reservation land between them and turns the wait into a refusal."""
        readings = self._read()  # outside the lock, as everywhere: the admission itself is decided under it
        wanted = self._new_holding(owner, kind, needs, frees_with, False, None, "estimator")
        with self._cond:
            try:
                return self._try_reserve(wanted, readings)
            except CapacityError:
                self._queue.enter(owner)  # before the lock is let go: a release from now on wakes its waiter
                return None

    def _known(self, key: str | None) -> dict[str, float] | None:
        return self.footprints.known(key) if key is not None else None

    def expected(self, key: str | None, needs: dict[str, float]) -> dict[str, float]:
        """What work of configuration `key` would reserve: its estimate `needs`, raised per device to what the
        same configuration took last time when that was more."""
        return raised(needs, self._known(key))

    def _try_reserve(self, h: Holding, readings: dict[str, Reading]) -> Holding:
        """Admit `h` and record it, or raise CapacityError (caller holds self._cond)."""
        owner = h.owner
        with self.file.lock():  # held from reading the others' holdings to writing ours: no cross-server race
            self._sync()
            self._prune()
            if owner in self._holdings:
                raise InvalidInputError(f"{owner} already holds a reservation; release it first")
            adm = admission(h.devices, self._accounts(readings), self._all().values())
            if not adm.fits:
                raise CapacityError(f"{owner} {adm.reason}")
            h = h.model_copy(update={"started": datetime.now(UTC).isoformat(timespec="seconds")})
            self._holdings[owner] = h
            self._save_locked()
            return h

    def _new_holding(
        self,
        owner: str,
        kind: Kind,
        needs: dict[str, float],
        frees_with: str,
        pinned: bool,
        pid: int | None,
        source: str,
    ) -> Holding:
        pid = pid if pid is not None else os.getpid()
        h = Holding(
            owner=owner,
            kind=kind,
            devices=accounts.rounded(needs),
            started=datetime.now(UTC).isoformat(timespec="seconds"),
            pinned=pinned,
            pid=pid,
            pid_started=start_time(pid),
            frees_with=frees_with,
            source=source,
            server_pid=os.getpid(),
            server_started=start_time(os.getpid()),  # so a later process given this pid is not taken for this one
        )
        return h

    def wait_reserve(
        self,
        owner: str,
        kind: Kind,
        needs: dict[str, float],
        frees_with: str,
        cancel: threading.Event,
        *,
        ready: Callable[[], bool] | None = None,
        pid: int | None = None,
        key: str | None = None,
    ) -> Holding:
        """Queue for `needs` and return once reserved (first in line first). Raises CapacityError at once when
        the work can never fit (above the whole budget), or when `cancel` is set while waiting. `key` as in
        `reserve`."""
        estimate = needs
        needs = raised(needs, self._known(key))
        source = "estimator" if needs == estimate else "measured earlier"
        wanted = self._new_holding(owner, kind, needs, frees_with, False, pid, source)
        self._queue.enter(owner)
        try:
            while True:
                if cancel.is_set():
                    raise CapacityError(f"{owner} left the memory queue (cancelled)")
                readings = self._read()
                ok = ready is None or ready()  # outside the lock: it may read a database
                with self._cond:
                    self._never_fits(owner, needs, readings)
                    if self._queue.turn(owner, ok):
                        try:
                            h = self._try_reserve(wanted, readings)
                        except CapacityError:
                            pass
                        else:
                            if key is not None:
                                self.peaks.track(owner, key, estimate)
                            return h
                    # woken by a release; the timeout catches what changes outside the ledger (a process ending)
                    self._cond.wait(1.0)
                    if cancel.is_set():
                        raise CapacityError(f"{owner} left the memory queue (cancelled)")
        finally:
            self._queue.done(owner)

    def _never_fits(self, owner: str, needs: dict[str, float], readings: dict[str, Reading]) -> None:
        for device, gb in needs.items():
            r = readings.get(device)
            if r is None:
                raise InvalidInputError(f"no device '{device}' on this box")
            budget = self.budget(device, r.total_gb)
            if gb > budget:
                raise CapacityError(
                    f"{owner} needs {gb:.2f} GB on {device}, more than its whole {budget:.2f} GB budget; waiting "
                    "cannot help: ask for less, or raise memory_budget_gb"
                )

    def enter_queue(self, owner: str) -> None:
        """Take a place in line now, for a caller that reports the place before its waiter thread runs;
        wait_reserve keeps it (and leaves it when it returns or raises)."""
        self._queue.enter(owner)

    def leave_queue(self, owner: str) -> None:
        """Out of line now (a cancel): its waiter, woken here, sees its cancel event and returns."""
        self._queue.leave(owner)

    def position(self, owner: str) -> int | None:
        """1-based place in the memory queue, None when not queued."""
        return self._queue.position(owner)

    def release(self, owner: str, *, pid: int | None = None, pid_started: float | None = None) -> bool:
        """Give `owner`'s memory back. With `pid` (and its start time), only while that process holds it: the
        watcher of an exited worker must not release what a worker started after it under the same name holds."""
        with self._cond:
            h = self._holdings.get(owner)
            if h is not None and pid is not None and not _held_by(h, pid, pid_started):
                return False
            h = self._holdings.pop(owner, None)
            if h is not None:
                self._save()
                self._cond.notify_all()
            self.peaks.end(owner)  # under the lock: a new reservation of the same owner keeps its tracking
        return h is not None

    def update(
        self,
        owner: str,
        *,
        needs: dict[str, float] | None = None,
        pid: int | None = None,
        source: str | None = None,
        pinned: bool | None = None,
        measured: dict[str, float] | None = None,
    ) -> Holding | None:
        """Change a holding in place: a measured size replaces the estimate, a worker's pid replaces the server's."""
        with self._cond:
            h = self._holdings.get(owner)
            if h is None:
                return None
            changes: dict[str, object] = {}
            if needs is not None:
                changes["devices"] = accounts.rounded(needs)
            if pid is not None:
                changes.update(pid=pid, pid_started=start_time(pid))
            if source is not None:
                changes["source"] = source
            if pinned is not None:
                changes["pinned"] = pinned
            if measured is not None:  # what in-process work measured (a worker's is read from its processes)
                changes["measured_gb"] = accounts.rounded(measured) or {d: 0.0 for d in measured}
            h = h.model_copy(update=changes)
            self._holdings[owner] = h
            self._save()
            self._cond.notify_all()
        if measured is not None:
            self.peaks.seen(owner, measured)
        return h

    def observe(self, owner: str) -> dict[str, float] | None:
        """What a worker's process tree holds now, per device (None for in-process or unknown work); its peak
        is kept for the work's key. Families call it where their work is at its largest (an engine once ready)."""
        h = self.holding(owner)
        if h is None or h.pid is None or h.pid == os.getpid():
            return None
        m = accounts.measured(h, self._read()).measured_gb or {}
        self.peaks.seen(owner, m)
        return m

    def rename(self, owner: str, new_owner: str) -> bool:
        """Move a holding to another owner name (memory still held, the old name free for new work)."""
        with self._cond:
            h = self._holdings.pop(owner, None)
            if h is None:
                return False
            self._holdings[new_owner] = h.model_copy(update={"owner": new_owner})
            self._save()
            return True

    def holders(self, kind: Kind) -> list[str]:
        with self._cond:
            return [o for o, h in self._holdings.items() if h.kind == kind]

    def holding(self, owner: str) -> Holding | None:
        with self._cond:
            return self._holdings.get(owner)

    def state(self) -> BoxState:
        readings = self._read()
        with self._cond:
            self._refresh()
            devices = self._accounts(readings)
            holdings = [accounts.measured(h, readings) for h in self._all().values()]
            queued = self._queue.queued()
        for h in holdings:
            if h.measured_gb and h.pid != os.getpid():
                self.peaks.seen(h.owner, h.measured_gb)
        return BoxState(devices=list(devices.values()), holdings=holdings, queued=queued, warnings=drift(holdings))

    def _read(self) -> dict[str, Reading]:
        with self._cond:
            pids = self._owned_pids()
        return self.read(pids)


def _held_by(h: Holding, pid: int, started: float | None) -> bool:
    same_start = started is None or h.pid_started is None or abs(h.pid_started - started) < 1.0
    return h.pid == pid and same_start


def device_of(plan_device: str, gpus: int = 1) -> list[str]:
    """Ledger device names for a family's device string ('cpu', 'cuda', 'cuda (12/30 layers)')."""
    if plan_device.startswith("cuda"):
        return [f"cuda:{i}" for i in range(max(1, gpus))]
    return ["host"]
