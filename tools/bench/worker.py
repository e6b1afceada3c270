"""The bench worker: a child process that runs one measurement and streams JSON lines on stdout.

    python -m gpubox.tools.bench.worker attention|device   < params.json

Kernels run out of the server's process so that a hung kernel, a CUDA error or an out-of-memory abort kills
only the worker; the server enforces a time limit and kills the worker's whole process group on overrun.
`run_worker` is the server side; it awaits the child without blocking the event loop.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from subprocess import PIPE
from typing import Any

import anyio

TASKS = ("attention", "device")


@dataclass
class WorkerOutcome:
    status: str  # complete | timed_out | failed
    events: list[dict[str, Any]] = field(default_factory=list)
    message: str | None = None
    elapsed_s: float = 0.0


async def run_worker(
    task: str,
    params: dict[str, Any],
    time_limit_s: float,
    on_event: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
) -> WorkerOutcome:
    """Run `task` in a fresh interpreter; kill its process group after `time_limit_s` (or when cancelled)."""
    if task not in TASKS:
        raise ValueError(task)
    started = time.monotonic()
    outcome = WorkerOutcome(status="complete")
    stderr = bytearray()
    proc = await anyio.open_process(
        [sys.executable, "-m", "gpubox.tools.bench.worker", task],
        stdin=PIPE,
        stdout=PIPE,
        stderr=PIPE,
        start_new_session=True,  # its own process group, so kernels' helper processes die with it
    )
    assert proc.stdin and proc.stdout and proc.stderr
    stdout, errout = proc.stdout, proc.stderr

    async def read_events() -> None:
        buf = b""
        async for chunk in stdout:
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    stderr.extend(line + b"\n")  # a library printed to stdout
                    continue
                outcome.events.append(event)
                if on_event is not None:
                    await on_event(event)

    async def read_stderr() -> None:
        async for chunk in errout:
            stderr.extend(chunk)
            del stderr[:-20_000]

    try:
        with anyio.move_on_after(time_limit_s) as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(read_events)
                tg.start_soon(read_stderr)
                await proc.stdin.send(json.dumps(params).encode())
                await proc.stdin.aclose()
                await proc.wait()
        if scope.cancelled_caught:
            outcome.status = "timed_out"
            outcome.message = (
                f"the worker ran past its time limit of {time_limit_s:g} s and was killed; results so far are "
                "kept. Raise time_limit_s, or measure fewer shapes/backends or fewer iterations."
            )
    finally:
        if proc.returncode is None:
            kill_group(proc.pid)
            with anyio.CancelScope(shield=True):
                await proc.wait()
    outcome.elapsed_s = time.monotonic() - started
    errors = [e["message"] for e in outcome.events if e.get("type") == "error"]
    if outcome.status == "complete" and (proc.returncode != 0 or errors):
        outcome.status = "failed"
        tail = stderr.decode(errors="replace").strip().splitlines()[-8:]
        why = errors[0] if errors else f"the worker exited with code {proc.returncode}"
        outcome.message = why + (": " + " / ".join(tail) if tail and not errors else "")
    return outcome


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def main() -> None:
    task = sys.argv[1] if len(sys.argv) > 1 else ""
    out = sys.stdout
    # libraries that print would corrupt the event stream: give them stderr
    sys.stdout = sys.stderr

    def emit(event: dict[str, Any]) -> None:
        out.write(json.dumps(event, default=str) + "\n")
        out.flush()

    params = json.loads(sys.stdin.read() or "{}")
    try:
        if task == "attention":
            from gpubox.tools.bench import attention

            attention.run(params, emit)
        elif task == "device":
            from gpubox.tools.bench import device

            device.run(params, emit)
        else:
            emit({"type": "error", "message": f"unknown task {task!r}; use one of {', '.join(TASKS)}"})
    except ImportError as exc:
        emit({"type": "error", "message": f"{exc}; install the bench extra: pip install 'gpubox[bench]'"})
    except Exception as exc:  # reported to the server, which stays up
        emit({"type": "error", "message": f"{type(exc).__name__}: {exc}"})


if __name__ == "__main__":
    main()
