"""The fine-tuning service: plans, job launch in detached worker processes, status, cancel, resume.

State lives on disk (`<state_dir>/finetune/`: jobs.sqlite, jobs/<id>/, plans/, adapters/, base/), so a restarted
server finds running jobs again; nothing here imports torch except the tokenizer used by plan(). Starting a worker
and watching it until its measurements are recorded is supervisor.py's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpubox.errors import BusyError, InvalidInputError, NotFoundError
from gpubox.filelock import exclusive
from gpubox.settings import Settings
from gpubox.tools.box.capacity import pid_alive, same_process
from gpubox.tools.box.ledger import Ledger
from gpubox.tools.estimate.service import Estimator
from gpubox.tools.finetune import admission, data, launcher, plan_warnings, planner, targets
from gpubox.tools.finetune.jobs import JobStore, created_of, log_tail, read_metrics, starter, write_json
from gpubox.tools.finetune.schemas import ACTIVE, FinetunePlan, FinetuneRequest, JobList, JobStatus, ResolvedBase
from gpubox.tools.finetune.snapshot import snapshot
from gpubox.tools.finetune.status import config_to_restart, next_step, read_status
from gpubox.tools.finetune.supervisor import CANCEL_MARK, Supervisor
from gpubox.tools.gpu.nvml import gpu_status
from gpubox.tools.inference.registry import check_model_folder

_DONE = ("completed", "failed", "cancelled")


class Finetuner:
    def __init__(
        self,
        settings: Settings,
        ledger: Ledger | None = None,
        calibrate: Callable[[dict[str, Any]], str] | None = None,
        loaded: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.settings = settings
        self.ledger = ledger if ledger is not None else Ledger(settings)
        self.root = settings.state_dir / "finetune"
        self.store = JobStore(self.root)
        self.plans_dir = self.root / "plans"
        self.adapters_dir = self.root / "adapters"
        self.base_dir = self.root / "base"
        for d in (self.plans_dir, self.adapters_dir, self.base_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.roots: list[Path] = [*settings.allowed_roots, *settings.model_dirs]
        # models this server holds loaded for inference (empty when the inference family was never built)
        self.loaded = loaded or dict
        # before the queue: a job re-queued below may start (and need the supervisor) at once
        self.supervisor = Supervisor(self.store, self.ledger, calibrate, lambda j: self.status(j, settled=False))
        self.queue = admission.JobQueue(self.ledger, self._start_queued, self._fail_queued)
        self._slot_lock = threading.Lock()  # checking "no job runs" and starting one happen as one step
        # a restart re-queues what was waiting (their waiter threads died with it), oldest first
        for row in sorted(self.store.all(), key=created_of):
            if row["state"] == "queued":
                try:
                    self._enqueue(row["id"])
                except Exception as exc:  # a plan deleted or no longer valid: that job fails, the others wait on
                    self._fail_queued(row["id"], f"could not be queued again after a restart: {exc}")
        threading.Thread(target=self.supervisor.settle_finished, name="finetune-settle", daemon=True).start()

    # --- plan -----------------------------------------------------------------------------------
    def registry(self) -> dict[str, Any]:
        from gpubox.tools.inference.registry import discover

        return discover([*self.settings.model_dirs, self.settings.state_dir / "models"])

    def resolve_base(self, model: str) -> ResolvedBase:
        """A model name or path as training (and serving) reads it: an HF folder, or the HF copy of a GGUF."""
        return planner.resolve_base(
            model, self.registry(), self.roots, self.base_dir, [self.settings.state_dir / "models"]
        )

    def plan(self, req: FinetuneRequest, estimator: Estimator | None = None) -> FinetunePlan:
        # cheapest refusals first: the request alone, the device, the base model; the dataset is read last
        planner.check_request(req)
        status = gpu_status()
        device = "cuda" if status.gpus else "cpu"
        warnings: list[str] = []
        if req.num_processes > 1:
            warnings += launcher.check_processes(req.num_processes, device)
        base = self.resolve_base(req.model)
        warnings += targets.check(req, base)
        summary, rows, tokens = planner.summarise(
            req, self.settings.allowed_roots, lambda: planner.load_tokenizer(base)
        )
        warnings += data.chat_warnings(rows, summary.format)
        if device == "cuda":
            warnings += plan_warnings.busy_gpu(status.gpus) + plan_warnings.throttled(status.gpus)
        elif req.method == "qlora":
            warnings.append("QLoRA on CPU runs (bitsandbytes 4-bit) but is slower than LoRA; it pays off on a GPU")
        warnings += plan_warnings.loaded_models(self.loaded(), device)
        if summary.truncated_rows:
            warnings.append(
                f"{summary.truncated_rows} of {summary.rows} rows are longer than max_length {req.max_length} tokens "
                f"and will be cut (p99 length {summary.token_length_percentiles['p99']})"
            )
        if req.use_liger_kernel and (device == "cpu" or not _installed("liger_kernel")):
            warnings.append("use_liger_kernel needs the liger-kernel package and a CUDA GPU; it was turned off")
            req = req.model_copy(update={"use_liger_kernel": False})
        seq = planner.planned_length(req, summary)
        est, on = planner.estimate_or_warning(estimator, req, base, summary.train_rows, tokens, device, warnings, seq)
        micro, accum, gc_on, steps, why = planner.layout(req, device, summary.train_rows, tokens, on, warnings)
        if seq < req.max_length and on is not None:
            margin = planner.TEMPLATE_MARGIN
            why += f"; rows planned at {seq} tokens (the longest row + {margin}), not max_length {req.max_length}"
        plan = FinetunePlan(
            plan_id=uuid.uuid4().hex[:12],
            request=req,
            base=base,
            device=device,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=accum,
            global_batch=micro * accum * req.num_processes,
            gradient_checkpointing=gc_on,
            total_steps=steps,
            batch_source=why,
            estimated_memory_gb=planner.memory_at(on, micro),
            estimated_tokens_per_s=on.tokens_per_s if on is not None else None,
            estimated_hours=on.wall_hours if on is not None else None,
            estimate=est.model_dump(mode="json") if est is not None else None,
            dataset=summary,
            planned_length=seq,
            dataset_stamp=data.stamp(Path(summary.path)),
            speed_options={
                "packing": req.packing,
                "use_liger_kernel": req.use_liger_kernel,
                "gradient_checkpointing": gc_on,
            },
            warnings=warnings,
        )
        adm = self.ledger.check(admission.needs_of(plan))
        if not adm.fits:
            plan.warnings.append(f"finetune_launch would be refused now: {adm.reason}; or launch with queue=true")
        (self.plans_dir / f"{plan.plan_id}.json").write_text(plan.model_dump_json(indent=2), encoding="utf-8")
        return plan

    def load_plan(self, plan_id: str) -> FinetunePlan:
        path = self.plans_dir / f"{plan_id}.json"
        if not plan_id.isalnum() or not path.is_file():
            raise NotFoundError(f"no plan '{plan_id}'; call finetune_plan first and pass its plan_id")
        try:
            return FinetunePlan.model_validate_json(path.read_text(encoding="utf-8"))
        except ValueError:  # a plan saved before a field's accepted values narrowed (weight_format), or damaged
            raise InvalidInputError(
                f"plan '{plan_id}' no longer validates (made by an older gpubox, or damaged); call finetune_plan again"
            ) from None

    # --- launch ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _slot(self) -> Iterator[None]:
        """The one training slot's check-and-start, serialised across threads and across the gpubox servers that
        share this state dir (a thread lock alone let two servers launching at once both see no job running and
        both start one). The thread lock first: a flock is per open file, so threads of one server must not
        both wait on it. Taken before the ledger's own lock, never inside it."""
        with self._slot_lock, exclusive(self.root / "slot.lock"):
            yield

    def launch(self, plan_id: str, inject_oom: int = 0, queue: bool = False) -> JobStatus:
        """Start the planned job now (its memory reserved in the box ledger), or with `queue` put it in line for
        memory and for the one training slot; either way the job's files are written before this returns."""
        plan = self.load_plan(plan_id)
        with self._slot():  # two launches at once: the second sees the first as running
            job_id = self._launch(plan, plan_id, inject_oom, queue)
        return self.status(job_id)  # outside the slot: it may wait up to 30 s for a job that ended at once

    def _launch(self, plan: FinetunePlan, plan_id: str, inject_oom: int, queue: bool) -> str:
        # a queued job counts too: a direct launch must not overtake it (nor start beside it once it is admitted)
        running = self.store.active() or [r for r in self.store.all() if r["state"] == "queued"]
        if running and not queue:
            r = running[0]
            raise BusyError(
                f"job {r['id']} ({r['adapter_name']}) is {r['state']}; one training job runs at a time. Wait for it "
                f"(finetune_status job_id='{r['id']}' wait_seconds=60), stop it with finetune_cancel, or launch "
                "with queue=true to start after it"
            )
        job_id = uuid.uuid4().hex[:10]
        owner, frees, needs = admission.owner(job_id), admission.frees(job_id), admission.needs_of(plan)
        admission.check_could_fit(self.ledger, owner, needs)
        # reserved before anything is written, so a refusal leaves nothing behind. A launch that may wait is
        # reserved or put in line in one step of the ledger: a check and then a reserve would refuse it when other
        # work reserved in between
        if running:
            waits = True
        elif queue:
            waits = self.ledger.reserve_or_queue(owner, "finetune", needs, frees) is None
        else:
            self.ledger.reserve(owner, "finetune", needs, frees)
            waits = False
        try:
            self._prepare(plan, plan_id, job_id, inject_oom, "queued" if waits else "starting")
            if waits:
                self._enqueue(job_id)
            else:
                self.supervisor.spawn(job_id)
        except BaseException as exc:
            self.ledger.release(owner)
            self.ledger.leave_queue(owner)  # a place taken above for a job that was never written
            self.queue.cancel(job_id)
            # a row written above must not stay 'starting' (or 'queued') with no worker: that blocks every launch
            self._failed_to_start(job_id, "queued" if waits else "starting", exc)
            raise
        return job_id

    def _failed_to_start(self, job_id: str, state: str, exc: BaseException) -> None:
        """Mark a job whose start raised as failed (a no-op when its row was never written or has moved on)."""
        why = f"its worker could not be started: {exc!r}"
        with contextlib.suppress(Exception):  # the database may be what failed: reconcile's timeout catches it then
            if state == "starting":  # only while no worker has a pid: one that has is reconciled by its pid
                self.store.fail_unstarted(job_id, why)
            else:
                self.store.transition(job_id, state, "failed", error=why, finished=time.time())

    def _enqueue(self, job_id: str) -> None:
        plan = self.load_plan(str(config_to_restart(job_id, self.store.job_dir(job_id)).get("plan_id")))

        def ready() -> bool:
            row = self.store.get(job_id)
            if row is None or row["state"] != "queued":  # cancelled from another server: out of line, no start
                self.queue.cancel(job_id)
                return False
            return not self.ledger.holders("finetune") and not self.store.active()

        self.queue.enqueue(job_id, admission.needs_of(plan), ready)
        row = self.store.reconcile(job_id)
        if row is None or row["state"] != "queued":  # a finetune_cancel came between the row and its waiter
            self.queue.cancel(job_id)

    def _start_queued(self, job_id: str) -> None:
        with self._slot():
            if any(r["id"] != job_id for r in self.store.active()):  # another job started after this one's check
                self.ledger.release(admission.owner(job_id))
                self._enqueue(job_id)  # in line again, for the one training slot
                return
            if not self.store.transition(job_id, "queued", "starting", **starter()):  # cancelled meanwhile
                self.ledger.release(admission.owner(job_id))
                return
            try:
                self.supervisor.spawn(job_id)
            except BaseException as exc:  # the queue's waiter releases the memory; the row must not stay starting
                self._failed_to_start(job_id, "starting", exc)
                raise

    def _fail_queued(self, job_id: str, why: str) -> None:
        # from 'queued' only: a stale waiter's failure must not overwrite a job that started (or was cancelled)
        self.store.transition(job_id, "queued", "failed", error=why, finished=time.time())

    def _prepare(self, plan: FinetunePlan, plan_id: str, job_id: str, inject_oom: int, state: str) -> None:
        req = plan.request
        name = req.output_name or f"ft-{job_id}"
        adapter_dir = self.adapters_dir / name
        unfinished = [r["id"] for r in self.store.all() if r["adapter_name"] == name and r["state"] not in _DONE]
        if unfinished:
            raise InvalidInputError(
                f"job {unfinished[0]} will write an adapter named '{name}'; pick another output_name"
            )
        if adapter_dir.exists():
            raise InvalidInputError(
                f"an adapter named '{name}' already exists at {adapter_dir}; pick another output_name"
            )
        # the dataset (and a user's HF base folder) is checked again: either may have changed since the plan;
        # the dataset is snapshotted, so the job trains on what was checked
        if plan.base.format == "hf":
            check_model_folder(Path(plan.base.hf_path), [*self.roots, self.settings.state_dir / "models"])
        job_dir = self.store.job_dir(job_id)
        snapshot(job_dir, plan, plan_id, inject_oom, adapter_dir, self.root, self.settings.allowed_roots)
        self.store.create(job_id, name, plan.base.name, req.method, state)

    # --- status ---------------------------------------------------------------------------------
    def row(self, job_id: str) -> dict[str, Any]:
        row = self.store.reconcile(job_id)
        if row is None:
            shown = job_id if len(job_id) <= 40 else job_id[:40] + "..."
            raise NotFoundError(f"no fine-tuning job '{shown}'; finetune_list shows the jobs")
        return row

    def status(self, job_id: str, include_log: bool = False, *, settled: bool = True) -> JobStatus:
        """The job as its files show it; reads only. A job this process watched and that just ended is reported
        once its measurements are recorded (`settled`), so the events list them."""
        row = self.row(job_id)
        if settled and row["state"] not in (*ACTIVE, "queued"):
            self.supervisor.wait_settled(job_id, 30)
        job_dir = self.store.job_dir(job_id)
        st = read_status(job_id, row, job_dir)
        if row["state"] == "queued":
            st.queue_position = self.queue.position(job_id)
        if include_log or row["state"] == "failed":
            st.log_tail = log_tail(job_dir)
        st.next_step = st.next_step or next_step(st)  # a damaged job's status carries its own
        return st

    def list(self, limit: int | None = None) -> JobList:
        ids = self.store.ids()
        return JobList(jobs=[self.status(jid, settled=False) for jid in ids[:limit]])

    def curve(self, job_id: str) -> list[tuple[int, float]]:
        self.row(job_id)
        metrics = read_metrics(self.store.job_dir(job_id))
        return [(m["step"], m["loss"]) for m in metrics if m.get("loss") is not None and "step" in m]

    # --- control --------------------------------------------------------------------------------
    def cancel(self, job_id: str, wait_s: float = 60.0) -> JobStatus:
        """SIGTERM the job's process group; the worker checkpoints at the end of the current step and exits."""
        row = self.row(job_id)
        if row["state"] == "queued" and self.store.transition(
            job_id, "queued", "cancelled", error="cancelled while waiting for memory", finished=time.time()
        ):
            self.queue.cancel(job_id)
            return self.status(job_id)
        row = self.row(job_id)  # it may have left the queue meanwhile: cancel it as a running job
        if row["state"] not in ACTIVE:
            raise InvalidInputError(f"job {job_id} is {row['state']}, not running; nothing to cancel")
        pid: int | None = row["pid"]
        deadline = time.monotonic() + 10.0
        while pid is None and row["state"] in ACTIVE and time.monotonic() < deadline:  # between starting and spawn
            time.sleep(0.1)
            row = self.row(job_id)
            pid = row["pid"]
        if pid is None and row["state"] not in ACTIVE:  # it ended (its start failed) while we waited
            return self.status(job_id)
        if pid is None:
            raise BusyError(f"job {job_id} is being started; cancel it again in a few seconds")
        # the mark tells every rank this SIGTERM is a cancel, not the launcher stopping them after a rank failed
        (self.store.job_dir(job_id) / CANCEL_MARK).touch()
        if same_process(pid, row["pid_started"]):  # a reused pid without a start time is not ours to signal
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and pid_alive(pid, row["pid_started"]):
            time.sleep(0.5)
        return self.status(job_id)

    def resume(self, job_id: str) -> JobStatus:
        row = self.row(job_id)
        if row["state"] not in ("cancelled", "failed"):
            raise InvalidInputError(f"job {job_id} is {row['state']}; only cancelled or failed jobs resume")
        with self._slot():
            self._resume(job_id, row["state"])
        return self.status(job_id)  # outside the slot, as launch's

    def _resume(self, job_id: str, was: str) -> None:
        running = self.store.active()
        if running:
            raise BusyError(f"job {running[0]['id']} is running; resume {job_id} after it finishes or is cancelled")
        # as a direct launch: a job queued first starts first (the queue admits it once nothing else runs)
        queued = [r for r in self.store.all() if r["state"] == "queued" and r["id"] != job_id]
        if queued:
            q = queued[-1]  # the oldest: all() is newest first
            raise BusyError(
                f"job {q['id']} ({q['adapter_name']}) is queued and starts first; one training job runs at a time. "
                f"Resume {job_id} after it finishes (finetune_status job_id='{q['id']}' wait_seconds=60), or take it "
                "out of line with finetune_cancel; a new launch with queue=true waits behind it"
            )
        job_dir = self.store.job_dir(job_id)
        cfg = {**config_to_restart(job_id, job_dir), "resume": True, "inject_oom": 0}
        needs = admission.needs_of(self.load_plan(str(cfg.get("plan_id"))))
        owner = admission.owner(job_id)
        self.ledger.reserve(owner, "finetune", needs, admission.frees(job_id))
        try:
            # from the state it was resumed in, so of two resumes (two servers) one wins; the dead worker's pid
            # goes in the same step: a reconcile that saw 'starting' with it would fail the job being started
            moved = self.store.transition(
                job_id, was, "starting", pid=None, pid_started=None, error=None, finished=None, **starter()
            )
        except BaseException:
            self.ledger.release(owner)
            raise
        if not moved:
            self.ledger.release(owner)
            raise InvalidInputError(f"job {job_id} is no longer {was} (resumed by another client?); see its status")
        try:
            write_json(job_dir / "config.json", cfg)  # whole: a status call may read it meanwhile
            self.supervisor.spawn(job_id)
        except BaseException as exc:
            self.ledger.release(owner)
            self._failed_to_start(job_id, "starting", exc)
            raise

    def close(self) -> None:
        """Nothing to stop: workers are detached on purpose and keep training when the server stops."""


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
