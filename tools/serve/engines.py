"""Engines gpubox runs (vLLM) or attaches (any OpenAI-compatible server): start, watch, stop, find again.

An engine is a detached process group (it keeps serving if gpubox restarts); its record lives in
`<state_dir>/serve/engines.json` and its memory in the box ledger under the engine's pid, so the reservation ends
with the process. Start returns at once: building the HF copy of a GGUF model and the engine's own start-up
(weights, warm-up: minutes on a CPU) run in a watcher thread that marks the engine ready or failed.
"""

from __future__ import annotations

import contextlib
import json
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
        self.root = settings.state_dir / "serve"
        self.root.mkdir(parents=True, exist_ok=True)
        self.path = self.root / "engines.json"
        self._lock = threading.Lock()
        self._records: dict[str, EngineRecord] = self._load()
        for rec in list(self._records.values()):  # a restart finds running engines again, watches starting ones
            if rec.state == "starting" and pid_alive(rec.pid, rec.pid_started):
                threading.Thread(target=self._await_ready, args=(rec.id,), daemon=True).start()
            elif rec.state == "preparing" or (rec.state == "starting" and rec.pid is None):
                self.ledger.release(owner(rec.id))  # its launcher thread died with the previous server
                self._records[rec.id] = rec.model_copy(
                    update={
                        "state": "failed",
                        "error": "gpubox restarted before the engine was launched; start it again",
                    }
                )

    # --- records --------------------------------------------------------------------------------
    def _load(self) -> dict[str, EngineRecord]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            return {r["id"]: EngineRecord.model_validate(r) for r in raw}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("engine records %s unreadable (%s); starting with none", self.path, exc)
            return {}

    def _save(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # unique per writer
        tmp.write_text(json.dumps([r.model_dump(mode="json") for r in self._records.values()], indent=1), "utf-8")
        os.replace(tmp, self.path)

    def _set(self, engine_id: str, **changes: object) -> EngineRecord:
        with self._lock:
            rec = self._records[engine_id].model_copy(update=changes)
            self._records[engine_id] = rec
            self._save()
            return rec

    def record(self, engine_id: str) -> EngineRecord:
        with self._lock:
            rec = self._records.get(engine_id)
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
        with self._lock:
            recs = list(self._records.values())
        return [self._reconcile(r) for r in recs]

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
    ) -> EngineRecord:
        """Reserve the plan's memory, then prepare and launch in the background; returns the record at once."""
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
        self.ledger.reserve(owner(engine_id), "engine", plan.memory_gb, f"serve_stop engine_id='{engine_id}'")
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
        )
        with self._lock:
            self._records[engine_id] = rec
            self._save()
        threading.Thread(target=self._launch, args=(engine_id, prepare, key), daemon=True).start()
        return rec

    def _launch(self, engine_id: str, prepare: Callable[[], None] | None, key: str) -> None:
        rec = self.record(engine_id)
        try:
            if prepare is not None:
                prepare()
                rec = self._set(engine_id, state="starting")
            assert rec.plan is not None and rec.log_path is not None
            env = {**os.environ, **rec.plan.env, "VLLM_API_KEY": key, "HF_HUB_OFFLINE": "1"}
            env.update(TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", VLLM_NO_USAGE_STATS="1")
            with open(rec.log_path, "ab") as logf:
                proc = subprocess.Popen(
                    rec.plan.command,
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    cwd=self.root,
                    env=env,
                    start_new_session=True,  # its own group: survives gpubox, serve_stop signals all of it
                )
        except Exception as exc:  # preparing or spawning failed: say why, hold nothing
            log.exception("starting engine %s", engine_id)
            self.ledger.release(owner(engine_id))
            self._set(engine_id, state="failed", error=f"could not start: {type(exc).__name__}: {exc}")
            return
        self._set(engine_id, pid=proc.pid, pid_started=start_time(proc.pid))
        self.ledger.update(owner(engine_id), pid=proc.pid)  # the engine holds the memory from now on
        threading.Thread(target=proc.wait, name=f"engine-reaper-{engine_id}", daemon=True).start()
        self._await_ready(engine_id)

    def _await_ready(self, engine_id: str) -> None:
        deadline = time.monotonic() + self.settings.serve_start_timeout_s
        while time.monotonic() < deadline:
            rec = self.record(engine_id)
            if rec.state != "starting":
                return  # failed (process exited), or stopped meanwhile
            if client.healthy(rec.base_url, rec.api_key):
                self._set(engine_id, state="ready")
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
            self._records[rec.id] = rec
            self._save()
        return rec

    def stop(self, engine_id: str, grace_s: float = 30.0) -> EngineRecord:
        """Attached servers are only forgotten; a run engine gets SIGTERM, then SIGKILL for its whole group."""
        rec = self.record(engine_id)
        if rec.engine == "openai":
            with self._lock:
                self._records.pop(engine_id, None)
                self._save()
            return rec.model_copy(update={"state": "stopped"})
        if rec.pid is not None and pid_alive(rec.pid, rec.pid_started):
            _signal_group(rec.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and pid_alive(rec.pid, rec.pid_started):
                time.sleep(0.2)
            _signal_group(rec.pid, signal.SIGKILL)
        self.ledger.release(owner(engine_id))
        return self._set(engine_id, state="stopped")

    def status(self, engine_id: str, include_log: bool = False) -> EngineStatus:
        rec = self.record(engine_id)
        live = rec.state in ("ready", "attached")
        healthy = live and client.healthy(rec.base_url, rec.api_key)
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
