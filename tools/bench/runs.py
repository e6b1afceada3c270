"""Stored bench runs: <state_dir>/bench/runs/<run_id>/ with run.json, table.json/.csv and the plots.

Run ids are generated here and checked against RUN_ID before any path is built, so a URI or tool argument
can never name a file outside the runs directory; nor can a symbolic link planted inside it: files are read with
O_NOFOLLOW and written by renaming a fresh file over the name, and a linked run folder is refused.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import re
import secrets
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpubox.errors import InvalidInputError, NotFoundError

RUN_ID = re.compile(r"^\d{8}-\d{6}-(attention|device)-[0-9a-f]{6}$")
FILE_NAME = re.compile(r"^[a-z0-9_.-]{1,80}\.(png|json|csv)$")
MIME = {"png": "image/png", "json": "application/json", "csv": "text/csv"}
TABLE_COLUMNS = [
    "backend",
    "head_dim",
    "seq_len",
    "time_ms",
    "time_ms_min",
    "time_ms_max",
    "spread_pct",
    "tflops",
    "speedup",
    "max_abs_error",
    "within_tolerance",
    "peak_memory_mb",
    "winner",
]


class RunStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def new_id(self, kind: str) -> str:
        return f"{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}-{kind}-{secrets.token_hex(3)}"

    def dir(self, run_id: str) -> Path:
        if not RUN_ID.fullmatch(run_id):
            raise InvalidInputError(f"'{run_id}' is not a bench run id; bench_list shows the stored runs")
        d = self.root / run_id
        if d.is_symlink():  # bench never makes one: a link would lead reads and writes outside the runs folder
            raise NotFoundError(f"{d} is a symbolic link, not a bench run folder; remove it (bench_list skips it)")
        return d

    def save(self, run_id: str, record: dict[str, Any], rows: list[dict[str, Any]] | None = None) -> None:
        d = self.dir(run_id)
        d.mkdir(parents=True, exist_ok=True)
        if rows is not None:
            self._write(d, "table.json", json.dumps(rows, indent=1).encode())
            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=TABLE_COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
            self._write(d, "table.csv", buf.getvalue().encode())
        self._write(d, "run.json", json.dumps(record, indent=1, default=str).encode())

    def save_file(self, run_id: str, name: str, data: bytes) -> None:
        self._checked_name(name)
        self._write(self.dir(run_id), name, data)

    def load(self, run_id: str) -> dict[str, Any]:
        """The run's record; NotFoundError when it is missing or damaged (not UTF-8, not JSON, not an object)."""
        if not self.dir(run_id).is_dir():
            raise NotFoundError(f"no bench run '{run_id}'; bench_list shows the stored runs")
        raw = self._read(run_id, "run.json")
        try:
            record = json.loads(raw.decode("utf-8"))
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError both
            raise self.damaged(run_id, f"run.json is not UTF-8 JSON ({exc})") from exc
        if not isinstance(record, dict):  # its fields are checked where they are read (BenchService)
            raise self.damaged(run_id, "run.json is not a bench run record")
        return record

    def damaged(self, run_id: str, why: str) -> NotFoundError:
        return NotFoundError(
            f"the record of bench run '{run_id}' is damaged: {why}. Remove its folder {self.root / run_id} "
            "(bench_list skips it) and run the benchmark again"
        )

    def read(self, run_id: str, name: str) -> tuple[bytes, str]:
        return self._read(run_id, name), MIME[self._checked_name(name)]

    def files(self, run_id: str) -> list[str]:
        d = self.dir(run_id)
        return sorted(
            p.name
            for p in d.iterdir()
            if FILE_NAME.fullmatch(p.name) and p.name != "run.json" and not p.is_symlink() and p.is_file()
        )

    def list(self, limit: int = 50) -> list[dict[str, Any]]:
        """The newest `limit` readable records (see records)."""
        return [rec for _, rec in itertools.islice(self.records(), limit)]

    def records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(run id, record) newest first; the id is the folder's, never the record's own. Runs still being
        written and damaged ones are left out, so that one bad folder cannot hide the others."""
        if not self.root.is_dir():
            return
        ids = sorted((p.name for p in self.root.iterdir() if RUN_ID.fullmatch(p.name)), reverse=True)
        for run_id in ids:
            try:
                yield run_id, self.load(run_id)
            except NotFoundError:
                continue

    def _read(self, run_id: str, name: str) -> bytes:
        """A regular file of the run, never through a symbolic link (O_NOFOLLOW: no gap between check and open)."""
        self._checked_name(name)
        path = self.dir(run_id) / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))  # a FIFO: no wait
        except OSError:  # missing, or a link (ELOOP)
            raise NotFoundError(f"run '{run_id}' has no file '{name}'; bench_list lists each run's files") from None
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise NotFoundError(f"run '{run_id}' has no file '{name}'; bench_list lists each run's files")
            return f.read()

    @staticmethod
    def _write(d: Path, name: str, data: bytes) -> None:
        """Write to a new file of a fresh name (O_EXCL follows no link), then rename it over `name`: a link planted
        at `name` is replaced, not written through, and readers never see half a file."""
        tmp = d / f".{name}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, d / name)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @staticmethod
    def _checked_name(name: str) -> str:
        if not FILE_NAME.fullmatch(name) or ".." in name:
            raise InvalidInputError(f"'{name}' is not a bench file name (e.g. tflops.png, table.csv)")
        return name.rsplit(".", 1)[1]


def uri(run_id: str, name: str) -> str:
    return f"bench://runs/{run_id}/{name}"
