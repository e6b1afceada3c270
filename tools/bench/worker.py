"""The bench worker: a child process that runs one measurement and streams JSON lines on stdout.

    python -m gpubox.tools.bench.worker attention|device   < params.json

Kernels run out of the server's process so that a hung kernel, a CUDA error or an out-of-memory abort kills
only the worker; the server enforces a time limit and kills the worker's whole process group on overrun.
`run_worker` is the server side (on gpubox.child.run_child); it awaits the child without blocking the event loop.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from gpubox.child import python_module, run_child

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
    outcome = WorkerOutcome(status="complete")
    stray: list[str] = []  # stdout lines that are not events: a library printed to stdout

    async def on_line(line: str) -> None:
        if not line.strip():
            return
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            stray.append(line)
            del stray[:-20]
            return
        outcome.events.append(event)
        if on_event is not None:
            await on_event(event)

    # its own process group (run_child), so kernels' helper processes die with it
    cmd = python_module("gpubox.tools.bench.worker", task)
    run = await run_child(cmd, time_limit_s=time_limit_s, on_line=on_line, stdin=json.dumps(params).encode())
    outcome.elapsed_s = run.elapsed_s
    if run.timed_out:
        outcome.status = "timed_out"
        outcome.message = (
            f"the worker ran past its time limit of {time_limit_s:g} s and was killed; results so far are "
            "kept. Raise time_limit_s, or measure fewer shapes/backends or fewer iterations."
        )
        return outcome
    errors = [e["message"] for e in outcome.events if e.get("type") == "error"]
    if run.returncode != 0 or errors:
        outcome.status = "failed"
        tail = [*stray, *run.stderr.strip().splitlines()][-8:]
        why = errors[0] if errors else f"the worker exited with code {run.returncode}"
        outcome.message = why + (": " + " / ".join(tail) if tail and not errors else "")
    return outcome


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
    emit({"type": "memory", "peak_gb": peak_memory_gb()})


def peak_memory_gb() -> dict[str, float]:
    """This worker's peak per ledger device: its resident high-water mark on the host (VmHWM; not ru_maxrss, which
    Linux carries over from the server the worker was forked from); on a GPU what torch's caching allocator
    reserved at most plus the CUDA context (which torch does not count). The server remembers it for the next run
    of the same benchmark (box footprints). Whatever cannot be read is left out: the run's results stand."""
    out: dict[str, float] = {}
    hwm = host_peak_bytes()
    if hwm is not None:
        out["host"] = hwm / 1e9
    try:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            from gpubox.tools.bench.footprint import CUDA_CONTEXT_GB

            out["cuda:0"] = torch.cuda.max_memory_reserved() / 1e9 + CUDA_CONTEXT_GB
    except Exception:  # a CUDA error here must not fail a finished benchmark
        pass
    return out


def host_peak_bytes() -> int | None:
    """This process's resident high-water mark (VmHWM), None where /proc cannot tell (not Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            hwm = next((line for line in f if line.startswith("VmHWM:")), None)
        return int(hwm.split()[1]) * 1024 if hwm is not None else None  # kB
    except (OSError, ValueError, IndexError):
        return None


if __name__ == "__main__":
    main()
