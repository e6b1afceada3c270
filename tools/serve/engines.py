"""Engines gpubox runs (vLLM) or attaches (any OpenAI-compatible server): start, watch, stop, find again.

An engine is a detached process group (it keeps serving if gpubox restarts); its record lives in
`<state_dir>/serve/engines/<id>.json` and its memory in the box ledger under the engine's pid, so the reservation ends
with the process. Start returns at once: building the HF copy of a GGUF model and the engine's own start-up
(weights, warm-up: minutes on a CPU) run in a watcher thread that marks the engine ready or failed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from gpubox.errors import BusyError, InvalidInputError, NotFoundError
from gpubox.settings import Settings
from gpubox.tools.box.capacity import pid_alive, start_time
from gpubox.tools.box.ledger import Ledger
from gpubox.tools.serve import client
from gpubox.tools.serve.schemas import EngineRecord, EngineState, EngineStatus, ServePlan

log = logging.getLogger("gpubox.serve")
LOG_TAIL_LINES = 30
LIVE: tuple[EngineState, ...] = ("preparing", "starting", "ready")


def owner(engine_id: str) -> str:
    return f"engine {engine_id}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


class EngineManager:
    def __init__(self, settings: Settings, ledger: Ledger) -> None:
        self.settings = settings
        self.ledger = ledger
        # one file per engine, readable by this user only (it holds the engine's API key); every gpubox server on
        # the box reads the folder, so an engine one server started is found, routed and stopped by the others
        self.root = settings.state_dir / "serve" / "engines"
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock = threading.Lock()
        for rec in self._load().values():  # a restart finds running engines again, watches starting ones
            if rec.state == "starting" and pid_alive(rec.pid, rec.pid_started):
                threading.Thread(target=self._await_ready, args=(rec.id,), daemon=True).start()
            elif rec.state == "preparing" and not pid_alive(rec.launcher_pid, None):
                self.ledger.release(owner(rec.id))  # its launcher died with the previous server
                why = "gpubox restarted before the engine was launched; start it again"
                self._set(rec.id, state="failed", error=why)

    # --- records --------------------------------------------------------------------------------
    def _file(self, engine_id: str) -> Path:
        return self.root / f"{engine_id}.json"

    def _read(self, path: Path) -> EngineRecord | None:
        try:
            return EngineRecord.model_validate_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            log.warning("engine record %s unreadable (%s); skipped", path, exc)
            return None

    def _load(self) -> dict[str, EngineRecord]:
        found = (self._read(p) for p in sorted(self.root.glob("*.json")))
        return {r.id: r for r in found if r is not None}

    def _write(self, rec: EngineRecord) -> None:
        tmp = self.root / f".{rec.id}.{os.getpid()}.{threading.get_ident()}.tmp"  # unique per writer
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(rec.model_dump_json(indent=1))
        os.replace(tmp, self._file(rec.id))

    def _set(self, engine_id: str, **changes: object) -> EngineRecord:
        with self._lock:
            return self._set_locked(engine_id, **changes)

    def _set_locked(self, engine_id: str, **changes: object) -> EngineRecord:
        current = self._read(self._file(engine_id))
        if current is None:
            raise NotFoundError(f"no engine '{engine_id}'; serve_list shows them")
        rec = current.model_copy(update=changes)
        self._write(rec)
        return rec

    def record(self, engine_id: str) -> EngineRecord:
        if not engine_id.isalnum():
            raise NotFoundError(f"no engine '{engine_id}'; serve_list shows them")
        rec = self._read(self._file(engine_id)) if self._file(engine_id).is_file() else None
        if rec is None:
            raise NotFoundError(f"no engine '{engine_id}'; serve_list shows them")
        return self._reconcile(rec)

    def _reconcile(self, rec: EngineRecord) -> EngineRecord:
        """A run engine whose process is gone is failed (with why), and its memory released."""
        spawned = rec.pid is not None  # before the spawn there is no process to check
        if (
            rec.engine == "vllm"
            and spawned
            and rec.state in ("starting", "ready")
            and not pid_alive(rec.pid, rec.pid_started)
        ):
            self.ledger.release(owner(rec.id))
            why = "the engine process exited" + (" during start-up" if rec.state == "starting" else "")
            return self._set(rec.id, state="failed", error=f"{why}; see log_tail")
        return rec

    def records(self) -> list[EngineRecord]:
        return [self._reconcile(r) for r in self._load().values()]

    def serving(self, model: str) -> EngineRecord | None:
        """The live engine serving `model` (its served name), if any: where infer_* requests for it go."""
        for rec in self.records():
            names = [rec.model, *rec.aliases]
            if model.lower() in (n.lower() for n in names) and rec.state in ("ready", "attached"):
                return rec
        return None

    # --- start ----------------------------------------------------------------------------------
    def start(
        self,
        name: str,
        hf_path: Path,
        prepare: Callable[[], None] | None,
        plan: ServePlan,
        args: list[str],
        python: str,
        port: int | None,
        aliases: list[str] | None = None,
        memory_key: str | None = None,
    ) -> EngineRecord:
        """Reserve the plan's memory, then prepare and launch in the background; returns the record at once.
        `memory_key` names the configuration whose measured peak the ledger remembers (plan.footprint_key)."""
        for rec in self.records():
            if rec.model.lower() == name.lower() and rec.state in (*LIVE, "attached"):
                raise BusyError(
                    f"'{name}' is already served by engine {rec.id} ({rec.state}); use it, or serve_stop it first"
                )
        if port is not None and port_taken(port):
            raise InvalidInputError(f"port {port} on 127.0.0.1 is taken; pass another port or leave it out")
        port = port or free_port()
        engine_id = uuid.uuid4().hex[:8]
        key = secrets.token_urlsafe(24)
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(hf_path)]
        cmd += ["--served-model-name", name, "--host", "127.0.0.1", "--port", str(port), *args]
        plan = plan.model_copy(update={"command": cmd})
        estimate = plan.estimate_gb or plan.memory_gb  # the ledger raises it to a remembered figure again
        self.ledger.reserve(owner(engine_id), "engine", estimate, f"serve_stop engine_id='{engine_id}'", key=memory_key)
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
        with self._lock:
            self._write(rec)
        threading.Thread(target=self._launch, args=(engine_id, prepare, key), daemon=True).start()
        return rec

    def _launch(self, engine_id: str, prepare: Callable[[], None] | None, key: str) -> None:
        try:
            if prepare is not None:
                prepare()
            # checked and spawned under the lock serve_stop marks 'stopped' under: a stop either comes first
            # (nothing is spawned) or finds the pid and kills it
            with self._lock:
                rec = self._set_locked(engine_id)
                if rec.state not in ("preparing", "starting"):
                    self.ledger.release(owner(engine_id))
                    return
                proc = self._spawn(rec, key)
                rec = self._set_locked(engine_id, state="starting", pid=proc.pid, pid_started=start_time(proc.pid))
        except Exception as exc:  # preparing or spawning failed: say why, hold nothing
            log.exception("starting engine %s", engine_id)
            self.ledger.release(owner(engine_id))
            self._set(engine_id, state="failed", error=f"could not start: {type(exc).__name__}: {exc}")
            return
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
                self._set(engine_id, state="ready")
                self.ledger.observe(owner(engine_id))  # weights, KV space and compiled graphs are all in by now
                return
            time.sleep(1.0)  # the engine offers no start-up event; its /health is the signal
        self.stop(engine_id)
        self._set(engine_id, state="failed", error=f"not ready after {self.settings.serve_start_timeout_s:.0f} s")

    # --- attach / stop --------------------------------------------------------------------------
    def attach(self, base_url: str, api_key: str | None, name: str | None) -> EngineRecord:
        served = client.models(base_url, api_key)
        if not served:
            raise NotFoundError(f"{base_url} serves no model")
        model = name or served[0]
        if model not in served:
            raise InvalidInputError(f"{base_url} does not serve '{model}'; it serves: {', '.join(served)}")
        if any(r.model.lower() == model.lower() and r.state in (*LIVE, "attached") for r in self.records()):
            raise BusyError(f"a model named '{model}' is already served here; serve_stop it first")
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
        with self._lock:
            self._write(rec)
        return rec

    def stop(self, engine_id: str, grace_s: float = 30.0) -> EngineRecord:
        """Attached servers are only forgotten; a run engine gets SIGTERM, then SIGKILL for its whole group."""
        rec = self.record(engine_id)
        if rec.engine == "openai":
            with self._lock:
                self._file(engine_id).unlink(missing_ok=True)
            return rec.model_copy(update={"state": "stopped"})
        with self._lock:  # the launcher spawns under this lock only while the state is preparing/starting
            rec = self._set_locked(engine_id, state="stopped")
        if rec.pid is not None and pid_alive(rec.pid, rec.pid_started):
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
        live = rec.state in ("ready", "attached")
        healthy = live and client.healthy(rec.base_url, rec.api_key)
        if healthy and rec.engine == "vllm":
            self.ledger.observe(owner(rec.id))  # its peak, for the next start of the same configuration
        held = self.ledger.holding(owner(rec.id))
        return EngineStatus(
            id=rec.id,
            engine=rec.engine,
            model=rec.model,
            state=rec.state,
            healthy=healthy,
            base_url=rec.base_url,
            api_key=rec.api_key,
            served_models=client.models(rec.base_url, rec.api_key) if healthy else [],
            uptime_s=round(time.time() - rec.started, 1),
            memory_gb=held.devices if held else {},
            metrics=client.metrics(rec.base_url, rec.api_key) if healthy else None,
            plan=rec.plan,
            error=rec.error,
            log_tail=log_tail(rec.log_path) if include_log or rec.state == "failed" else None,
            next_step=_next_step(rec),
        )

    def close(self) -> None:
        """Engines are detached on purpose: they keep serving when gpubox stops; a restart finds them."""


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _next_step(rec: EngineRecord) -> str:
    if rec.state in ("preparing", "starting"):
        return f"start-up takes minutes: serve_status engine_id='{rec.id}' wait_seconds=60"
    if rec.state in ("ready", "attached"):
        return f"infer_chat model='{rec.model}' goes to this engine; serve_stop engine_id='{rec.id}' ends it"
    if rec.state == "failed":
        return "read log_tail; fix the cause and serve_start again"
    return "serve_start to serve it again"


def default_python() -> str:
    return sys.executable
