"""Where engines live on this box: one JSON record per engine in `<state_dir>/serve/engines/`, shared by every
gpubox server here (an engine one server started is found, routed and stopped by the others), the loopback ports
they are given and their logs.

Kept apart from engines.py, which starts, watches and stops the processes: this is only the records' storage and
its locking. A record changes under this process's lock and a file lock, so a stop from one server while another
spawns cannot lose the pid, and a state moves only from the states a change expects (`move`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

from gpubox.errors import NotFoundError
from gpubox.filelock import exclusive
from gpubox.tools.serve.schemas import EngineRecord, EngineState

log = logging.getLogger("gpubox.serve")
LOG_TAIL_LINES = 30


def free_port(held: set[int] | frozenset[int] = frozenset()) -> int:
    """A loopback port nothing is bound to and no live engine has been given (one still preparing has not
    bound its port yet)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in held:
            return port


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def log_tail(path: str | None, lines: int = LOG_TAIL_LINES) -> str | None:
    if not path or not Path(path).is_file():
        return None
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 64_000))
        text = f.read().decode("utf-8", "replace")
    return "\n".join(text.splitlines()[-lines:])


class RecordStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        # reentrant, the file lock taken by the outermost holder only (flock would wait on itself)
        self._lock = threading.RLock()
        self._depth = 0

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            with exclusive(self.root / ".lock"):
                self._depth = 1
                try:
                    yield
                finally:
                    self._depth = 0

    # --- records --------------------------------------------------------------------------------
    def file(self, engine_id: str) -> Path:
        return self.root / f"{engine_id}.json"

    def read(self, path: Path) -> EngineRecord | None:
        try:
            rec = EngineRecord.model_validate_json(path.read_text(encoding="utf-8"))
        except FileNotFoundError:  # removed meanwhile (a detach, the week-old sweep): nothing to report
            return None
        except (OSError, ValueError) as exc:
            log.warning("engine record %s unreadable (%s); skipped", path, exc)
            return None
        if rec.id != path.stem or not rec.id.isalnum():
            # the id names the files gpubox writes and removes: "/tmp/x/victim" had serve_list delete files outside
            log.warning("engine record %s names another id (%r); skipped", path, rec.id[:80])
            return None
        return rec

    def load(self) -> dict[str, EngineRecord]:
        found = (self.read(p) for p in sorted(self.root.glob("*.json")))
        return {r.id: r for r in found if r is not None}

    def write(self, rec: EngineRecord) -> None:
        tmp = self.root / f".{rec.id}.{os.getpid()}.{threading.get_ident()}.tmp"  # unique per writer
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(rec.model_dump_json(indent=1))
        os.replace(tmp, self.file(rec.id))

    def remove(self, rec: EngineRecord) -> None:
        with self.locked():
            self.file(rec.id).unlink(missing_ok=True)
            if rec.log_path and Path(rec.log_path).parent == self.root:  # only a log of ours, in this folder
                Path(rec.log_path).unlink(missing_ok=True)

    def set(self, engine_id: str, **changes: object) -> EngineRecord:
        with self.locked():
            return self.set_locked(engine_id, **changes)

    def move(self, engine_id: str, sources: tuple[EngineState, ...], **changes: object) -> EngineRecord | None:
        """Change the record only while its state is one of `sources` (a serve_stop may have come between a
        check and this write: 'stopped' is never overwritten by 'ready' or 'failed'); None when it was not."""
        with self.locked():
            current = self.read(self.file(engine_id))
            if current is None or current.state not in sources:
                return None
            return self.set_locked(engine_id, **changes)

    def set_locked(self, engine_id: str, **changes: object) -> EngineRecord:
        current = self.read(self.file(engine_id))
        if current is None:
            raise NotFoundError(f"no engine '{engine_id}'; serve_list shows them")
        rec = current.model_copy(update=changes)
        self.write(rec)
        return rec
