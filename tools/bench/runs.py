"""Stored bench runs: <state_dir>/bench/runs/<run_id>/ with run.json, table.json/.csv and the plots.

Run ids are generated here and checked against RUN_ID before any path is built, so a URI or tool argument
can never name a file outside the runs directory.
"""

from __future__ import annotations

import csv
import io
import json
import re
import secrets
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
        return self.root / run_id

    def save(self, run_id: str, record: dict[str, Any], rows: list[dict[str, Any]] | None = None) -> None:
        d = self.dir(run_id)
        d.mkdir(parents=True, exist_ok=True)
        if rows is not None:
            (d / "table.json").write_text(json.dumps(rows, indent=1))
            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=TABLE_COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
            (d / "table.csv").write_text(buf.getvalue())
        tmp = d / "run.json.tmp"
        tmp.write_text(json.dumps(record, indent=1, default=str))
        tmp.replace(d / "run.json")  # readers never see half a record

    def save_file(self, run_id: str, name: str, data: bytes) -> None:
        self._checked_name(name)
        (self.dir(run_id) / name).write_bytes(data)

    def load(self, run_id: str) -> dict[str, Any]:
        path = self.dir(run_id) / "run.json"
        if not path.is_file():
            raise NotFoundError(f"no bench run '{run_id}'; bench_list shows the stored runs")
        return json.loads(path.read_text())

    def read(self, run_id: str, name: str) -> tuple[bytes, str]:
        ext = self._checked_name(name)
        path = self.dir(run_id) / name
        if not path.is_file():
            raise NotFoundError(f"run '{run_id}' has no file '{name}'; bench_list lists each run's files")
        return path.read_bytes(), MIME[ext]

    def files(self, run_id: str) -> list[str]:
        d = self.dir(run_id)
        return sorted(p.name for p in d.iterdir() if FILE_NAME.fullmatch(p.name) and p.name != "run.json")

    def list(self, limit: int = 50) -> list[dict[str, Any]]:
        if not self.root.is_dir():
            return []
        ids = sorted((p.name for p in self.root.iterdir() if RUN_ID.fullmatch(p.name)), reverse=True)
        out = []
        for run_id in ids:
            try:
                out.append(self.load(run_id))
            except (NotFoundError, json.JSONDecodeError):
                continue  # a run still being written, or a damaged one: list the rest
            if len(out) >= limit:
                break
        return out

    @staticmethod
    def _checked_name(name: str) -> str:
        if not FILE_NAME.fullmatch(name) or ".." in name:
            raise InvalidInputError(f"'{name}' is not a bench file name (e.g. tflops.png, table.csv)")
        return name.rsplit(".", 1)[1]


def uri(run_id: str, name: str) -> str:
    return f"bench://runs/{run_id}/{name}"
