"""A fine-tune job's memory in the box ledger: its reservation, and the queue of jobs waiting for memory.

A job reserves its plan's estimated memory (per rank: each GPU rank on its own device, CPU ranks all on the host)
before its worker starts; the worker's pid then holds it, so it is released when the worker exits for any reason.
A job launched with queue=true waits in the ledger's queue (first in line first) until memory frees and no other
job runs, then starts; its waiter thread is restarted if the server restarts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from gpubox.errors import CapacityError, GpuboxError
from gpubox.tools.box.ledger import Ledger
from gpubox.tools.finetune.schemas import FinetunePlan

log = logging.getLogger("gpubox.finetune")
# Without an estimate (the estimator could not read the base) a LoRA run is sized from the base weights: weights,
# gradients of the adapter and activations stay well under 4x the weights for the adapters this worker trains.
NO_ESTIMATE_FACTOR = 4.0


def owner(job_id: str) -> str:
    return f"fine-tune job {job_id}"


def frees(job_id: str) -> str:
    return f"finetune_cancel job_id='{job_id}'"


def needs_of(plan: FinetunePlan) -> dict[str, float]:
    per_rank = plan.estimated_memory_gb
    if per_rank is None:
        per_rank = NO_ESTIMATE_FACTOR * _size(Path(plan.base.path)) / 1e9
    ranks = plan.request.num_processes
    if plan.device == "cuda":
        return {f"cuda:{i}": per_rank for i in range(ranks)}
    return {"host": per_rank * ranks}


def _size(path: Path) -> int:
    try:
        if path.is_file():
            return path.stat().st_size
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    except OSError:
        return 0


class JobQueue:
    """Jobs waiting for memory, each in a thread blocked in the ledger's queue."""

    def __init__(self, ledger: Ledger, start: Callable[[str], None], fail: Callable[[str, str], None]) -> None:
        self.ledger = ledger
        self.start = start  # spawns the job's worker once its memory is reserved
        self.fail = fail  # records why a queued job could not start
        self._cancel: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def enqueue(self, job_id: str, needs: dict[str, float], ready: Callable[[], bool]) -> None:
        cancel = threading.Event()
        with self._lock:
            self._cancel[job_id] = cancel
        self.ledger.enter_queue(owner(job_id))  # in line before launch returns its queue_position
        threading.Thread(
            target=self._wait, args=(job_id, needs, ready, cancel), name=f"finetune-queue-{job_id}", daemon=True
        ).start()

    def _wait(self, job_id: str, needs: dict[str, float], ready: Callable[[], bool], cancel: threading.Event) -> None:
        try:
            self.ledger.wait_reserve(owner(job_id), "finetune", needs, frees(job_id), cancel, ready=ready)
        except Exception as exc:  # a refusal, or a database/disk error: the job must not stay queued forever
            if not cancel.is_set():
                why = str(exc) if isinstance(exc, GpuboxError) else f"waiting for memory failed: {exc!r}"
                self.fail(job_id, why)
            return
        finally:
            with self._lock:
                self._cancel.pop(job_id, None)
        try:
            self.start(job_id)
        except Exception as exc:  # the reservation must not outlive a job that never started
            log.exception("starting queued job %s", job_id)
            self.ledger.release(owner(job_id))
            self.fail(job_id, f"could not start after waiting for memory: {exc}")

    def cancel(self, job_id: str) -> bool:
        with self._lock:
            ev = self._cancel.get(job_id)
        if ev is None:
            return False
        ev.set()
        self.ledger.leave_queue(owner(job_id))  # box_plan stops listing it now, not at the waiter's next wake
        return True

    def position(self, job_id: str) -> int | None:
        return self.ledger.position(owner(job_id))


def check_could_fit(ledger: Ledger, job: str, needs: dict[str, float]) -> None:
    """Refuse at once work that cannot fit even on an empty box (waiting would never end)."""
    adm = ledger.check(needs)
    state = ledger.state()
    budgets = {d.device: d.budget_gb for d in state.devices}
    for device, gb in needs.items():
        if gb > budgets.get(device, 0.0):
            raise CapacityError(
                f"{job} needs {gb:.2f} GB on {device}, above its whole {budgets.get(device, 0.0):.2f} GB budget; "
                "queueing cannot help: plan with a smaller micro-batch, max_length or model, or raise "
                f"memory_budget_gb. ({adm.reason})"
            )
