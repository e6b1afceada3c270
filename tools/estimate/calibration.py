"""Measured runs in SQLite (<state_dir>/calibration.sqlite); estimates prefer them over defaults."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpubox.tools.estimate.schemas import DeviceProfile, Measurement

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
DEVICE_COLUMNS = ["id", "gpu", "memory_bandwidth_gbs", "tflops", "note", "created_at"]

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
        with self._connect() as db:
            db.executescript(SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """The store's one connection, opened on first use, used under the lock, committed per block and
        closed in close(). One connection, not one per call: opening a WAL database costs ~1.5 ms, and an
        'all GPUs' estimate makes a hundred lookups."""
        with self._lock:
            if self._db is None:
                db = sqlite3.connect(self.path, timeout=10, check_same_thread=False)
                try:
                    db.execute("PRAGMA journal_mode=WAL")
                except sqlite3.Error:
                    db.close()
                    raise
                self._db = db
            with self._db:
                yield self._db

    def record(self, kind: str, gpu: str, model: str, **fields: Any) -> Measurement:
        cfg = json.dumps(fields.pop("config", {}) or {}, sort_keys=True, default=str)
        cols = {k: v for k, v in fields.items() if k in COLUMNS}
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
        d = dict(zip(COLUMNS, row, strict=True))
        d["config"] = json.loads(d["config"] or "{}")
        return Measurement(**d)

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
        **config_match: Any,
    ) -> Measurement | None:
        """Newest run on `gpu` with `column` set and the same method/config, preferring a model of similar size
        (within 4x) — efficiency depends on the GPU and the kind of work more than on the exact model."""
        if column not in COLUMNS:
            raise ValueError(column)
        runs = [
            m
            for m in self.list(kind=kind, gpu=gpu)
            if getattr(m, column) is not None
            and (method is None or m.method == method)
            and all(m.config.get(k) == v for k, v in config_match.items())
        ]
        if params:
            near = [m for m in runs if m.params and 0.25 <= m.params / params <= 4]
            runs = near or runs
        return runs[0] if runs else None

    # --- measured device profiles (memory bandwidth, matrix TFLOPS per dtype) -------------------------
    def record_device(
        self, gpu: str, memory_bandwidth_gbs: float | None, tflops: dict[str, float], note: str | None = None
    ) -> DeviceProfile:
        """Store a measured profile of a device (`gpu` = catalog id, or 'cpu'); estimates on that device use
        it in place of the catalog's peak figures."""
        if memory_bandwidth_gbs is not None and not memory_bandwidth_gbs > 0:
            raise ValueError(f"memory_bandwidth_gbs must be positive, got {memory_bandwidth_gbs}")
        bad = {k: v for k, v in tflops.items() if not (isinstance(v, int | float) and v > 0)}
        if bad:
            raise ValueError(f"tflops values must be positive numbers: {bad}")
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
        sql = f"SELECT {', '.join(DEVICE_COLUMNS)} FROM devices"
        args: list[Any] = []
        if gpu:
            sql += " WHERE gpu = ?"
            args.append(gpu)
        sql += " ORDER BY id DESC LIMIT ?"
        with self._connect() as db:
            rows = db.execute(sql, [*args, limit]).fetchall()
        out = []
        for row in rows:
            d = dict(zip(DEVICE_COLUMNS, row, strict=True))
            d["tflops"] = json.loads(d["tflops"] or "{}")
            out.append(DeviceProfile(**d))
        return out

    def latest_device(self, gpu: str) -> DeviceProfile | None:
        found = self.devices(gpu=gpu, limit=1)
        return found[0] if found else None

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
