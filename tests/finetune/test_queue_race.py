"""finetune_launch queue=true against other work reserving at the same time: the launch must end queued or
admitted, never refused. Other work reserves at every point of the launch where it holds no ledger lock (each
device reading: the ledger reads the devices outside its lock), one point per launch, so every interleaving a
reservation can take is tried in order, with events and no timing. The plan is written directly and the worker's
start is recorded instead of run: the race is in the launch's bookkeeping, not in training."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path

import pytest

from gpubox.errors import CapacityError
from gpubox.settings import Settings
from gpubox.tools.box.capacity import Reading
from gpubox.tools.box.ledger import Ledger
from gpubox.tools.box.schemas import Holding
from gpubox.tools.finetune.service import Finetuner
from tests.conftest import DATA
from tests.finetune.lifecycle import write_plan

BUDGET_GB, JOB_GB, MODEL_GB = 2.0, 1.5, 1.0  # the job or the model fits, not both


class OtherWork:
    """A device reader that, at the launching thread's `at`-th reading, first lets a model be reserved from
    another thread (joined before the reading returns, so the order is fixed)."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.readings = 0  # the launching thread's
        self.launcher: threading.Thread | None = None
        self.ledger: Ledger | None = None
        self.outcome: Holding | CapacityError | None = None  # the model's reservation, once tried

    def __call__(self, _pids: Iterable[int]) -> dict[str, Reading]:
        if threading.current_thread() is self.launcher:
            if self.readings == self.at:
                other = threading.Thread(target=self._reserve)
                other.start()
                other.join(timeout=30)
                assert not other.is_alive(), "the reservation blocked: the launch read the devices under a lock"
            self.readings += 1
        return {"host": Reading(total_gb=16.0, used_gb=2.0)}

    def _reserve(self) -> None:
        assert self.ledger is not None
        try:
            self.outcome = self.ledger.reserve("model m", "inference", {"host": MODEL_GB}, "infer_unload name='m'")
        except CapacityError as exc:
            self.outcome = exc


def launch_with_other_work_at(tmp_path: Path, at: int, monkeypatch: pytest.MonkeyPatch) -> tuple[OtherWork, str]:
    """One queued launch with a model reserved at its `at`-th device reading; returns what the model got and
    the job's state."""
    other = OtherWork(at)
    settings = Settings.load(state_dir=tmp_path / f"at{at}", allowed_roots=[DATA], memory_budget_gb=BUDGET_GB)
    ledger = other.ledger = Ledger(settings, read=other)
    ft = Finetuner(settings, ledger=ledger)
    started: list[str] = []
    monkeypatch.setattr(ft.supervisor, "spawn", started.append)  # admitted: its worker would start here
    plan_id = write_plan(ft, "race1", JOB_GB)
    other.launcher = threading.current_thread()
    try:
        st = ft.launch(plan_id, queue=True)
    except CapacityError as exc:
        pytest.fail(f"queue=true was refused when other work reserved at device reading {at}: {exc}")
    finally:
        other.launcher = None  # the queued job's waiter thread reads on its own
    job = f"fine-tune job {st.job_id}"
    if st.state == "queued":
        assert isinstance(other.outcome, Holding), "queued while nothing held its memory"
        assert st.queue_position == 1 and ledger.holding(job) is None and not started
        ft.cancel(st.job_id)  # its waiter leaves the line
    else:
        assert st.state == "starting" and started == [st.job_id]
        holding = ledger.holding(job)
        assert holding is not None and holding.devices == {"host": JOB_GB}
        assert not isinstance(other.outcome, Holding)  # the model was refused, or came after the launch
    return other, st.state


def test_a_queued_launch_is_never_refused_whatever_reserves_between_its_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    states: list[str] = []
    at = 0
    while True:
        other, state = launch_with_other_work_at(tmp_path, at, monkeypatch)
        states.append(state)
        if other.readings <= at:  # the launch ended before that reading: every point has been tried
            break
        at += 1
    # the model reserved first at every point of the launch: each launch waited; with no other work, one started
    assert states == ["queued"] * (len(states) - 1) + ["starting"] and len(states) > 1, states


def test_a_cancel_between_a_queued_jobs_row_and_its_waiter_takes_it_out_of_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # another client's finetune_cancel lands after the job's row reads 'queued' and before its waiter exists
    settings = Settings.load(state_dir=tmp_path, allowed_roots=[DATA], memory_budget_gb=BUDGET_GB)
    ledger = Ledger(settings, read=lambda _pids: {"host": Reading(total_gb=16.0, used_gb=2.0)})
    ft = Finetuner(settings, ledger=ledger)
    started: list[str] = []
    monkeypatch.setattr(ft.supervisor, "spawn", started.append)
    ledger.reserve("model m", "inference", {"host": MODEL_GB}, "infer_unload name='m'")  # so the job must wait
    enqueue = ft.queue.enqueue

    def cancelled_first(job_id: str, needs: dict[str, float], ready: object) -> None:
        other = threading.Thread(target=ft.cancel, args=(job_id,))
        other.start()
        other.join(timeout=30)
        enqueue(job_id, needs, ready)  # type: ignore[arg-type]

    monkeypatch.setattr(ft.queue, "enqueue", cancelled_first)
    st = ft.launch(write_plan(ft, "race1", JOB_GB), queue=True)
    job = f"fine-tune job {st.job_id}"
    waiters = [t for t in threading.enumerate() if t.name == f"finetune-queue-{st.job_id}"]
    for t in waiters:
        t.join(timeout=30)  # it ends at once: nothing to wait for
    assert not any(t.is_alive() for t in waiters), "the cancelled job's waiter still waits for memory"
    assert ft.status(st.job_id).state == "cancelled"
    assert ledger.position(job) is None, "a cancelled job keeps its place in line"
    ledger.release("model m")  # memory frees: a cancelled job must not start
    assert ledger.holding(job) is None and not started
