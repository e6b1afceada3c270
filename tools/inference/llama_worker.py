"""The child side of `llama_process`: one llama.cpp model in a process of its own, driven over stdin/stdout.

    python -P -m gpubox.tools.inference.llama_worker

Requests are JSON lines on stdin ({"op": "load" | "count" | "generate" | "cancel" | "close", ...}); replies are
JSON lines on the process's original stdout: {"text": ...} while generating, then {"ok": ...} or
{"error": {"type": ..., "message": ...}}. C code that prints to stdout would corrupt that stream, so fd 1 is pointed
at stderr once the reply stream holds its own copy. "cancel" is read by a thread of its own, so it stops a
generation in flight. This process imports nothing but the backend's code: on an H100 box a CUDA build of
llama-cpp-python ran alone in a fresh interpreter and crashed in the server's (bench/results/gpu_h100/).
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import sys
import threading
from pathlib import Path
from typing import Any, TextIO


def _reply_stream() -> TextIO:
    out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # llama.cpp's own prints go to stderr, never into the replies
    sys.stdout = sys.stderr
    return out


def _read_requests(requests: queue.SimpleQueue[dict[str, Any] | None], cancel: threading.Event) -> None:
    for line in sys.stdin.buffer:
        msg = json.loads(line)
        if msg.get("op") == "cancel":
            cancel.set()
        else:
            requests.put(msg)
    requests.put(None)  # the server closed our stdin: it is gone


def _handle(msg: dict[str, Any], backend: Any, cancel: threading.Event, send: Any) -> Any:
    from gpubox.tools.inference.backends import GenParams, LlamaBackend

    op = msg["op"]
    if op == "load":
        lora = Path(msg["lora"]) if msg["lora"] else None
        path = Path(msg["path"])
        return LlamaBackend(path, msg["n_ctx"], msg["n_gpu_layers"], msg["kv"], msg["threads"], lora, probe=False)
    if op == "count":
        return backend.count(msg["text"])
    if op == "generate":
        cancel.clear()  # a cancel read before this request belonged to the one before it
        out = backend.generate(
            msg["messages"], msg["prompt"], GenParams(**msg["params"]), lambda t: send({"text": t}), cancel
        )
        return dataclasses.asdict(out)
    raise ValueError(f"unknown request {op!r}")


def main() -> None:
    replies = _reply_stream()
    lock = threading.Lock()

    def send(obj: dict[str, Any]) -> None:
        with lock:
            replies.write(json.dumps(obj) + "\n")

    requests: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
    cancel = threading.Event()
    threading.Thread(target=_read_requests, args=(requests, cancel), daemon=True).start()
    backend: Any = None
    while (msg := requests.get()) is not None and msg.get("op") != "close":
        try:
            result = _handle(msg, backend, cancel, send)
        except Exception as exc:  # the server raises it again on its side, with the same type where it is ours
            send({"error": {"type": type(exc).__name__, "message": str(exc)}})
            continue
        if msg["op"] == "load":
            backend, result = result, {"pid": os.getpid()}
        send({"ok": result})
    if backend is not None:
        backend.close()
    os._exit(0)  # no interpreter teardown: llama.cpp's destructors after close have crashed CUDA builds


if __name__ == "__main__":
    main()
