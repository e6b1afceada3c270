"""Two gpubox servers on one state dir launching at the same moment: one training slot for both. The check "no job
runs" and the job's row must be one step across servers, not only across one server's threads."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from gpubox.errors import BusyError
from gpubox.tools.finetune import service as ft_service
from tests.finetune.lifecycle import finetuner, write_plan


def test_two_servers_launching_at_once_start_one_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, _ = finetuner(tmp_path / "state")
    b, _ = finetuner(tmp_path / "state")  # a second server: its own service and ledger object, the same files
    started: list[str] = []
    for ft in (a, b):
        monkeypatch.setattr(ft.supervisor, "spawn", started.append)  # the worker's start, recorded
    plan_a, plan_b = write_plan(a, "plana", 1.0), write_plan(b, "planb", 1.0)

    in_prepare, go, b_waits = threading.Event(), threading.Event(), threading.Event()
    prepare = a._prepare

    def held_prepare(*args: Any) -> Any:  # A has seen no job running and is about to write its row
        in_prepare.set()
        assert go.wait(30)
        return prepare(*args)

    monkeypatch.setattr(a, "_prepare", held_prepare)
    real = getattr(ft_service, "exclusive", None) or __import__("gpubox.filelock").filelock.exclusive

    @contextmanager
    def seen(path: Path) -> Iterator[None]:
        if threading.current_thread().name == "launch-b":
            b_waits.set()  # B reached the cross-server lock while A holds it
        lock: AbstractContextManager[None] = real(path)
        with lock:
            yield

    monkeypatch.setattr(ft_service, "exclusive", seen, raising=False)
    outcome: dict[str, Any] = {}

    def launch(name: str, ft: Any, plan: str) -> None:
        try:
            outcome[name] = ft.launch(plan)
        except BusyError as exc:
            outcome[name] = exc

    ta = threading.Thread(target=launch, args=("a", a, plan_a), name="launch-a")
    ta.start()
    assert in_prepare.wait(30)
    tb = threading.Thread(target=launch, args=("b", b, plan_b), name="launch-b")
    tb.start()
    assert b_waits.wait(30), "B never reached a lock shared across servers"
    go.set()
    ta.join(30)
    tb.join(30)
    assert outcome["a"].state == "starting" and len(started) == 1, (outcome, started)
    assert isinstance(outcome["b"], BusyError) and "one training job runs at a time" in str(outcome["b"])


def test_the_status_a_launch_returns_is_read_after_the_slot_is_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that ended at once makes status wait (up to 30 s) for its figures: not while every other launch and
    resume of every server waits on the slot."""
    ft, _ = finetuner(tmp_path / "state")
    monkeypatch.setattr(ft.supervisor, "spawn", lambda _job_id: None)
    held: list[bool] = []
    status = ft.status

    def seen(job_id: str, *args: Any, **kwargs: Any) -> Any:
        held.append(ft._slot_lock.locked())
        return status(job_id, *args, **kwargs)

    monkeypatch.setattr(ft, "status", seen)
    assert ft.launch(write_plan(ft, "plana", 1.0)).state == "starting"
    assert held == [False]
