"""The child side of `llama_process`: one llama.cpp model in a process of its own, driven over stdin/stdout.

    python -P -m gpubox.tools.inference.llama_worker

Requests are JSON lines on stdin ({"op": "load" | "count" | "control_texts" | "generate" | "cancel" | "close",
...}); replies are JSON lines on the process's original stdout: {"text": ...} while generating, then {"ok": ...} or
{"error": {"type": ..., "message": ...}}. C code that prints to stdout would corrupt that stream, so fd 1 is pointed
at stderr once the reply stream holds its own copy. Requests are read by a thread of their own, which gives each
generate its own cancel event, in line order, so {"op": "cancel", "id": n} stops generate n and no other. This
process imports nothing but the backend's code: on an H100 box a CUDA build of llama-cpp-python ran alone in a
fresh interpreter and crashed in the server's (bench/results/gpu_h100/).
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, TextIO

Request = tuple[dict[str, Any], threading.Event]


def _reply_stream() -> TextIO:
    out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # llama.cpp's own prints go to stderr, never into the replies
    sys.stdout = sys.stderr
    return out


def _read_requests(requests: queue.SimpleQueue[Request | None]) -> None:
    events: dict[int, threading.Event] = {}
    try:
        for line in sys.stdin.buffer:
            msg = json.loads(line)
            if msg.get("op") == "cancel":
                events.get(msg.get("id", -1), threading.Event()).set()
                continue
            ev = events[msg.get("id", -1)] = threading.Event()
            if msg.get("cancelled"):  # cancelled before the server sent it
                ev.set()
            requests.put((msg, ev))
            for old in [k for k in events if k < msg.get("id", -1) - 8]:  # finished long ago
                del events[old]
    finally:  # the server is gone (or wrote a broken line): stop what runs, then exit
        for ev in events.values():
            ev.set()
        requests.put(None)


def _handle(msg: dict[str, Any], backend: Any, cancel: threading.Event, send: Any) -> Any:
    from gpubox.tools.inference.backends import GenOutput, GenParams, LlamaBackend

    op = msg["op"]
    if op == "load":
        lora = Path(msg["lora"]) if msg["lora"] else None
        path = Path(msg["path"])
        return LlamaBackend(path, msg["n_ctx"], msg["n_gpu_layers"], msg["kv"], msg["threads"], lora, probe=False)
    if op == "count":
        return backend.count(msg["text"])
    if op == "control_texts":
        from gpubox.tools.inference.specials import specials_of

        return list(specials_of(backend))
    if op == "generate":
        if cancel.is_set():  # cancelled while it waited for the model: no prefill, no grammar check
            return dataclasses.asdict(GenOutput("", "cancelled", 0, 0, None, None, None, 0.0))
        params = GenParams(**msg["params"])
        out = backend.generate(msg["messages"], msg["prompt"], params, lambda t: send({"text": t}), cancel)
        return dataclasses.asdict(out)
    raise ValueError(f"unknown request {op!r}")


def _serve(send: Any) -> None:
    requests: queue.SimpleQueue[Request | None] = queue.SimpleQueue()
    threading.Thread(target=_read_requests, args=(requests,), daemon=True).start()
    backend: Any = None
    try:
        while (item := requests.get()) is not None and item[0].get("op") != "close":
            msg, cancel = item
            try:
                result = _handle(msg, backend, cancel, send)
            except Exception as exc:  # the server raises it again on its side, with the same type where it is ours
                send({"error": {"type": type(exc).__name__, "message": str(exc)}})
                continue
            if msg["op"] == "load":
                backend, result = result, {"pid": os.getpid()}
            send({"ok": result})
    finally:
        if backend is not None:
            backend.close()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the server's to handle; it ends us
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash here is reported, not dumped into the cwd
    except (ImportError, ValueError, OSError):
        pass
    replies = _reply_stream()
    lock = threading.Lock()

    def send(obj: dict[str, Any]) -> None:
        with lock:
            replies.write(json.dumps(obj) + "\n")

    # never the interpreter's teardown: llama.cpp's destructors after close have crashed CUDA builds
    try:
        _serve(send)
    except BaseException:  # said on stderr, which the server quotes in its error
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)


if __name__ == "__main__":
    main()
