"""What work of one configuration really took, remembered so that its next reservation is measured, not estimated.

A reservation may name its configuration (`key`: an engine's model and flags, a benchmark's task and shape, an
indexing run's embedder and device). While it holds memory the ledger keeps the peak it sees for it: a worker's
process tree, read whenever the ledger reads the devices or the family asks (`Ledger.observe`), or a figure the
family measured itself (an in-process run's growth, a worker's own peak) passed to `Ledger.update`. A peak above
the estimate by 10% is written to the store at once, so a second reservation of the same key, even while the first
still runs, reserves what the first took (per device, the larger of the two). When work ends having stayed within
its estimate the remembered figure is forgotten, so a fixed leak or a leaner build is picked up again.
Holdings restored after a server restart carry no key: their peaks are shown, not remembered.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gpubox.filelock import exclusive

log = logging.getLogger("gpubox.box")
ABOVE = 1.10  # a peak this far above the estimate replaces it for the next reservation


def _sizes(entry: dict[str, object]) -> dict[str, float]:
    """The finite sizes of one entry, none negative: a NaN had a load fit "nan GB" and reserve nothing."""
    out = {}
    for device, gb in entry.items():
        value = float(gb) if isinstance(gb, int | float) and not isinstance(gb, bool) else math.nan
        if math.isfinite(value) and value >= 0:
            out[device] = value
    return out


class FootprintStore:
    """{key: {device: GB}} in one JSON file, written atomically; a damaged file only loses the history."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def _all(self) -> dict[str, dict[str, float]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return {k: kept for k, v in data.items() if isinstance(v, dict) and (kept := _sizes(v))}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            log.warning("measured footprints %s unreadable (%s); work reserves its estimates", self.path, exc)
            return {}

    def known(self, key: str) -> dict[str, float] | None:
        """GB per device the last work of this configuration took, when that was above its estimate."""
        with self._lock:
            return self._all().get(key)

    @contextlib.contextmanager
    def _changing(self) -> Iterator[None]:
        """Read-modify-write under this process's lock and a file lock: every gpubox server on the box shares the
        file, and two writing at once would otherwise lose one's figure."""
        with self._lock, exclusive(self.path.with_name(f".{self.path.name}.lock")):
            yield

    def record(self, key: str, used: dict[str, float]) -> None:
        with self._changing():
            data = self._all()
            data[key] = {d: round(gb, 3) for d, gb in used.items()}
            self._write(data)

    def forget(self, key: str) -> None:
        with self._changing():
            data = self._all()
            if data.pop(key, None) is not None:
                self._write(data)

    def _write(self, data: dict[str, dict[str, float]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(tmp, self.path)


def raised(needs: dict[str, float], known: dict[str, float] | None) -> dict[str, float]:
    """`needs` with each device raised to what the last work of the same configuration took there."""
    if not known:
        return dict(needs)
    return {d: max(gb, known.get(d, 0.0)) for d, gb in needs.items()}


def above(used: dict[str, float], estimate: dict[str, float]) -> bool:
    """Any device more than 10% over its own estimate (a GPU's large share must not hide the host's overrun)."""
    return any(gb > estimate.get(d, 0.0) * ABOVE for d, gb in used.items() if d in estimate)


def overrun(used: dict[str, float], estimate: dict[str, float]) -> str:
    """The devices over their estimate, each against its own ('host 5.30 GB, above its 0.60 GB estimate'): a sum
    over devices read as an overrun beside a larger estimate when a GPU stayed well within its share."""
    over = [d for d, gb in used.items() if d in estimate and gb > estimate[d] * ABOVE]
    return "; ".join(f"{d} {used[d]:.2f} GB, above its {estimate[d]:.2f} GB estimate" for d in over)


@dataclass
class _Tracked:
    key: str
    estimate: dict[str, float]
    peak: dict[str, float] = field(default_factory=dict)


class Peaks:
    """The peak of each keyed holding while it runs, settled into the store (see the module docstring)."""

    def __init__(self, store: FootprintStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._tracked: dict[str, _Tracked] = {}

    def track(self, owner: str, key: str, estimate: dict[str, float]) -> None:
        with self._lock:
            self._tracked[owner] = _Tracked(key, dict(estimate))

    def peak(self, owner: str) -> dict[str, float] | None:
        """The highest reading of keyed work so far (None: not keyed, or not measured yet)."""
        with self._lock:
            t = self._tracked.get(owner)
            return dict(t.peak) if t is not None and t.peak else None

    def seen(self, owner: str, measured: dict[str, float]) -> None:
        """A reading of `owner`'s memory; a new peak above its estimate is remembered for its key at once."""
        with self._lock:
            t = self._tracked.get(owner)
            if t is None:
                return
            measured = {d: gb for d, gb in measured.items() if d in t.estimate}
            if all(gb <= t.peak.get(d, 0.0) for d, gb in measured.items()):
                return
            t.peak = {d: max(gb, t.peak.get(d, 0.0)) for d, gb in {**t.peak, **measured}.items()}
            if not above(t.peak, t.estimate):
                return
            key, peak, estimate = t.key, dict(t.peak), t.estimate
            # written under the lock: two readings at once must not leave the lower one on disk
            self._write(lambda: self.store.record(key, peak))
        log.warning("%s took %s; the next reservation of it takes that", owner, overrun(peak, estimate))

    def end(self, owner: str) -> None:
        """Work ended: a remembered figure it stayed within is forgotten (an unmeasured run changes nothing)."""
        with self._lock:
            t = self._tracked.pop(owner, None)
            if t is not None and t.peak and not above(t.peak, t.estimate):
                self._write(lambda: self.store.forget(t.key))

    def _write(self, act: Callable[[], None]) -> None:
        try:
            act()
        except OSError as exc:  # the work runs either way; only the history is lost
            log.warning("could not update %s (%s)", self.store.path, exc)


class Growth:
    """How much this process grew per device, at its highest, while in-process work ran (sampled by a thread
    every `every_s`; None when `alone()` was false at either end, as another piece of work's growth would be
    counted as this one's)."""

    def __init__(self, read: Callable[[], dict[str, float]], alone: Callable[[], bool], every_s: float = 0.5) -> None:
        self.read, self.alone, self.every_s = read, alone, every_s
        self._stop = threading.Event()
        self._before = read() if alone() else None
        self._peak = dict(self._before or {})
        self._thread = threading.Thread(target=self._sample, name="gpubox-growth", daemon=True)
        if self._before is not None:
            self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self.every_s):
            self._take()

    def _take(self) -> None:
        now = self.read()
        self._peak = {d: max(gb, self._peak.get(d, 0.0)) for d, gb in now.items()}

    def stop(self) -> dict[str, float] | None:
        if self._before is None:
            return None
        self._stop.set()
        self._thread.join()
        self._take()
        if not self.alone():
            return None
        return {d: max(0.0, gb - self._before.get(d, 0.0)) for d, gb in self._peak.items()}
