"""Job store: one SQLite row per job plus a job folder (config, log, metrics JSONL, checkpoints).

The server and the worker processes both write here, so every connection is short-lived with a busy timeout,
and the worker owns the progress of its own job. A job's process is identified by pid *and* start time, so a
recycled pid after a reboot or a long uptime is never mistaken for the job.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpubox.tools.box.capacity import pid_alive, start_time
from gpubox.tools.finetune.schemas import ACTIVE, JobState, ProbeResult

CANCEL_MARK = "cancel-requested"  # finetune_cancel's mark in a job's folder: its SIGTERM is a cancel

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    adapter_name TEXT NOT NULL,
    base_model TEXT NOT NULL,
    method TEXT NOT NULL,
    created REAL NOT NULL,
    pid INTEGER,
    pid_started REAL,
    finished REAL,
    error TEXT,
    result TEXT,
    calibrated INTEGER NOT NULL DEFAULT 0,
    probe_calibrated INTEGER NOT NULL DEFAULT 0
)
"""
# columns added after the first release, for stores created before them. server_pid/server_started name the
# server that last put the job in 'starting' and starting_since when, so a start that server never finished (it
# died, or its spawn failed unseen) is told from one under way
MIGRATIONS = {
    "probe_calibrated": "ALTER TABLE jobs ADD COLUMN probe_calibrated INTEGER NOT NULL DEFAULT 0",
    "server_pid": "ALTER TABLE jobs ADD COLUMN server_pid INTEGER",
    "server_started": "ALTER TABLE jobs ADD COLUMN server_started REAL",
    "starting_since": "ALTER TABLE jobs ADD COLUMN starting_since REAL",
}
LOG_TAIL_LINES = 30
# A start (row in 'starting', no pid yet) takes a Popen, a ledger write and a row update, each behind a lock with
# a 30 s timeout at most; one still without a pid after this long is taken as abandoned even if its server lives
STARTING_TIMEOUT_S = 600.0


def starter() -> dict[str, Any]:
    """The fields that name this server as the one starting a job now (set with every move into 'starting')."""
    return {"server_pid": os.getpid(), "server_started": start_time(os.getpid()), "starting_since": time.time()}


class JobStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.jobs_dir = root / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.db = root / "jobs.sqlite"
        with self._conn() as c:
            c.execute("PRAGMA journal_mode=WAL")
            c.execute(SCHEMA)
            have = {r["name"] for r in c.execute("PRAGMA table_info(jobs)")}
            for col, ddl in MIGRATIONS.items():
                if col not in have:
                    add_column(c, ddl)

    @contextmanager
    def _conn(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.db, timeout=30)
        conn.row_factory = sqlite3.Row
        try:
            with conn:
                yield conn
        finally:
            conn.close()

    def job_dir(self, job_id: str) -> Path:
        return self.jobs_dir / job_id

    def create(self, job_id: str, adapter_name: str, base_model: str, method: str, state: str = "starting") -> None:
        s = starter()
        with self._conn() as c:
            c.execute(
                "INSERT INTO jobs (id, state, adapter_name, base_model, method, created, server_pid, server_started, "
                "starting_since) VALUES (?,?,?,?,?,?,?,?,?)",
                (job_id, state, adapter_name, base_model, method, time.time(), *s.values()),
            )

    def get(self, job_id: str) -> dict[str, Any] | None:
        with self._conn() as c:
            row = c.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return dict(row) if row else None

    def all(self) -> list[dict[str, Any]]:
        with self._conn() as c:
            return [dict(r) for r in c.execute("SELECT * FROM jobs ORDER BY created DESC")]

    def ids(self) -> list[str]:
        return [r["id"] for r in self.all()]

    def update(self, job_id: str, **fields: Any) -> None:
        if "result" in fields and not isinstance(fields["result"], str | None):
            fields["result"] = json.dumps(fields["result"])
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self._conn() as c:
            c.execute(f"UPDATE jobs SET {cols} WHERE id = ?", (*fields.values(), job_id))

    def transition(self, job_id: str, old: str, new: str, **fields: Any) -> bool:
        """Move the job from state `old` to `new` only if it is still in `old`: one of two racers wins."""
        cols = ", ".join(f"{k} = ?" for k in ("state", *fields))
        with self._conn() as c:
            cur = c.execute(f"UPDATE jobs SET {cols} WHERE id = ? AND state = ?", (new, *fields.values(), job_id, old))
            return cur.rowcount == 1

    def claim(self, job_id: str, flag: str) -> bool:
        """Set a 0/1 flag column once; True only for the caller that set it (two status calls never both win)."""
        if flag not in ("calibrated", "probe_calibrated"):
            raise ValueError(flag)
        with self._conn() as c:
            cur = c.execute(f"UPDATE jobs SET {flag} = 1 WHERE id = ? AND {flag} = 0", (job_id,))
            return cur.rowcount == 1

    def set_process(self, job_id: str, pid: int) -> None:
        self.update(job_id, pid=pid, pid_started=start_time(pid))

    def finish(
        self, job_id: str, state: JobState, error: str | None = None, result: dict[str, Any] | None = None
    ) -> None:
        fields: dict[str, Any] = {"state": state, "finished": time.time(), "error": error}
        if result is not None:
            fields["result"] = result
        self.update(job_id, **fields)

    def reconcile(self, job_id: str) -> dict[str, Any] | None:
        """The job row, after marking an active job whose process is gone as failed (with its log tail)."""
        row = self.get(job_id)
        if row is None or row["state"] not in ACTIVE or pid_alive(row["pid"], row["pid_started"]):
            return row
        if row["pid"] is None:  # between its creation and its spawn: being started, unless that start was abandoned
            if row["state"] == "starting" and _abandoned(row):
                self.fail_unstarted(job_id, "its worker was never started (the server starting it stopped or failed)")
                return self.get(job_id)
            return row
        time.sleep(0.2)  # the worker may be committing its final state right now
        row = self.get(job_id)
        if row is None or row["state"] not in ACTIVE or pid_alive(row["pid"], row["pid_started"]):
            return row
        job_dir = self.job_dir(job_id)
        if (job_dir / CANCEL_MARK).exists() and not row["error"]:
            # finetune_cancel's SIGTERM ended the worker before it could end the job itself (still importing, or
            # stopped while saving): what the user asked for, not a failure to fix
            trained = read_metrics(job_dir) or any((job_dir / "checkpoints").glob("checkpoint-*"))
            said = "cancelled; the worker stopped before saving a final checkpoint (earlier ones are kept)"
            self.finish(job_id, "cancelled", error=said if trained else "cancelled before training started")
            return self.get(job_id)
        # a multi-rank job's lead records what it saw and leaves the state to this point, when the launcher has
        # exited and logged which rank failed first
        from gpubox.tools.finetune.launcher import root_cause

        first = root_cause(log_tail(self.job_dir(job_id), lines=400))
        seen = row["error"] or "the worker process exited without finishing"
        self.finish(job_id, "failed", error=f"{first}; {seen}; see log_tail" if first else f"{seen}; see log_tail")
        return self.get(job_id)

    def fail_unstarted(self, job_id: str, error: str) -> bool:
        """'starting' to 'failed' for a job whose worker never got a pid; False when it has one or moved on."""
        with self._conn() as c:
            cur = c.execute(
                "UPDATE jobs SET state = 'failed', error = ?, finished = ? "
                "WHERE id = ? AND state = 'starting' AND pid IS NULL",
                (error, time.time(), job_id),
            )
            return cur.rowcount == 1

    def active(self) -> list[dict[str, Any]]:
        return [r for jid in self.ids() if (r := self.reconcile(jid)) and r["state"] in ACTIVE]


def add_column(c: sqlite3.Connection, ddl: str) -> None:
    """One ALTER TABLE ... ADD COLUMN, harmless when another server opening the same database at the same moment
    added it between our column list and this (both saw it missing; one failed its first fine-tuning call)."""
    try:
        c.execute(ddl)
    except sqlite3.OperationalError as exc:
        if "duplicate column name" not in str(exc):
            raise


def _abandoned(row: dict[str, Any]) -> bool:
    """A 'starting' row without a pid whose start nobody is finishing: the server starting it is gone, or it has
    been starting for longer than any start takes (rows from before the columns existed: since their creation)."""
    if row["server_pid"] is not None and not pid_alive(row["server_pid"], row["server_started"]):
        return True
    return time.time() - (row["starting_since"] or created_of(row)) > STARTING_TIMEOUT_S


def created_of(row: dict[str, Any]) -> float:
    """The row's creation time, 0 when a hand edit left no number there: sorting by it, or taking the age of a
    start from it, must not fail every fine-tuning tool for one damaged row."""
    created = row.get("created")
    return float(created) if isinstance(created, int | float) and _is_number(created) else 0.0


def log_tail(job_dir: Path, lines: int = LOG_TAIL_LINES) -> str:
    log = job_dir / "log.txt"
    if not log.is_file():
        return ""
    with log.open("rb") as f:
        f.seek(max(0, log.stat().st_size - 16_384))
        text = f.read().decode("utf-8", "replace")
    return "\n".join(text.splitlines()[-lines:])


def read_metrics(job_dir: Path) -> list[dict[str, Any]]:
    """The worker's metric records, oldest first. A line that is no record of the worker's shape (half written
    right now, or damaged by hand) is skipped: readers index its fields and compare them with numbers."""
    path = job_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:  # unreadable (permissions): no metrics, as before the first step
        return []
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written right now
        if metric_ok(record):
            out.append(record)
    return out


# metric fields readers do arithmetic on: numbers (or null) and whole numbers; an event is text
METRIC_NUMBERS = ("t", "epoch", "loss", "eval_loss", "learning_rate", "tokens_per_s", "peak_memory_gb")
METRIC_INTS = ("step", "per_device_train_batch_size", "gradient_accumulation_steps")


def metric_ok(record: object) -> bool:
    """Whether a parsed metrics.jsonl line has the types the worker writes."""
    if not isinstance(record, dict):
        return False
    if any(record.get(k) is not None and not _is_number(record[k]) for k in METRIC_NUMBERS):
        return False
    if any(k in record and (not isinstance(record[k], int) or isinstance(record[k], bool)) for k in METRIC_INTS):
        return False
    if "event" in record and not isinstance(record["event"], str):
        return False
    if "probe" in record:
        try:
            ProbeResult.model_validate(record["probe"])
        except ValidationError:
            return False
    return True


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def write_json(path: Path, data: Any) -> None:
    """Write a JSON file whole or not at all (a temporary file in the same folder, renamed over it): the server
    reads a job's config.json while its worker rewrites it, and must never see it half written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
    os.replace(tmp, path)


def append_metric(job_dir: Path, record: dict[str, Any]) -> None:
    with (job_dir / "metrics.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def exited(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


def gone(pid: int, started: float | None, timeout: float) -> bool:
    """For a worker this process did not start (it outlived a restart): poll its liveness."""
    if not pid_alive(pid, started):
        return True
    time.sleep(timeout)  # no handle to wait on a process that is not our child
    return not pid_alive(pid, started)
