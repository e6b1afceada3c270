"""The bench service: refuses while the GPU is held, runs the worker, stores runs, lists and replots them.

What a finished run's events become (ranking, plots, the device calibration) is in results.py.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import anyio

from gpubox.errors import BusyError, GpuboxError, InvalidInputError, MissingExtraError, NotFoundError
from gpubox.extras import is_available
from gpubox.progress import Progress
from gpubox.settings import Settings
from gpubox.tools.bench import footprint, plots
from gpubox.tools.bench.results import attention_result, device_result
from gpubox.tools.bench.runs import RunStore, uri
from gpubox.tools.bench.schemas import (
    BACKENDS,
    AttentionBench,
    DeviceBench,
    PlotRef,
    PlotResult,
    RunList,
    RunSummary,
)
from gpubox.tools.bench.worker import WorkerOutcome, run_worker
from gpubox.tools.box.ledger import Ledger
from gpubox.tools.estimate.service import Estimator

log = logging.getLogger("gpubox.bench")
# what reading a stored record of the wrong shape raises (a key missing, a list for a dict, text for a number)
DAMAGE = (KeyError, IndexError, TypeError, ValueError, AttributeError)


def n_shapes(params: dict[str, Any]) -> int:
    """(seq_len, head_dim) shapes an attention run times: one each when the worker picks the defaults."""
    return len(params.get("seq_lens") or [1]) * len(params.get("head_dims") or [1])


def active_finetune_jobs(settings: Settings) -> list[str]:
    """Fine-tune jobs holding the GPU: the finetune family's job store in <state_dir>/finetune, when present."""
    root = settings.state_dir / "finetune"
    if not (root / "jobs.sqlite").is_file():
        return []
    try:
        from gpubox.tools.finetune.jobs import JobStore
    except ImportError:
        return []
    return [
        f"fine-tune job '{r['id']}' ({r['method']} on {r['base_model']}, {r['state']})" for r in JobStore(root).active()
    ]


class BenchService:
    def __init__(
        self,
        settings: Settings,
        ledger: Ledger | None = None,
        estimator: Callable[[], Estimator] | None = None,
        busy_models: Callable[[], list[str]] | None = None,
    ) -> None:
        self.settings = settings
        self.ledger = ledger if ledger is not None else Ledger(settings)
        self.estimator = estimator or (lambda: Estimator(settings))
        self.busy_models = busy_models or list  # models generating right now (they would disturb the timing)
        self.runs = RunStore(settings.state_dir / "bench" / "runs")
        self._lock = threading.Lock()
        self.active: str | None = None

    # --- admission ------------------------------------------------------------------------------
    def contention(self) -> list[str]:
        """Work that would disturb a measurement: fine-tune jobs and models generating right now."""
        return active_finetune_jobs(self.settings) + [f"inference on '{m}'" for m in self.busy_models()]

    async def _admit(
        self, what: str, needs: dict[str, float], queue: bool, progress: Progress | None, key: str | None = None
    ) -> str:
        """Reserve for this call, under a name of its own (two clients' runs of one benchmark must never release
        each other's memory); returns that name."""
        owner = f"benchmark {what} {uuid.uuid4().hex[:6]}"
        if not queue:
            holders = await anyio.to_thread.run_sync(self.contention)
            if holders:
                raise BusyError(
                    f"the GPU is in use by {', '.join(holders)}; a benchmark now would measure contention. "
                    "Wait for it to finish (finetune_status / infer_models), cancel it, or pass queue=true."
                )
            if not self._lock.acquire(blocking=False):
                raise BusyError(f"another benchmark ({self.active}) is running; call again, or pass queue=true")
            self.active = what  # before the reservation's await: a caller refused meanwhile reads whose run it is
            try:
                await anyio.to_thread.run_sync(
                    lambda: self.ledger.reserve(owner, "benchmark", needs, "waiting for the benchmark to end", key=key)
                )
            except BaseException:
                self.active = None
                self._lock.release()
                raise
        else:
            await self._queue(owner, needs, progress, key)
            self.active = what  # no await since _queue took the lock
        return owner

    async def _queue(self, owner: str, needs: dict[str, float], progress: Progress | None, key: str | None) -> None:
        """Wait in the ledger's queue until memory frees, no benchmark runs and nothing disturbs the timing."""
        cancel = threading.Event()
        ready = lambda: not self._lock.locked() and not self.contention()  # noqa: E731

        def wait() -> None:
            self.ledger.wait_reserve(
                owner, "benchmark", needs, "waiting for the benchmark to end", cancel, ready=ready, key=key
            )
            if cancel.is_set():  # the caller went away while this thread was being admitted
                self.ledger.release(owner)

        async def report() -> None:
            while progress is not None:
                # the ledger's lock is held by threads writing its file (waiting on other servers' file lock): a
                # read of the queue waits for it off the event loop; its answer is not needed once cancelled
                pos = await anyio.to_thread.run_sync(self.ledger.position, owner, abandon_on_cancel=True)
                if pos is not None:
                    await progress(0, None, f"queued for memory and the device: position {pos}")
                await anyio.sleep(2)

        try:
            refused: GpuboxError | None = None
            async with anyio.create_task_group() as tg:
                tg.start_soon(report)
                try:
                    # abandoned on cancel: the waiting thread is woken out of the queue below and returns
                    await anyio.to_thread.run_sync(wait, abandon_on_cancel=True)
                except GpuboxError as exc:  # raised outside the group, so the client reads it unwrapped
                    refused = exc
                tg.cancel_scope.cancel()
            if refused is not None:
                raise refused
            while not self._lock.acquire(blocking=False):  # another queued caller won the slot first: queue again
                await anyio.to_thread.run_sync(self.ledger.release, owner)
                await anyio.to_thread.run_sync(wait, abandon_on_cancel=True)
        except BaseException:
            cancel.set()

            def leave() -> None:
                self.ledger.leave_queue(owner)
                self.ledger.release(owner)

            with anyio.CancelScope(shield=True):  # the ledger's lock, a file lock and a write: off the event loop
                await anyio.to_thread.run_sync(leave)
            raise

    def _release(self, owner: str, peak: object) -> None:
        """Give back the reservation and the lock whatever fails on the way: a lock left held would refuse every
        later benchmark until the server restarts."""
        try:
            if isinstance(peak, dict):  # before the release: a peak above the estimate is remembered for its key
                self.ledger.update(owner, measured=peak)
        except Exception:  # only the next run's estimate is lost: the measurements stand
            log.warning("could not record the peak memory of %s", owner, exc_info=True)
        finally:
            try:
                self.ledger.release(owner)
            finally:
                self.active = None
                self._lock.release()

    async def _run(
        self,
        task: str,
        params: dict[str, Any],
        limit: float,
        progress: Progress | None,
        total: float | None,
        queue: bool = False,
    ) -> WorkerOutcome:
        if not await anyio.to_thread.run_sync(is_available, "torch"):  # a search of the import path: off the loop
            raise MissingExtraError("Device benchmarks", "bench", "torch")
        needs = await anyio.to_thread.run_sync(lambda: self.needs(task, params))
        key = footprint.key(task, params, needs)
        owner = await self._admit(task, needs, queue, progress, key)
        done = 0
        shapes = n_shapes(params)

        async def on_event(event: dict[str, Any]) -> None:
            nonlocal done
            if progress is None or event.get("type") not in ("row", "skip", "figure"):
                return
            # a backend missing on this machine is one skip for every shape (no head_dim): it counts for all of them
            done += shapes if event["type"] == "skip" and event.get("head_dim") is None else 1
            label = event.get("backend") or event.get("name") or ""
            shape = f" D={event['head_dim']} N={event['seq_len']}" if event.get("head_dim") else ""
            await progress(done, total, f"{event['type']} {label}{shape}")

        outcome: WorkerOutcome | None = None
        try:
            outcome = await run_worker(task, params, limit, on_event)
            return outcome
        finally:
            peak = next((e["peak_gb"] for e in (outcome.events if outcome else []) if e.get("type") == "memory"), None)
            with anyio.CancelScope(shield=True):  # file locks and writes: off the event loop, even when cancelled
                await anyio.to_thread.run_sync(self._release, owner, peak)

    def needs(self, task: str, params: dict[str, Any]) -> dict[str, float]:
        """The estimate for this run (before anything a past run of the same shape measured)."""
        gpus = any(d.device.startswith("cuda") for d in self.ledger.state().devices)
        return footprint.needs(task, params, gpus)

    def expected(self, task: str, params: dict[str, Any]) -> dict[str, float]:
        """What the run would reserve: the estimate, raised to what the same benchmark took last time."""
        needs = self.needs(task, params)
        return self.ledger.expected(footprint.key(task, params, needs), needs)

    # --- bench_attention ------------------------------------------------------------------------
    async def attention(
        self,
        params: dict[str, Any],
        baseline: str,
        time_limit_s: float,
        progress: Progress | None = None,
        queue: bool = False,
    ) -> tuple[AttentionBench, list[plots.Plot]]:
        # one row or skip per backend and shape; without backends the worker runs all of them. Without head_dims
        # the default sweep depends on the device the worker finds, so there is no total
        total = float(n_shapes(params) * len(params.get("backends") or BACKENDS)) if params.get("head_dims") else None
        outcome = await self._run("attention", params, time_limit_s, progress, total, queue)
        run_id = self.runs.new_id("attention")
        result, figs = await anyio.to_thread.run_sync(lambda: self._attention_result(run_id, params, baseline, outcome))
        return result, figs

    def _attention_result(
        self, run_id: str, params: dict[str, Any], baseline: str, outcome: WorkerOutcome
    ) -> tuple[AttentionBench, list[plots.Plot]]:
        result, figs = attention_result(run_id, params, baseline, outcome)
        self._store(run_id, "attention", result.model_dump(), [r.model_dump() for r in result.rows], figs)
        return result, figs

    # --- bench_device ---------------------------------------------------------------------------
    async def device(
        self, params: dict[str, Any], time_limit_s: float, progress: Progress | None = None, queue: bool = False
    ) -> DeviceBench:
        outcome = await self._run("device", params, time_limit_s, progress, None, queue)
        run_id = self.runs.new_id("device")
        return await anyio.to_thread.run_sync(lambda: self._device_result(run_id, outcome))

    def _device_result(self, run_id: str, outcome: WorkerOutcome) -> DeviceBench:
        result, figs = device_result(run_id, outcome, self.estimator())
        self._store(run_id, "device", result.model_dump(), None, figs)
        return result

    # --- history --------------------------------------------------------------------------------
    def _store(
        self, run_id: str, kind: str, result: dict[str, Any], rows: list[dict[str, Any]] | None, figs: list[plots.Plot]
    ) -> None:
        record = {"kind": kind, "created_at": datetime.now(UTC).isoformat(timespec="seconds"), "result": result}
        self.runs.save(run_id, record, rows)
        for p in figs:
            self.runs.save_file(run_id, p.name + ".png", p.png)

    def summary(self, record: dict[str, Any], run_id: str) -> RunSummary:
        r = record["result"]
        if record["kind"] == "attention":
            won = [w for w in r["winners"] if w["backend"]]
            text = f"{len(r['rows'])} rows, D={sorted({x['head_dim'] for x in r['rows']})}; winners: " + (
                ", ".join(f"D={w['head_dim']} N={w['seq_len']}: {w['backend']}" for w in won[:6]) or "none"
            )
        else:
            text = "; ".join(f"{f['name']} {f['measured']:.4g} {f['unit']}" for f in r["figures"] if f["measured"])
        return RunSummary(
            run_id=run_id,
            kind=record["kind"],
            status=r["status"],
            created_at=record["created_at"],
            device=r["device"],
            device_name=r["device_name"],
            versions=r["versions"],
            summary=text,
            files=[uri(run_id, f) for f in self.runs.files(run_id)],
        )

    def list(self, limit: int) -> RunList:
        out: list[RunSummary] = []
        for run_id, rec in self.runs.records():
            try:
                out.append(self.summary(rec, run_id))
            except DAMAGE as exc:  # a record of the wrong shape: list the rest
                log.warning("bench run %s left out of the list: its record is damaged (%r)", run_id, exc)
            if len(out) >= limit:
                break
        return RunList(runs=out, directory=str(self.runs.root))

    def replot(self, run_id: str, against: str | None) -> tuple[PlotResult, list[plots.Plot]]:
        rec = self.runs.load(run_id)
        old = self.runs.load(against) if against else None
        try:
            return self._replot(run_id, rec, against, old)
        except DAMAGE as exc:  # a field missing or of the wrong type: say which run, not the SDK's bare error
            why = f"{type(exc).__name__}: {exc}"
            if old is None or not self._summarises(rec, run_id):
                raise self.runs.damaged(run_id, why) from exc
            if against and not self._summarises(old, against):
                raise self.runs.damaged(against, why) from exc
            raise NotFoundError(
                f"runs '{run_id}' and '{against}' cannot be plotted together ({why}): one record is damaged. "
                f"Plot each alone to find it, and remove its folder under {self.runs.root}"
            ) from exc

    def _summarises(self, rec: dict[str, Any], run_id: str) -> bool:
        try:
            self.summary(rec, run_id)
        except DAMAGE:
            return False
        return True

    def _replot(
        self, run_id: str, rec: dict[str, Any], against: str | None, old: dict[str, Any] | None
    ) -> tuple[PlotResult, list[plots.Plot]]:
        if old is not None and old["kind"] != rec["kind"]:
            raise InvalidInputError(
                f"run {against} is a {old['kind']} run and {run_id} an {rec['kind']} run; compare runs of the same kind"
            )
        r, notes = rec["result"], []
        label = f"{against} ({old['result']['device_name']})" if old else ""
        title = f"{r['device_name']} · {run_id}" + (f" vs {against}" if against else "")
        if rec["kind"] == "attention":
            figs = [plots.tflops_plot(r["rows"], title, old["result"]["rows"] if old else None, label or "earlier")]
            if not old:
                figs.append(plots.speedup_plot(r["rows"], title, r["baseline"]))
        else:
            figs = [plots.device_plot(r["figures"], title, old["result"]["figures"] if old else None, label)]
        if not figs[0].series:
            raise NotFoundError(f"run {run_id} has no measured rows to plot; run bench_attention again")
        if old:
            diff = set(old["result"]["versions"].items()) ^ set(r["versions"].items())
            if diff:
                notes.append("versions differ: " + ", ".join(sorted({k for k, _ in diff})))
        for p in figs:
            self.runs.save_file(run_id, p.name + ".png", p.png)
        refs = [PlotRef(name=p.name, uri=uri(run_id, p.name + ".png"), series=p.series) for p in figs]
        return PlotResult(run_id=run_id, against=against, plots=refs, notes=notes), figs
