"""A job's worker process as the server sees it: started detached, watched until it exits, then settled.

Separate from service.py, which decides whether and when a job runs (plan, launch, queue, status, cancel, resume):
this module holds what happens to a worker once it is started, in threads of its own: the reservation resized to
the probe's measurement, the memory released when the worker exits, and its measurements recorded once as
estimator calibrations. A restarted server picks up, here, the workers and finished jobs that outlived the last one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpubox.tools.box.capacity import pid_alive, start_time
from gpubox.tools.box.ledger import Ledger
from gpubox.tools.finetune import admission, launcher
from gpubox.tools.finetune.jobs import CANCEL_MARK, JobStore, append_metric, exited, gone, read_metrics
from gpubox.tools.finetune.schemas import ACTIVE, JobStatus

log = logging.getLogger("gpubox.finetune")
# A CUDA context and cuBLAS workspace take 0.3-0.5 GB (PyTorch's "CUDA semantics" notes); the caching allocator
# keeps blocks beyond what is allocated (its reserved memory, typically 10-30% more under training's churn)
CUDA_CONTEXT_GB, CUDA_CACHE_FACTOR = 0.5, 1.25


class Supervisor:
    def __init__(
        self,
        store: JobStore,
        ledger: Ledger,
        calibrate: Callable[[dict[str, Any]], str] | None,
        status: Callable[[str], JobStatus],
    ) -> None:
        self.store = store
        self.ledger = ledger
        # records a finished job's (and its probe's) measured memory and tokens/s as an estimator calibration
        self.calibrate = calibrate
        # the job as finetune_status reads it, without waiting for it to be settled (that wait is on this class)
        self.status = status
        self._settled: dict[str, threading.Event] = {}  # jobs whose worker this process watches

    def spawn(self, job_id: str) -> None:
        job_dir = self.store.job_dir(job_id)
        cfg = json.loads((job_dir / "config.json").read_text(encoding="utf-8"))
        nproc, device = int(cfg.get("num_processes", 1)), cfg.get("device", "cpu")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
        env.update(launcher.environment(nproc, device))
        (job_dir / CANCEL_MARK).unlink(missing_ok=True)
        with (job_dir / "log.txt").open("ab") as log:
            proc = subprocess.Popen(
                launcher.command(job_dir, nproc, device),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=job_dir,
                env=env,
                start_new_session=True,  # its own process group: survives the server, cancel signals the group
            )
        # the worker holds the memory from now on; updated before the row shows the pid, so a caller that sees
        # the pid also sees the worker holding the memory. A worker nobody could track or cancel must not run on.
        try:
            self.ledger.update(admission.owner(job_id), pid=proc.pid)
            self.store.set_process(job_id, proc.pid)
            # the watcher reaps the child when it exits (no zombie); it also keeps the Popen referenced, so a server
            # that stops while the job trains on does not warn about a child still running. One that cannot start
            # (no thread left) must not leave an unwatched worker holding memory nobody releases
            self._watch(job_id, proc.pid, start_time(proc.pid), lambda timeout: exited(proc, timeout))
        except BaseException:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise

    def wait_settled(self, job_id: str, timeout: float) -> None:
        """Wait until a job this process watched has its measurements recorded (no wait for any other job)."""
        watched = self._settled.get(job_id)
        if watched is not None:
            watched.wait(timeout)

    def _watch(self, job_id: str, pid: int, started: float | None, exited: Callable[[float], bool]) -> None:
        """Until the worker (`pid`, started at `started`) exits: resize its reservation to the probe's measurement
        once taken; then release its memory and record what it measured as calibrations (writes happen here,
        where the state changes, so finetune_status stays a pure read)."""
        settled = self._settled[job_id] = threading.Event()

        def run() -> None:
            resized, failing = False, ""
            try:
                while not exited(2.0):
                    try:
                        resized = resized or self._resize_from_probe(job_id)
                    except Exception as exc:  # a full disk, a file read mid-write: the worker runs on, still watched
                        if repr(exc) != failing:  # once per distinct error, not every 2 s
                            log.warning("resizing fine-tune job %s to its probe (tried again): %r", job_id, exc)
                        failing = repr(exc)
                # only this worker's holding: a finetune_resume may already have reserved the same owner name
                # for the next worker (the ledger prunes a dead worker's holding itself, should this not run)
                self.ledger.release(admission.owner(job_id), pid=pid, pid_started=started)
                self._settle(job_id)
            except Exception:  # a damaged job folder must not kill the watcher silently
                log.exception("watching fine-tune job %s", job_id)
            finally:
                settled.set()

        threading.Thread(target=run, name=f"finetune-watch-{job_id}", daemon=True).start()

    def _resize_from_probe(self, job_id: str) -> bool:
        probe = next((m["probe"] for m in read_metrics(self.store.job_dir(job_id)) if "probe" in m), None)
        if not probe or not probe.get("peak_memory_gb"):
            return False
        h = self.ledger.holding(admission.owner(job_id))
        if h is not None:
            peak = float(probe["peak_memory_gb"])
            # on a GPU the probe reads torch.cuda.max_memory_allocated: not the CUDA context, nor what the caching
            # allocator holds beyond its allocations; both are the job's too, so a reservation cut to the bare
            # figure would let other work into memory the job holds
            measured = {
                d: peak * CUDA_CACHE_FACTOR + CUDA_CONTEXT_GB if d.startswith("cuda") else peak for d in h.devices
            }
            if list(measured) == ["host"]:  # CPU ranks share the host: the probe measured one rank
                measured["host"] *= self.status(job_id).num_processes
            self.ledger.update(h.owner, needs=measured, source="probe measurement")
        return True

    def _settle(self, job_id: str) -> None:
        """Offer a finished job's probe and run measurements to the estimator, once each."""
        if self.calibrate is None:
            return
        row = self.store.reconcile(job_id)
        if row is None or row["state"] in (*ACTIVE, "queued"):
            return
        job_dir = self.store.job_dir(job_id)
        cfg = json.loads((job_dir / "config.json").read_text(encoding="utf-8"))
        st = self.status(job_id)
        if st.probe is not None and self.store.claim(job_id, "probe_calibrated"):
            _append_event(job_dir, "probe " + self.calibrate({**cfg, **st.probe.model_dump()}))
        if row["state"] == "completed" and self.store.claim(job_id, "calibrated"):
            result = json.loads(row["result"]) if row["result"] else {}
            # the estimator's calibrations are per device: the Trainer's token count sums all ranks
            per_device = st.tokens_per_s / st.num_processes if st.tokens_per_s else None
            info = {**cfg, **result, "tokens_per_s": per_device, "peak_memory_gb": st.peak_memory_gb}
            _append_event(job_dir, self.calibrate(info))

    def settle_finished(self) -> None:
        """At start: settle jobs that finished while no server watched them; watch workers that outlived one."""
        for row in self.store.all():
            try:
                if row["state"] in ACTIVE and pid_alive(row["pid"], row["pid_started"]):
                    pid, started = row["pid"], row["pid_started"]
                    self._watch(row["id"], pid, started, lambda t, p=pid, s0=started: gone(p, s0, t))
                elif not row["calibrated"] or not row["probe_calibrated"]:
                    self._settle(row["id"])
            except Exception:
                log.exception("settling fine-tune job %s", row["id"])


def _append_event(job_dir: Path, event: str) -> None:
    append_metric(job_dir, {"event": event, "t": time.time()})
