"""finetune_resume against what else happens to the job store meanwhile: another client's reconcile while the new
worker is being started, a job queued before it. The worker is a real detached process (a sleeping Python in
place of training) where it matters; each interleaving is forced in order, without timing."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gpubox.errors import BusyError
from gpubox.tools.finetune import admission, launcher
from tests.finetune.lifecycle import finetuner, kill, sleeping_worker, write_plan


def test_a_reconcile_while_a_resumed_worker_starts_leaves_the_job_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launcher, "command", sleeping_worker)
    ft, _ledger = finetuner(tmp_path)
    jid = ft.launch(write_plan(ft, "p1")).job_id
    first = ft.store.get(jid)["pid"]  # type: ignore[index]
    watching = [t for t in threading.enumerate() if t.name == f"finetune-watch-{jid}"]
    kill(first)  # the worker died: the next reconcile marks the job failed
    for t in watching:
        t.join(30)  # it saw the worker exit
    assert ft.status(jid, settled=False).state == "failed"
    set_process, seen = ft.store.set_process, []

    def reconciled_first(job_id: str, pid: int) -> None:  # another client's finetune_list, before the new pid
        other = threading.Thread(target=lambda: seen.append(ft.store.reconcile(job_id)))
        other.start()
        other.join(30)
        set_process(job_id, pid)

    monkeypatch.setattr(ft.store, "set_process", reconciled_first)
    second = None
    try:
        ft.resume(jid)
        second = ft.store.get(jid)["pid"]  # type: ignore[index]
        assert seen and seen[0] is not None and seen[0]["state"] == "starting" and seen[0]["pid"] is None
        row = ft.store.reconcile(jid)
        assert row is not None and row["state"] == "starting" and row["pid"] == second != first, row
    finally:
        kill(first)
        if second:
            kill(second)


def test_a_resume_does_not_overtake_a_job_queued_before_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ft, ledger = finetuner(tmp_path)
    started: list[str] = []
    monkeypatch.setattr(ft.supervisor, "spawn", started.append)  # the bookkeeping is the unit; no worker runs
    old = ft.launch(write_plan(ft, "r", gb=1.0)).job_id
    ledger.release(admission.owner(old))
    ft.store.finish(old, "cancelled")
    ledger.reserve("model m", "inference", {"host": 1.5}, "infer_unload name='m'")  # the 3 GB job must wait
    queued = ft.launch(write_plan(ft, "q", gb=3.0), queue=True)
    assert queued.state == "queued"
    with pytest.raises(BusyError, match=f"job {queued.job_id} .* is queued"):
        ft.resume(old)
    assert ft.store.get(old)["state"] == "cancelled" and ledger.holding(admission.owner(old)) is None  # type: ignore[index]
    ft.cancel(queued.job_id)
    assert ft.resume(old).state == "starting" and started == [old, old]
