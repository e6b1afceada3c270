"""Measured runs in SQLite (<state_dir>/calibration.sqlite); estimates prefer them over defaults."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sqlite3
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpubox.errors import BusyError, ConfigError
from gpubox.tools.estimate import bounds
from gpubox.tools.estimate.catalog import GpuSpec
from gpubox.tools.estimate.schemas import DeviceProfile, Measurement

log = logging.getLogger("gpubox.estimate")

SCHEMA = """
CREATE TABLE IF NOT EXISTS measurements (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL CHECK (kind IN ('inference', 'training')),
    gpu TEXT NOT NULL,
    model TEXT NOT NULL,
    params INTEGER,
    method TEXT,
    config TEXT NOT NULL DEFAULT '{}',
    peak_memory_gb REAL,
    tokens_per_s REAL,
    prefill_tokens_per_s REAL,
    decode_efficiency REAL,
    mfu REAL,
    activation_factor REAL,
    created_at TEXT NOT NULL,
    note TEXT
);
CREATE INDEX IF NOT EXISTS measurements_gpu ON measurements (kind, gpu);
CREATE TABLE IF NOT EXISTS devices (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    gpu TEXT NOT NULL,
    memory_bandwidth_gbs REAL,
    tflops TEXT NOT NULL DEFAULT '{}',
    note TEXT,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS devices_gpu ON devices (gpu);
"""
NUMBERS = (*bounds.MEASURED, "decode_efficiency", "mfu", "activation_factor")
DEVICE_COLUMNS = ["id", "gpu", "memory_bandwidth_gbs", "tflops", "note", "created_at"]
KINDS = ("inference", "training")
MISSING = "(missing)"  # shown for a NULL in a text column the schema requires (a hand edit, a table without checks)

COLUMNS = [
    "id",
    "kind",
    "gpu",
    "model",
    "params",
    "method",
    "config",
    "peak_memory_gb",
    "tokens_per_s",
    "prefill_tokens_per_s",
    "decode_efficiency",
    "mfu",
    "activation_factor",
    "created_at",
    "note",
]


class CalibrationStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._db: sqlite3.Connection | None = None
        self._logged: set[tuple[str, int]] = set()  # rows already logged as ignored: once each, not per lookup
        # why the file is no calibration database gpubox can read, and the file's stat then: estimates run on
        # without it, and it is tried again once the file changes (moved aside, replaced)
        self.damage: str | None = None
        self._damaged_stat: tuple[int, int, int] | None = None
        with contextlib.suppress(ConfigError), self._connect():
            pass

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """The store's one connection, opened on first use, used under the lock, committed per block and
        closed in close(). One connection, not one per call: opening a WAL database costs ~1.5 ms, and an
        'all GPUs' estimate makes a hundred lookups. A damaged file raises ConfigError saying what to do."""
        with self._lock:
            if self.damage is not None and _stat(self.path) == self._damaged_stat:
                raise ConfigError(self.damage)
            self.damage = None
            try:
                if self._db is None:
                    self._db = _open(self.path)
                with self._db:
                    yield self._db
            except sqlite3.DatabaseError as exc:
                if isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc)):
                    raise BusyError(
                        f"the calibration database {self.path} is locked by another process; try again"
                    ) from exc
                if isinstance(exc, sqlite3.IntegrityError | sqlite3.ProgrammingError):
                    raise  # a caller's mistake, not the file's
                raise ConfigError(self._damaged(exc)) from exc

    def _damaged(self, exc: sqlite3.DatabaseError) -> str:
        """Note the file as damaged (logged once per change of the file) and close its connection."""
        if self._db is not None:
            self._db.close()
            self._db = None
        self._damaged_stat = _stat(self.path)
        self.damage = (
            f"the calibration database {self.path} cannot be read ({exc}); estimates use defaults without "
            f"measured runs. Move it aside (e.g. rename it to {self.path.name}.bad); gpubox starts a new one"
        )
        log.warning("%s", self.damage)
        return self.damage

    def record(self, kind: str, gpu: str, model: str, **fields: Any) -> Measurement:
        cfg = json.dumps(fields.pop("config", {}) or {}, sort_keys=True, default=str)
        cols = {k: v for k, v in fields.items() if k in COLUMNS}
        bounds.raise_if([bounds.stored_problem(cols)])  # the device-specific bounds were checked by the caller
        names = ["kind", "gpu", "model", "config", "created_at", *cols]
        values = [kind, gpu, model, cfg, datetime.now(UTC).isoformat(timespec="seconds"), *cols.values()]
        with self._connect() as db:
            cur = db.execute(
                f"INSERT INTO measurements ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                values,
            )
            rowid = cur.lastrowid
        assert rowid is not None
        return self.get(rowid)

    def _row(self, row: tuple[Any, ...]) -> Measurement:
        """A stored row; one out of bounds or broken by a hand edit (text in a number column, bad JSON, NULL or an
        unknown kind where the schema wants text) is read with `ignored` saying why, so estimates skip it and
        listings still show it."""
        d = dict(zip(COLUMNS, row, strict=True))
        why = _fill_text(d, ("gpu", "model", "created_at")) or bounds.stored_problem(d)
        try:
            cfg = json.loads(d["config"] or "{}")
        except (json.JSONDecodeError, TypeError):
            cfg = None
        if not isinstance(cfg, dict):
            why, cfg = why or f"config is not a JSON object: {str(d['config'])[:80]!r}", {}
        for col in NUMBERS:  # junk would fail the model; NaN reads as null and `ignored` says why
            if d[col] is not None and not bounds.is_number(d[col]):
                d[col] = math.nan
        if why is not None:
            self._log_ignored("calibration", d["id"], why)
        params = d["params"] if isinstance(d["params"], int) else None
        d.update(config=cfg, ignored=why, params=params, note=None if d["note"] is None else str(d["note"]))
        return Measurement(**d)

    def _log_ignored(self, what: str, rowid: int, why: str) -> None:
        with self._lock:
            if (what, rowid) in self._logged:
                return
            self._logged.add((what, rowid))
        log.warning("%s #%d in %s is ignored by estimates: %s", what, rowid, self.path, why)

    def get(self, rowid: int) -> Measurement:
        with self._connect() as db:
            row = db.execute(f"SELECT {', '.join(COLUMNS)} FROM measurements WHERE id = ?", (rowid,)).fetchone()
        return self._row(row)

    def list(self, kind: str | None = None, gpu: str | None = None, limit: int = 200) -> list[Measurement]:
        where, args = [], []
        if kind:
            where.append("kind = ?")
            args.append(kind)
        if gpu:
            where.append("gpu = ?")
            args.append(gpu)
        sql = f"SELECT {', '.join(COLUMNS)} FROM measurements"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ?"
        with self._connect() as db:
            rows = db.execute(sql, [*args, limit]).fetchall()
        return [self._row(r) for r in rows]

    def best(
        self,
        kind: str,
        gpu: str,
        column: str,
        params: int | None = None,
        method: str | None = None,
        spec: GpuSpec | None = None,
        config: Mapping[str, object] | None = None,
    ) -> Measurement | None:
        """Newest run on `gpu` with `column` set and the same method and `config` entries, preferring a model of
        similar size (within 4x) — efficiency depends on the GPU and the kind of work more than on the exact model.
        Rows out of bounds (for `spec`, the device, when given) are skipped."""
        if column not in COLUMNS:
            raise ValueError(column)
        runs = [
            m
            for m in self._usable(kind, gpu)
            if self.why_ignored(m, spec) is None
            and getattr(m, column) is not None
            and (method is None or m.method == method)
            and all(m.config.get(k) == v for k, v in (config or {}).items())
        ]
        if params:
            near = [m for m in runs if m.params and 0.25 <= m.params / params <= 4]
            runs = near or runs
        return runs[0] if runs else None

    def ignored(self, kind: str, spec: GpuSpec) -> list[str]:
        """Why each stored run of `kind` on this device is left out of estimates (out of bounds), in words; first
        why all are, when the database cannot be read."""
        runs = self._usable(kind, spec.id)
        out = [self.damage] if self.damage else []
        for m in runs:
            if why := self.why_ignored(m, spec):
                out.append(f"calibration #{m.id} ({m.kind}, {m.model} on {m.gpu}) is ignored: {why}")
        return out

    def _usable(self, kind: str, gpu: str) -> list[Measurement]:
        """The runs estimates may draw on: none when the database cannot be read (`damage` says why)."""
        try:
            return self.list(kind=kind, gpu=gpu)
        except ConfigError:
            return []

    def why_ignored(self, m: Measurement, spec: GpuSpec | None) -> str | None:
        """Why estimates leave this row out: out of bounds on its own, or (given the device) against `spec`."""
        why = m.ignored or (bounds.prefill_problem(m, spec) if spec is not None else None)
        if why and not m.ignored:
            self._log_ignored("calibration", m.id, why)
        return why

    # --- measured device profiles (memory bandwidth, matrix TFLOPS per dtype) -------------------------
    def record_device(
        self,
        gpu: str,
        memory_bandwidth_gbs: float | None,
        tflops: dict[str, float],
        note: str | None = None,
        spec: GpuSpec | None = None,
    ) -> DeviceProfile:
        """Store a measured profile of a device (`gpu` = catalog id, or 'cpu'); estimates on that device use
        it in place of the catalog's peak figures. Each figure must be finite, > 0 and within `spec`'s datasheet
        ceiling (bounds.device_problems; without a spec, what any current host reaches)."""
        bounds.raise_if(bounds.device_problems(spec, memory_bandwidth_gbs, dict(tflops)))
        clean = {k.lower(): float(v) for k, v in tflops.items()}
        when = datetime.now(UTC).isoformat(timespec="seconds")
        with self._connect() as db:
            cur = db.execute(
                "INSERT INTO devices (gpu, memory_bandwidth_gbs, tflops, note, created_at) VALUES (?, ?, ?, ?, ?)",
                (gpu, memory_bandwidth_gbs, json.dumps(clean, sort_keys=True), note, when),
            )
            rowid = cur.lastrowid
        assert rowid is not None
        found = self.devices(gpu=gpu, limit=1)
        return found[0]

    def devices(self, gpu: str | None = None, limit: int = 200) -> list[DeviceProfile]:
        """Measured profiles, newest first; none when the database cannot be read (estimates run on; list()
        and ignored() say why)."""
        sql = f"SELECT {', '.join(DEVICE_COLUMNS)} FROM devices"
        args: list[Any] = []
        if gpu:
            sql += " WHERE gpu = ?"
            args.append(gpu)
        sql += " ORDER BY id DESC LIMIT ?"
        try:
            with self._connect() as db:
                rows = db.execute(sql, [*args, limit]).fetchall()
        except ConfigError:
            return []
        return [self._device(row) for row in rows]

    def _device(self, row: tuple[Any, ...]) -> DeviceProfile:
        """A stored profile; figures out of bounds or broken by a hand edit set `ignored` (and are left out of
        `tflops`, whose schema allows only numbers)."""
        d = dict(zip(DEVICE_COLUMNS, row, strict=True))
        text = _fill_text(d, ("gpu", "created_at"))
        try:
            raw = json.loads(d["tflops"] or "{}")
        except (json.JSONDecodeError, TypeError):
            raw = None
        found = bounds.device_problems(None, d["memory_bandwidth_gbs"], raw if isinstance(raw, dict) else {})
        if not isinstance(raw, dict):
            found.insert(0, f"tflops is not a JSON object: {str(d['tflops'])[:80]!r}")
        tflops = {str(k): float(v) for k, v in (raw if isinstance(raw, dict) else {}).items() if bounds.is_number(v)}
        bw = d["memory_bandwidth_gbs"]
        why = text or (found[0] if found else None)
        if why is not None:
            self._log_ignored("device profile", d["id"], why)
        d.update(
            tflops={k: v for k, v in tflops.items() if math.isfinite(v)},
            memory_bandwidth_gbs=bw if bw is None or bounds.is_number(bw) else math.nan,
            note=None if d["note"] is None else str(d["note"]),
            ignored=why,
        )
        return DeviceProfile(**d)

    def latest_device(self, gpu: str) -> DeviceProfile | None:
        found = self.devices(gpu=gpu, limit=1)
        return found[0] if found else None

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


def _open(path: Path) -> sqlite3.Connection:
    """A connection to the store's file with its tables made (or checked: a table from an older gpubox lacks
    columns this one reads, which raises here as sqlite's own 'no such column' would on the first lookup)."""
    db = sqlite3.connect(path, timeout=10, check_same_thread=False)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.executescript(SCHEMA)
        for table, cols in (("measurements", COLUMNS), ("devices", DEVICE_COLUMNS)):
            have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
            if missing := [c for c in cols if c not in have]:
                raise sqlite3.OperationalError(f"table {table} has no column {', '.join(missing)} (an older layout)")
    except BaseException:
        db.close()
        raise
    return db


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _fill_text(d: dict[str, Any], required: tuple[str, ...]) -> str | None:
    """Put text in the columns the schema requires it in (a hand edit, or a table made without the constraints,
    may hold NULL, a number or an unknown kind there), so the row validates; why the row is ignored, or None."""
    found = []
    if "kind" in d and d["kind"] not in KINDS:
        found.append(f"kind {d['kind']!r} is neither 'inference' nor 'training' (listed as 'inference')")
        d["kind"] = "inference"
    for col in required:
        if d[col] is None:
            found.append(f"{col} is missing")
            d[col] = MISSING
        elif not isinstance(d[col], str):
            d[col] = str(d[col])
    if d.get("method") is not None:
        d["method"] = str(d["method"])
    return "; ".join(found) or None
