"""A queued job's waiter against changes made elsewhere: another server's finetune_cancel (it changes only the
job's row: the waiter is this server's) takes the job out of this server's line; a stale waiter's failure does
not overwrite a job that has moved on. The worker's start is recorded instead of run."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from gpubox.tools.finetune import admission
from gpubox.tools.finetune.jobs import JobStore
from tests.finetune.lifecycle import finetuner, write_plan


def test_a_cancel_from_another_server_takes_the_queued_job_out_of_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ft, ledger = finetuner(tmp_path, budget_gb=2.0)
    started: list[str] = []
    monkeypatch.setattr(ft.supervisor, "spawn", started.append)
    ledger.reserve("model m", "inference", {"host": 1.0}, "infer_unload name='m'")  # the job must wait
    jid = ft.launch(write_plan(ft, "q"), queue=True).job_id
    [waiter] = [t for t in threading.enumerate() if t.name == f"finetune-queue-{jid}"]
    other_server = JobStore(ft.root)  # the same database, as another gpubox process opens it
    assert other_server.transition(jid, "queued", "cancelled", error="cancelled while waiting", finished=time.time())
    waiter.join(30)
    assert not waiter.is_alive(), "the waiter still waits in line for a job cancelled elsewhere"
    assert ledger.position(admission.owner(jid)) is None
    ledger.release("model m")  # memory frees: the cancelled job must not start
    assert ledger.holding(admission.owner(jid)) is None and not started
    assert ft.store.get(jid)["state"] == "cancelled"  # type: ignore[index]


def test_a_stale_queue_failure_does_not_overwrite_a_started_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ft, _ledger = finetuner(tmp_path)
    monkeypatch.setattr(ft.supervisor, "spawn", lambda _job_id: None)
    jid = ft.launch(write_plan(ft, "p")).job_id  # started
    ft._fail_queued(jid, "waiting for memory failed")  # a waiter left over from before it started
    assert ft.store.get(jid)["state"] == "starting"  # type: ignore[index]
