"""Engines gpubox runs (vLLM) or attaches (any OpenAI-compatible server): start, watch, stop, find again.

An engine is a detached process group (it keeps serving if gpubox restarts); its record lives in
`<state_dir>/serve/engines/<id>.json` and its memory in the box ledger under the engine's pid, so the reservation ends
with the process. Start returns at once: building the HF copy of a GGUF model and the engine's own start-up
(weights, warm-up: minutes on a CPU) run in a watcher thread that marks the engine ready or failed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from gpubox.errors import BusyError, GpuboxError, InvalidInputError, NotFoundError
from gpubox.settings import Settings
from gpubox.tools.box.capacity import pid_alive, same_process, start_time
from gpubox.tools.box.ledger import Ledger
from gpubox.tools.serve import client
from gpubox.tools.serve.liveness import ANSWERING, SERVING, Liveness, ProbeFlights, answered, restart_hint
from gpubox.tools.serve.records import RecordStore, free_port, log_tail, port_taken
from gpubox.tools.serve.schemas import EngineMetrics, EngineRecord, EngineState, EngineStatus, ServePlan
from gpubox.urls import check_http_url

log = logging.getLogger("gpubox.serve")
# what a live engine holds its name and port in; an unresponsive one may still answer again
LIVE: tuple[EngineState, ...] = ("preparing", "starting", "ready", "unresponsive")
RUNNING: tuple[EngineState, ...] = ("starting", "ready", "unresponsive")  # a process to check
CLOSE_WAIT_S = 15.0  # a close waits this long in all for builds it cancelled to end
STOP_POLL_S = 2.0  # how often a build checks its record: a stop from another gpubox server is seen there
RECORD_KEEP_S = 7 * 86400.0  # an ended engine's record and log (serve_status reads them) are kept a week


@dataclass
class Preparing:
    """What a `prepare` callable is given: the cancel a stop (here or from another server, seen in the record)
    or the server's close sets, why it was set, and where to say which process it started (killed by the next
    server if this one dies first)."""

    cancel: threading.Event
    started: Callable[[int], None]
    why: str = "stopped"


def owner(engine_id: str) -> str:
    return f"engine {engine_id}"


def building(engine_id: str) -> str:
    """The ledger name of the host memory an engine's HF-copy build takes beyond the engine's own."""
    return f"engine {engine_id} (building its HF copy)"


class EngineManager:
    def __init__(self, settings: Settings, ledger: Ledger) -> None:
        self.settings = settings
        self.ledger = ledger
        # one file per engine, readable by this user only (it holds the engine's API key); every gpubox server on
        # the box reads the folder, so an engine one server started is found, routed and stopped by the others
        self.root = settings.state_dir / "serve" / "engines"
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.store = RecordStore(self.root)
        self._cancels: dict[str, Preparing] = {}  # engines still preparing here: a stop cancels the build
        self._launchers: dict[str, threading.Thread] = {}
        self._flights = ProbeFlights()  # one health probe in flight per engine, whatever number of requests wait
        for rec in self.store.load().values():  # a restart finds running engines again, watches starting ones
            if rec.state == "starting" and pid_alive(rec.pid, rec.pid_started):
                threading.Thread(target=self._await_ready, args=(rec.id,), daemon=True).start()
            elif rec.state in ("preparing", "starting") and rec.pid is None and not pid_alive(rec.launcher_pid, None):
                self.ledger.release(owner(rec.id))  # its launcher died with the previous server, before the spawn
                if rec.build_pid is not None and pid_alive(rec.build_pid, rec.build_started):
                    _signal_group(rec.build_pid, signal.SIGKILL)  # and left its HF-copy build running
                why = "gpubox restarted before the engine was launched; start it again"
                self.store.move(rec.id, ("preparing", "starting"), state="failed", error=why)
            elif rec.state in ("stopped", "failed") and time.time() - rec.started > RECORD_KEEP_S:
                self.store.remove(rec)  # every infer_* call reads the records: ended ones do not pile up

    def record(self, engine_id: str) -> EngineRecord:
        if not engine_id.isalnum():
            raise NotFoundError(f"no engine '{engine_id}'; serve_list shows them")
        rec = self.store.read(self.store.file(engine_id)) if self.store.file(engine_id).is_file() else None
        if rec is None:
            raise NotFoundError(f"no engine '{engine_id}'; serve_list shows them")
        return self._reconcile(rec)

    def _reconcile(self, rec: EngineRecord) -> EngineRecord:
        """A run engine whose process is gone is failed (with why), and its memory released."""
        spawned = rec.pid is not None  # before the spawn there is no process to check
        if rec.engine == "vllm" and spawned and rec.state in RUNNING and not pid_alive(rec.pid, rec.pid_started):
            self.ledger.release(owner(rec.id))
            why = "the engine process exited" + (" during start-up" if rec.state == "starting" else "")
            moved = self.store.move(rec.id, RUNNING, state="failed", error=f"{why}; see log_tail")
            return moved or self.store.read(self.store.file(rec.id)) or rec
        return rec

    def records(self) -> list[EngineRecord]:
        return [self._reconcile(r) for r in self.store.load().values()]

    def serving(self, model: str) -> EngineRecord | None:
        """The live engine serving `model` (its served name), if any: where infer_* requests for it go. An
        unresponsive one too: the request probes it first and fails after that probe unless it answers again."""
        for rec in self.records():
            names = [rec.model, *rec.aliases]
            if model.lower() in (n.lower() for n in names) and rec.state in SERVING:
                return rec
        return None

    def liveness(self, rec: EngineRecord) -> Liveness:
        """How a request to `rec` watches it (remote.generate)."""
        probe = functools.partial(client.healthy, rec.base_url, rec.api_key, self.settings.serve_probe_timeout_s)
        record = functools.partial(answered, self.store, rec)
        return Liveness(rec, self.settings.serve_probe_after_s, probe, record, self._flights)

    # --- start ----------------------------------------------------------------------------------
    def start(
        self,
        name: str,
        hf_path: Path,
        prepare: Callable[[Preparing], None] | None,
        plan: ServePlan,
        args: list[str],
        python: str,
        port: int | None,
        aliases: list[str] | None = None,
        memory_key: str | None = None,
        prepare_gb: float = 0.0,
    ) -> EngineRecord:
        """Reserve the plan's memory, then prepare and launch in the background; returns the record at once.
        `memory_key` names the configuration whose measured peak the ledger remembers (plan.footprint_key);
        `prepare_gb` is host memory `prepare` takes beyond the engine's own, held only while it runs."""
        with self.store.locked():  # checked and written at once: two starts of one name (or port) cannot both pass
            held = self._check_free(name)
            if port is not None and (port in held or port_taken(port)):
                raise InvalidInputError(f"port {port} on 127.0.0.1 is taken; pass another port or leave it out")
            port = port or free_port(held)
            engine_id = uuid.uuid4().hex[:8]
            key = secrets.token_urlsafe(24)
            cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(hf_path)]
            cmd += ["--served-model-name", name, "--host", "127.0.0.1", "--port", str(port), *args]
            plan = plan.model_copy(update={"command": cmd})
            estimate = plan.estimate_gb or plan.memory_gb  # the ledger raises it to a remembered figure again
            frees = f"serve_stop engine_id='{engine_id}'"
            self.ledger.reserve(owner(engine_id), "engine", estimate, frees, key=memory_key)
            rec = EngineRecord(
                id=engine_id,
                engine="vllm",
                model=name,
                aliases=aliases or [],
                source=str(hf_path),
                base_url=f"http://127.0.0.1:{port}/v1",
                api_key=key,
                port=port,
                started=time.time(),
                state="preparing" if prepare else "starting",
                plan=plan,
                log_path=str(self.root / f"{engine_id}.log"),
                launcher_pid=os.getpid(),
            )
            # the HF copy's build, beyond the engine's own host reservation (the engine loads only after it)
            self._write_new(rec, prepare_gb - estimate.get("host", 0.0) if prepare is not None else 0.0)
        prep = Preparing(threading.Event(), lambda pid: self._building(engine_id, pid))
        self._cancels[engine_id] = prep
        launcher = threading.Thread(target=self._launch, args=(engine_id, prepare, key, prep), daemon=True)
        self._launchers[engine_id] = launcher
        launcher.start()
        return rec

    def _write_new(self, rec: EngineRecord, build_gb: float) -> None:
        """Reserve what the HF-copy build takes beyond the engine (released once it is built) and write the
        record; on any failure nothing stays reserved (caller holds the store's lock)."""
        try:
            if build_gb > 0:
                self.ledger.reserve(building(rec.id), "engine", {"host": build_gb}, f"serve_stop engine_id='{rec.id}'")
            self.store.write(rec)
        except BaseException:
            self.ledger.release(building(rec.id))
            self.ledger.release(owner(rec.id))
            raise

    def _check_free(self, name: str) -> set[int]:
        """Refuse a name a live engine serves; the ports live engines hold (caller holds the lock)."""
        held: set[int] = set()
        for rec in self.records():
            if rec.state not in (*LIVE, "attached"):
                continue
            if rec.model.lower() == name.lower():
                raise BusyError(
                    f"'{name}' is already served by engine {rec.id} ({rec.state}); use it, or serve_stop it first"
                )
            if rec.port is not None:
                held.add(rec.port)
        return held

    def _building(self, engine_id: str, pid: int) -> None:
        self.store.set(engine_id, build_pid=pid, build_started=start_time(pid))

    def _watch_stop(self, engine_id: str, prep: Preparing, done: threading.Event) -> None:
        """While preparing: a stop written into the record by another gpubox server cancels the build here."""
        while not done.wait(STOP_POLL_S):
            rec = self.store.read(self.store.file(engine_id))
            if rec is None or rec.state == "stopped":
                prep.cancel.set()
                return

    def _launch(self, engine_id: str, prepare: Callable[[Preparing], None] | None, key: str, prep: Preparing) -> None:
        try:
            if prepare is not None:
                done = threading.Event()
                threading.Thread(target=self._watch_stop, args=(engine_id, prep, done), daemon=True).start()
                try:
                    prepare(prep)
                finally:
                    done.set()
                    self.ledger.release(building(engine_id))
            # checked and spawned under the lock serve_stop marks 'stopped' under: a stop either comes first
            # (nothing is spawned) or finds the pid and kills it
            with self.store.locked():
                rec = self.store.set_locked(engine_id)
                if rec.state not in ("preparing", "starting"):
                    self.ledger.release(owner(engine_id))
                    return
                proc = self._spawn(rec, key)
                rec = self.store.set_locked(engine_id, state="starting", pid=proc.pid, pid_started=start_time(proc.pid))
        except Exception as exc:  # preparing or spawning failed: say why, hold nothing
            self.ledger.release(owner(engine_id))
            why = f"could not start: {type(exc).__name__}: {exc}"
            if self.store.move(engine_id, ("preparing", "starting"), state="failed", error=why) is not None:
                log.exception("starting engine %s", engine_id)  # not after a stop, which cancels the build
            return
        finally:
            self._cancels.pop(engine_id, None)
            self._launchers.pop(engine_id, None)
        self.ledger.update(owner(engine_id), pid=proc.pid)  # the engine holds the memory from now on
        threading.Thread(target=proc.wait, name=f"engine-reaper-{engine_id}", daemon=True).start()
        self._await_ready(engine_id)

    def _spawn(self, rec: EngineRecord, key: str) -> subprocess.Popen[bytes]:
        assert rec.plan is not None and rec.log_path is not None
        env = {**os.environ, **rec.plan.env, "VLLM_API_KEY": key, "HF_HUB_OFFLINE": "1"}
        env.update(TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", VLLM_NO_USAGE_STATS="1")
        # vLLM's compile cache and other files in gpubox's state dir, not under the user's home
        env.setdefault("VLLM_CACHE_ROOT", str(self.settings.state_dir / "engines" / "cache"))
        with open(rec.log_path, "ab") as logf:
            return subprocess.Popen(
                rec.plan.command,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                env=env,
                start_new_session=True,  # its own group: survives gpubox, serve_stop signals all of it
            )

    def _await_ready(self, engine_id: str) -> None:
        deadline = time.monotonic() + self.settings.serve_start_timeout_s
        while time.monotonic() < deadline:
            rec = self.record(engine_id)
            if rec.state != "starting":
                return  # failed (process exited), or stopped meanwhile
            if client.healthy(rec.base_url, rec.api_key):
                if self.store.move(engine_id, ("starting",), state="ready") is not None:
                    self.ledger.observe(owner(engine_id))  # weights, KV space and compiled graphs are all in by now
                return
            time.sleep(1.0)  # the engine offers no start-up event; its /health is the signal
        self.stop(engine_id)
        self.store.set(engine_id, state="failed", error=f"not ready after {self.settings.serve_start_timeout_s:.0f} s")

    # --- attach / stop --------------------------------------------------------------------------
    def attach(self, base_url: str, api_key: str | None, name: str | None) -> EngineRecord:
        check_http_url(base_url, "base_url", "e.g. http://127.0.0.1:8000/v1")
        if api_key and (urlsplit(base_url).username or urlsplit(base_url).password):
            # httpx turns a URL's user:password into Basic auth, which replaced the Bearer key on every request
            raise InvalidInputError(
                "give either api_key (sent as 'Bearer <key>') or user:password in base_url (sent as Basic auth), "
                "not both: a request carries one Authorization header"
            )
        served = [m for m in client.models(base_url, api_key, attaching=True) if m.strip()]  # no blank name
        if not served:
            raise NotFoundError(f"{base_url} serves no model")
        model = name or served[0]
        if model not in served:
            raise InvalidInputError(f"{base_url} does not serve '{model}'; it serves: {', '.join(served)}")
        rec = EngineRecord(
            id=uuid.uuid4().hex[:8],
            engine="openai",
            model=model,
            source=base_url,
            base_url=base_url.rstrip("/"),
            api_key=api_key,
            started=time.time(),
            state="attached",
        )
        with self.store.locked():
            self._check_free(model)
            self.store.write(rec)
        return rec

    def stop(self, engine_id: str, grace_s: float = 30.0) -> EngineRecord:
        """Attached servers are only forgotten; a run engine gets SIGTERM, then SIGKILL for its whole group."""
        rec = self.record(engine_id)
        if rec.engine == "openai":
            with self.store.locked():
                self.store.file(engine_id).unlink(missing_ok=True)
            return rec.model_copy(update={"state": "stopped"})
        with self.store.locked():  # the launcher spawns under this lock only while the state is preparing/starting
            rec = self.store.set_locked(engine_id, state="stopped")
        if (prep := self._cancels.get(engine_id)) is not None:
            prep.cancel.set()  # a build of the HF copy in progress here ends now
        if rec.pid is not None and same_process(rec.pid, rec.pid_started):
            _signal_group(rec.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and pid_alive(rec.pid, rec.pid_started):
                time.sleep(0.2)
            _signal_group(rec.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10.0  # SIGKILL is not instant: stop returns once the process is gone
            while time.monotonic() < deadline and pid_alive(rec.pid, rec.pid_started):
                time.sleep(0.1)
        self.ledger.release(owner(engine_id))
        return rec

    def status(self, engine_id: str, include_log: bool = False) -> EngineStatus:
        rec = self.record(engine_id)
        live = rec.state in SERVING
        healthy = live and client.healthy(rec.base_url, rec.api_key, self.settings.serve_probe_timeout_s)
        if live:
            rec = answered(self.store, rec, healthy)  # unresponsive until it answers, ready or attached again
        if healthy and rec.engine == "vllm":
            self.ledger.observe(owner(rec.id))  # its peak, for the next start of the same configuration
        held = self.ledger.holding(owner(rec.id))
        served: list[str] = []
        metrics: EngineMetrics | None = None
        error = rec.error
        try:  # a server whose /health answers may still refuse its model list (a key, a proxy): reported, not raised
            served = client.models(rec.base_url, rec.api_key) if healthy else []
            metrics = client.metrics(rec.base_url, rec.api_key) if healthy else None
        except GpuboxError as exc:
            healthy, error = False, f"its health probe answers but its model list does not: {exc}"
        return EngineStatus(
            id=rec.id,
            engine=rec.engine,
            model=rec.model,
            state=rec.state,
            healthy=healthy,
            base_url=rec.base_url,
            api_key=rec.api_key,
            served_models=served,
            uptime_s=round(time.time() - rec.started, 1),
            memory_gb=held.devices if held else {},
            metrics=metrics,
            plan=rec.plan,
            error=error,
            log_tail=log_tail(rec.log_path) if include_log or rec.state == "failed" else None,
            next_step=_next_step(rec),
        )

    def close(self) -> None:
        """Engines are detached on purpose: they keep serving when gpubox stops; a restart finds them. A build
        of an HF copy still running here is ended (its thread dies with this process; a restart fails its
        record)."""
        for prep in list(self._cancels.values()):
            prep.why = "gpubox closed while it was being built; serve_start again"
            prep.cancel.set()
        deadline = time.monotonic() + CLOSE_WAIT_S  # one wait for all: the builds' groups end before this process
        for launcher in list(self._launchers.values()):
            launcher.join(timeout=max(0.0, deadline - time.monotonic()))


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _next_step(rec: EngineRecord) -> str:
    if rec.state in ("preparing", "starting"):
        return f"start-up takes minutes: serve_status engine_id='{rec.id}' wait_seconds=60"
    if rec.state in ANSWERING:
        return f"infer_chat model='{rec.model}' goes to this engine; serve_stop engine_id='{rec.id}' ends it"
    if rec.state == "unresponsive":
        return f"it stopped answering its health probe: {restart_hint(rec)}"
    if rec.state == "failed":
        return "read log_tail; fix the cause and serve_start again"
    return "serve_start to serve it again"


def default_python() -> str:
    return sys.executable
