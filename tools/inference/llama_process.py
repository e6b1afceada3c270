"""A llama.cpp model in a process of its own (`llama_worker`), with LlamaBackend's interface.

On an H100 box (bench/results/gpu_h100/) a CUDA build of llama-cpp-python loaded and generated in a fresh
interpreter, and in one that had loaded only gpubox's backend code, but ended the process with SIGSEGV inside
`llama_model_load_from_file` in the MCP server itself, and whenever torch had been imported first (also with no
layer offloaded and no GPU visible); which library the server shares with torch to cause it was not established.
So on GPU builds (setting `infer_llama_process`, "auto") each model runs in a child that imports only the backend:
a crash there ends that child, the server reports it, and the next request for the model loads it again.
The cause was found on an H200 (bench/results/gpu_h200_20261127/llama_libstdcxx.md: libstdc++ loaded privately by
numpy before that build's libraries) and is fixed for in-process loads too (llama_import); the child stays the
default on GPU builds for the isolation it gives a server that several clients share.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Literal

from gpubox import errors
from gpubox.child import import_path
from gpubox.errors import ConfigError, GpuboxError
from gpubox.extras import require
from gpubox.tools.inference.backends import GenOutput, GenParams

CLOSE_S = 10.0  # a close waits this long for the child to free the model before it is killed
CANCEL_POLL_S = 0.05
# A child that hangs (a GPU driver that never returns) would hold its model, and every request for it, forever.
# llama.cpp checks a cancel between tokens, so a child still busy this long after one is ended (a prompt's
# evaluation runs uninterrupted: tens of seconds for a long prompt on a slow box).
CANCEL_GRACE_S = 60.0
PREFILL_CHARS_PER_S = 400.0  # plus the prompt at ~100 tokens/s, the slowest evaluation worth waiting for
# A load reads the file once: 120 s for the libraries and the device, plus the file at 50 MB/s (a slow network
# disk), before it counts as hung. 40 GB: 15 minutes.
LOAD_BASE_S, LOAD_BYTES_PER_S = 120.0, 50e6
WORKER = ["-P", "-m", "gpubox.tools.inference.llama_worker"]  # -P: no working-directory module shadows an import
BUILTIN: dict[str, type[Exception]] = {
    c.__name__: c for c in (ValueError, TypeError, RuntimeError, MemoryError, OSError, FileNotFoundError)
}


class LlamaProcessBackend:
    name: Literal["llama.cpp"] = "llama.cpp"

    def __init__(
        self,
        path: Path,
        n_ctx: int,
        n_gpu_layers: int,
        kv_cache_type: str,
        n_threads: int | None,
        lora_path: Path | None = None,
    ) -> None:
        require("llama_cpp", "llama", "The llama.cpp backend")
        self.path, self.n_ctx = path, n_ctx
        self._closed = False
        self._next_id = 1  # each request's id; a cancel names the generate it stops
        self._lock = threading.Lock()  # one request at a time: replies carry no request id
        self._write = threading.Lock()  # a cancel is written while a request waits for its reply
        self._stderr: collections.deque[str] = collections.deque(maxlen=20)
        self._active: int | None = None  # the request in flight, which a watchdog may end the child for
        self._watch = threading.Lock()  # so it never ends the child for a request that has just been answered
        self._why = ""  # why the server ended the child, for the error that follows
        budget = LOAD_BASE_S + path.stat().st_size / LOAD_BYTES_PER_S  # before the spawn: a missing file leaves none
        self._proc = subprocess.Popen(
            [sys.executable, *WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": import_path()},
        )
        self._drainer = threading.Thread(target=self._drain, args=(self._proc.stderr,), daemon=True)
        self._drainer.start()
        load = {"op": "load", "path": str(path), "n_ctx": n_ctx, "n_gpu_layers": n_gpu_layers, "kv": kv_cache_type,
                "threads": n_threads, "lora": str(lora_path) if lora_path else None}  # fmt: skip
        try:
            self.pid: int = self._request(load, deadline=(budget, f"it did not finish loading within {budget:.0f} s"))[
                "pid"
            ]
        except BaseException:
            self.close()
            raise

    @property
    def alive(self) -> bool:
        """False once closed or once the child ended, also while idle (poll reaps it): the manager reloads it."""
        return not self._closed and self._proc.poll() is None

    def _drain(self, stream: IO[bytes] | None) -> None:
        """Keep the child's last stderr lines (llama.cpp's own messages) for the error if it dies."""
        if stream is None:
            return
        with stream:  # closed at the child's end, by this thread, which owns it
            for line in stream:
                if text := line.decode(errors="replace").strip():
                    self._stderr.append(text[:300])

    def _send(self, msg: dict[str, Any]) -> None:
        stdin = self._proc.stdin
        assert stdin is not None
        with self._write:
            stdin.write((json.dumps(msg) + "\n").encode())
            stdin.flush()

    def _request(
        self,
        msg: dict[str, Any],
        on_text: Callable[[str], None] | None = None,
        sent: Callable[[int], None] | None = None,
        deadline: tuple[float, str] | None = None,
    ) -> Any:
        """Send `msg` and read its replies. Any way out but its final reply (a broken reply, `on_text` raising)
        leaves unread replies behind, so the child is ended then: the next request would read them as its own.
        `deadline` (seconds, why): the child is ended if the final reply has not come by then."""
        with self._lock:
            reply: dict[str, Any] | None = None
            rid, self._next_id = self._next_id, self._next_id + 1
            self._active = rid
            timer = threading.Timer(deadline[0], self._overdue, (*deadline[1:], rid)) if deadline else None
            if timer is not None:
                timer.daemon = True
                timer.start()
            try:
                self._send({**msg, "id": rid})
                if sent is not None:
                    sent(rid)
                while line := self._proc.stdout.readline() if self._proc.stdout else b"":  # b"": the child is gone
                    got = _reply(line)
                    if "ok" in got or "error" in got:
                        with self._watch:  # answered: no watchdog may end the child for this request now
                            self._active = None
                        reply = got
                        break
                    if "text" in got and on_text is not None:
                        on_text(got["text"])
            except (BrokenPipeError, _BadReply) as exc:  # the child is gone, or wrote something that is no reply
                reply = None
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=1)  # a crash closes the pipes just before the process is reaped
                if self._proc.poll() is None:
                    self._kill()
                    raise ConfigError(f"the llama.cpp process for {self.path.name} answered wrongly: {exc}") from exc
            except BaseException:
                self._kill()
                raise
            finally:
                with self._watch:
                    self._active = None
                if timer is not None:
                    timer.cancel()
        if reply is None:
            raise self._ended(msg["op"])
        if "error" in reply:
            raise _rebuilt(reply["error"])
        return reply["ok"]

    def _overdue(self, why: str, request: int) -> None:
        """A watchdog's end of the child, only while `request` is still unanswered."""
        with self._watch:
            if self._active == request and self._proc.poll() is None:
                self._why = why
                self._proc.kill()

    def _kill(self) -> None:
        self._closed = True
        self._proc.kill()
        self._proc.wait()

    def _ended(self, op: str) -> GpuboxError:
        self._closed = True
        try:
            code = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            code = self._proc.wait()
        self._drainer.join(timeout=1)  # the child's last words, before they are quoted
        how = f"{signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else f"exit {code}"
        said = f"; its last message: {self._stderr[-1]}" if self._stderr else ""
        why, self._why = self._why, ""  # told once: requests queued behind it meet a plain end
        if why and op == "load":
            return GpuboxError(
                f"the llama.cpp process loading {self.path} was ended: {why}{said} (a hung GPU driver or a very "
                "slow disk); the server is unaffected. Check the GPU (gpu_status), or try n_gpu_layers=0"
            )
        if why:
            return GpuboxError(
                f"the llama.cpp process for {self.path.name} was ended during {op}: {why}{said}; the server "
                "is unaffected, and the next request for this model loads it again"
            )
        if op == "load":
            return ConfigError(
                f"loading {self.path} ended the llama.cpp process it runs in ({how}{said}); the server is "
                "unaffected. Try n_gpu_layers=0, or another build of llama-cpp-python for this GPU and driver"
            )
        return GpuboxError(
            f"the llama.cpp process serving {self.path.name} ended during {op} ({how}{said}); the server is "
            "unaffected, and the next request for this model loads it again"
        )

    def count(self, text: str) -> int:
        return int(self._request({"op": "count", "text": text}))

    def ask_control_texts(self) -> list[str]:
        """The model's control tokens as llama.cpp read them in its process (see specials.py)."""
        return [str(t) for t in self._request({"op": "control_texts"})]

    def generate(
        self,
        messages: list[dict[str, str]] | None,
        prompt: str | None,
        p: GenParams,
        on_text: Callable[[str], None],
        cancel: threading.Event,
    ) -> GenOutput:
        msg = {"op": "generate", "messages": messages, "prompt": prompt, "params": dataclasses.asdict(p),
               "cancelled": cancel.is_set()}  # fmt: skip
        done = threading.Event()
        size = len(prompt or "") + sum(len(str(m.get("content", ""))) for m in messages or [])
        grace = CANCEL_GRACE_S + size / PREFILL_CHARS_PER_S

        def watch(rid: int) -> None:  # once the request is sent: a cancel names it
            threading.Thread(target=self._forward_cancel, args=(cancel, done, rid, grace), daemon=True).start()

        try:
            return GenOutput(**self._request(msg, on_text, sent=watch))
        finally:
            done.set()

    def _forward_cancel(self, cancel: threading.Event, done: threading.Event, request: int, grace: float) -> None:
        while not done.is_set():
            if cancel.wait(CANCEL_POLL_S):
                if not done.is_set():
                    with contextlib.suppress(OSError, ValueError):  # the child is gone: the request says so
                        self._send({"op": "cancel", "id": request})
                    if not done.wait(grace):
                        self._overdue(f"it had not stopped {grace:g} s after a cancel", request)
                return

    def close(self) -> None:
        """Ask the child to free the model and exit; kill it if it does not within CLOSE_S."""
        self._closed = True
        if self._proc.poll() is None:
            try:
                self._send({"op": "close"})
                self._proc.wait(timeout=CLOSE_S)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):  # stdin's flush fails once the child is gone; it closes anyway
                    stream.close()


class _BadReply(Exception):
    pass


def _reply(line: bytes) -> dict[str, Any]:
    try:
        got = json.loads(line)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise _BadReply(f"{exc}: {line[:200]!r}") from None
    if not isinstance(got, dict):
        raise _BadReply(f"not a reply object: {line[:200]!r}")
    return got


def _rebuilt(err: dict[str, str]) -> Exception:
    """The child's exception as ours: gpubox's error types and the builtins llama-cpp-python raises keep their
    type (CapacityError for a full context, MemoryError, ValueError for a file it refuses); others a RuntimeError
    naming theirs."""
    name, message = err.get("type", ""), err.get("message", "")
    cls = getattr(errors, name, None) or BUILTIN.get(name)
    if isinstance(cls, type) and issubclass(cls, Exception):
        for base in cls.__mro__:  # one with a constructor of its own (UnknownNameError): its nearest plain base
            try:
                return base(message)
            except TypeError:
                continue
    return RuntimeError(f"{name}: {message}")
