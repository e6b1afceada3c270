"""The fine-tuning service: plans, job launch in detached worker processes, status, cancel, resume.

State lives on disk (`<state_dir>/finetune/`: jobs.sqlite, jobs/<id>/, plans/, adapters/, base/), so a restarted
server finds running jobs again; nothing here imports torch except the tokenizer used by plan().
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
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpubox.errors import BusyError, InvalidInputError, NotFoundError
from gpubox.settings import Settings
from gpubox.tools.box.capacity import pid_alive
from gpubox.tools.box.ledger import Ledger
from gpubox.tools.estimate.service import Estimator
from gpubox.tools.finetune import admission, data, launcher, plan_warnings, planner, targets
from gpubox.tools.finetune.jobs import JobStore, exited, gone, log_tail, read_metrics
from gpubox.tools.finetune.schemas import ACTIVE, FinetunePlan, FinetuneRequest, JobList, JobStatus, ResolvedBase
from gpubox.tools.finetune.snapshot import snapshot
from gpubox.tools.finetune.status import next_step, read_status
from gpubox.tools.gpu.nvml import gpu_status
from gpubox.tools.inference.registry import check_model_folder

log = logging.getLogger("gpubox.finetune")
CANCEL_MARK = "cancel-requested"


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
        # records a finished job's (and its probe's) measured memory and tokens/s as an estimator calibration
        self.calibrate = calibrate
        # models this server holds loaded for inference (empty when the inference family was never built)
        self.loaded = loaded or dict
        self._settled: dict[str, threading.Event] = {}  # jobs whose worker this process watches
        self.queue = admission.JobQueue(self.ledger, self._start_queued, self._fail_queued)
        self._slot = threading.Lock()  # checking "no job runs" and starting one happen as one step
        # a restart re-queues what was waiting (their waiter threads died with it), oldest first
        for row in sorted(self.store.all(), key=lambda r: r["created"]):
            if row["state"] == "queued":
                try:
                    self._enqueue(row["id"])
                except Exception as exc:  # a plan deleted or no longer valid: that job fails, the others wait on
                    self._fail_queued(row["id"], f"could not be queued again after a restart: {exc}")
        threading.Thread(target=self._settle_finished, name="finetune-settle", daemon=True).start()

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
        summary, _rows, tokens = planner.summarise(
            req, self.settings.allowed_roots, lambda: planner.load_tokenizer(base)
        )
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
        micro, accum, gc_on, steps, why = planner.layout(req, device, summary.train_rows, tokens, on)
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
    def launch(self, plan_id: str, inject_oom: int = 0, queue: bool = False) -> JobStatus:
        """Start the planned job now (its memory reserved in the box ledger), or with `queue` put it in line for
        memory and for the one training slot; either way the job's files are written before this returns."""
        plan = self.load_plan(plan_id)
        with self._slot:  # two launches at once: the second sees the first as running
            return self._launch(plan, plan_id, inject_oom, queue)

    def _launch(self, plan: FinetunePlan, plan_id: str, inject_oom: int, queue: bool) -> JobStatus:
        running = self.store.active()
        if running and not queue:
            r = running[0]
            raise BusyError(
                f"job {r['id']} ({r['adapter_name']}) is {r['state']}; one training job runs at a time. Wait for it "
                f"(finetune_status job_id='{r['id']}' wait_seconds=60), stop it with finetune_cancel, or launch "
                "with queue=true to start when it ends"
            )
        job_id = uuid.uuid4().hex[:10]
        needs = admission.needs_of(plan)
        admission.check_could_fit(self.ledger, admission.owner(job_id), needs)
        waits = bool(running) or (queue and not self.ledger.check(needs).fits)
        if not waits:  # reserved before anything is written: a refusal leaves nothing behind
            self.ledger.reserve(admission.owner(job_id), "finetune", needs, admission.frees(job_id))
        try:
            self._prepare(plan, plan_id, job_id, inject_oom, "queued" if waits else "starting")
            if waits:
                self._enqueue(job_id)
            else:
                self._spawn(job_id)
        except BaseException:
            self.ledger.release(admission.owner(job_id))
            raise
        return self.status(job_id)

    def _enqueue(self, job_id: str) -> None:
        cfg = json.loads((self.store.job_dir(job_id) / "config.json").read_text(encoding="utf-8"))
        plan = self.load_plan(cfg["plan_id"])
        ready = lambda: not self.ledger.holders("finetune") and not self.store.active()  # noqa: E731
        self.queue.enqueue(job_id, admission.needs_of(plan), ready)

    def _start_queued(self, job_id: str) -> None:
        with self._slot:
            if not self.store.transition(job_id, "queued", "starting"):  # cancelled meanwhile
                self.ledger.release(admission.owner(job_id))
                return
            self._spawn(job_id)

    def _fail_queued(self, job_id: str, why: str) -> None:
        self.store.finish(job_id, "failed", error=why)

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

    def _spawn(self, job_id: str) -> None:
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
        except BaseException:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        # the watcher reaps the child when it exits (no zombie); it also keeps the Popen referenced, so a server
        # that stops while the job trains on does not warn about a child still running
        self._watch(job_id, lambda timeout: exited(proc, timeout))

    def _watch(self, job_id: str, exited: Callable[[float], bool]) -> None:
        """Until the worker exits: resize its reservation to the probe's measurement once taken; then release its
        memory and record what it measured as calibrations (writes happen here, where the state changes, so
        finetune_status stays a pure read)."""
        settled = self._settled[job_id] = threading.Event()

        def run() -> None:
            resized = False
            try:
                while not exited(2.0):
                    resized = resized or self._resize_from_probe(job_id)
                self.ledger.release(admission.owner(job_id))
                self._settle(job_id)
            except Exception:  # a damaged job folder must not kill the watcher silently
                log.exception("watching fine-tune job %s", job_id)
            finally:
                self.ledger.release(admission.owner(job_id))
                settled.set()

        threading.Thread(target=run, name=f"finetune-watch-{job_id}", daemon=True).start()

    def _resize_from_probe(self, job_id: str) -> bool:
        probe = next((m["probe"] for m in read_metrics(self.store.job_dir(job_id)) if "probe" in m), None)
        if not probe or not probe.get("peak_memory_gb"):
            return False
        h = self.ledger.holding(admission.owner(job_id))
        if h is not None:
            measured = {d: float(probe["peak_memory_gb"]) for d in h.devices}
            if list(measured) == ["host"]:  # CPU ranks share the host: the probe measured one rank
                measured["host"] *= self.status(job_id, settled=False).num_processes
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
        st = self.status(job_id, settled=False)
        if st.probe is not None and self.store.claim(job_id, "probe_calibrated"):
            _append_event(job_dir, "probe " + self.calibrate({**cfg, **st.probe.model_dump()}))
        if row["state"] == "completed" and self.store.claim(job_id, "calibrated"):
            result = json.loads(row["result"]) if row["result"] else {}
            # the estimator's calibrations are per device: the Trainer's token count sums all ranks
            per_device = st.tokens_per_s / st.num_processes if st.tokens_per_s else None
            info = {**cfg, **result, "tokens_per_s": per_device, "peak_memory_gb": st.peak_memory_gb}
            _append_event(job_dir, self.calibrate(info))

    def _settle_finished(self) -> None:
        """At start: settle jobs that finished while no server watched them; watch workers that outlived one."""
        for row in self.store.all():
            try:
                if row["state"] in ACTIVE and pid_alive(row["pid"], row["pid_started"]):
                    pid, started = row["pid"], row["pid_started"]
                    self._watch(row["id"], lambda t, p=pid, s0=started: gone(p, s0, t))
                elif not row["calibrated"] or not row["probe_calibrated"]:
                    self._settle(row["id"])
            except Exception:
                log.exception("settling fine-tune job %s", row["id"])

    # --- status ---------------------------------------------------------------------------------
    def row(self, job_id: str) -> dict[str, Any]:
        row = self.store.reconcile(job_id)
        if row is None:
            raise NotFoundError(f"no fine-tuning job '{job_id}'; finetune_list shows the jobs")
        return row

    def status(self, job_id: str, include_log: bool = False, *, settled: bool = True) -> JobStatus:
        """The job as its files show it; reads only. A job this process watched and that just ended is reported
        once its measurements are recorded (`settled`), so the events list them."""
        row = self.row(job_id)
        watched = self._settled.get(job_id)
        if settled and watched is not None and row["state"] not in (*ACTIVE, "queued"):
            watched.wait(30)
        job_dir = self.store.job_dir(job_id)
        st = read_status(job_id, row, job_dir)
        if row["state"] == "queued":
            st.queue_position = self.queue.position(job_id)
        if include_log or row["state"] == "failed":
            st.log_tail = log_tail(job_dir)
        st.next_step = next_step(st)
        return st

    def list(self, limit: int | None = None) -> JobList:
        ids = self.store.ids()
        return JobList(jobs=[self.status(jid, settled=False) for jid in ids[:limit]])

    def curve(self, job_id: str) -> list[tuple[int, float]]:
        self.row(job_id)
        return [(m["step"], m["loss"]) for m in read_metrics(self.store.job_dir(job_id)) if "loss" in m]

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
        with self._slot:
            return self._resume(job_id)

    def _resume(self, job_id: str) -> JobStatus:
        running = self.store.active()
        if running:
            raise BusyError(f"job {running[0]['id']} is running; resume {job_id} after it finishes or is cancelled")
        job_dir = self.store.job_dir(job_id)
        cfg = json.loads((job_dir / "config.json").read_text(encoding="utf-8"))
        cfg.update(resume=True, inject_oom=0)
        needs = admission.needs_of(self.load_plan(cfg["plan_id"]))
        self.ledger.reserve(admission.owner(job_id), "finetune", needs, admission.frees(job_id))
        try:
            (job_dir / "config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
            self.store.update(job_id, state="starting", error=None, finished=None)
            self._spawn(job_id)
        except BaseException:
            self.ledger.release(admission.owner(job_id))
            raise
        return self.status(job_id)

    def close(self) -> None:
        """Nothing to stop: workers are detached on purpose and keep training when the server stops."""


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _append_event(job_dir: Path, event: str) -> None:
    from gpubox.tools.finetune.jobs import append_metric

    append_metric(job_dir, {"event": event, "t": time.time()})
