"""The ledger's state file: one JSON file every gpubox server on the box shares, under a file lock.

Several servers may run at once (each MCP client may start its own over stdio). Each keeps its own holdings
and rewrites only those; the others' are re-read under the lock before every admission, so two servers cannot
both take the last gigabyte. A holding names the server that made it (`server_pid`) and the process that holds
the memory (`pid`): what a live worker or engine holds outlives its server and is taken over by the next one.
Both pids are checked with their start times (`server_started`, `pid_started`): a dead server whose pid an
unrelated process got would otherwise look alive for good, and what it held would never be given back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Iterable
from pathlib import Path

from gpubox.errors import GpuboxError
from gpubox.filelock import exclusive
from gpubox.tools.box.capacity import pid_alive, start_time
from gpubox.tools.box.schemas import Holding

log = logging.getLogger("gpubox.box")


class LedgerFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def lock(self) -> contextlib.AbstractContextManager[None]:
        return exclusive(self.path.with_suffix(".lock"))

    def read(self) -> list[Holding]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            entries = raw.get("holdings", [])
            if not isinstance(entries, list):
                raise ValueError("'holdings' is not a list")
        except FileNotFoundError:
            return []
        except (OSError, ValueError, AttributeError) as exc:  # damaged: must not stop the server; say why
            log.warning("memory ledger %s unreadable (%s); taking it as empty", self.path, exc)
            return []
        return [h for h in map(self._holding, entries) if h is not None]

    def _holding(self, entry: object) -> Holding | None:
        """One holding, or None (logged) for a bad one: one bad entry emptied the whole ledger, live reservations
        with it, and the box was over-committed."""
        try:
            return Holding.model_validate(entry)
        except ValueError as exc:
            log.warning("memory ledger %s: a holding is unreadable (%s); skipped", self.path, str(exc)[:300])
            return None

    def write(self, mine: Iterable[Holding]) -> None:
        """Replace this server's holdings in the file, keeping live servers' and what a dead server's workers
        still hold (an orphan nobody has adopted yet: dropping it would free memory a live process uses)
        (caller holds the lock)."""
        mine = list(mine)
        taken_over = {(h.owner, h.pid) for h in mine}
        others = [
            h
            for h in self.read()
            if h.server_pid not in (None, os.getpid()) and _kept(h) and not _adopted(h, taken_over)
        ]
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # unique per writer
        data = {"holdings": [h.model_dump(mode="json") for h in [*others, *mine]]}
        try:
            tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:  # a folder in its place: every tool reading the ledger failed unexplained
            tmp.unlink(missing_ok=True)
            raise GpuboxError(
                f"the memory ledger {self.path} cannot be written ({exc.strerror or exc}); remove whatever is in its "
                "place (gpubox makes it again)"
            ) from None


def _adopted(h: Holding, taken_over: set[tuple[str, int | None]]) -> bool:
    """A dead server's holding that this server took over (the same owner held by the same process): ours now.
    Owner names alone say nothing: another live server's "model m" is not this server's "model m"."""
    return (h.owner, h.pid) in taken_over and not server_alive(h)


def _kept(h: Holding) -> bool:
    """Another server's holding that still stands: its server lives, or the worker or engine holding it does."""
    if server_alive(h):
        return True
    return h.pid not in (None, h.server_pid) and pid_alive(h.pid, h.pid_started)


def adopted_at_start(held: Iterable[Holding]) -> list[Holding]:
    """What a starting server takes over: holdings of no live server whose process still runs. A previous
    server's in-process holdings died with it (a model is not loaded after a restart); what a live worker
    process holds is still held, now by this server."""
    out = []
    for h in held:
        if h.server_pid not in (None, os.getpid()) and server_alive(h):
            continue  # another live server's
        if h.pid not in (os.getpid(), h.server_pid) and pid_alive(h.pid, h.pid_started):
            out.append(h.model_copy(update=this_server()))
    return out


def orphans(held: Iterable[Holding], mine: dict[str, Holding]) -> list[Holding]:
    """Workers or engines of a server that died while running: this server takes them over."""
    return [
        h.model_copy(update=this_server())
        for h in held
        if h.server_pid not in (None, os.getpid())
        and not server_alive(h)
        and h.pid != h.server_pid
        and pid_alive(h.pid, h.pid_started)
        and h.owner not in mine
    ]


def others(held: Iterable[Holding]) -> dict[str, Holding]:
    """Other live servers' live holdings, named with their server so owners never collide."""
    return {
        f"{h.owner} [gpubox {h.server_pid}]": h.model_copy(update={"owner": f"{h.owner} [gpubox {h.server_pid}]"})
        for h in held
        if h.server_pid not in (None, os.getpid()) and server_alive(h) and pid_alive(h.pid, h.pid_started)
    }


def this_server() -> dict[str, object]:
    """The fields that name this process as a holding's server (a new holding's, or an adopted one's)."""
    return {"server_pid": os.getpid(), "server_started": start_time(os.getpid())}


def server_alive(h: Holding) -> bool:
    """Whether the server that made `h` still runs. A ledger file written before start times were recorded has
    none: its pid alone is all there is to go on."""
    return pid_alive(h.server_pid, h.server_started)
