"""A job whose worker never starts must not stay 'starting' (no pid) for good: that state blocks every later
launch, makes cancel answer 'being started' and resume refuse. Its start failing is recorded at once; a start
abandoned unseen (its server died between the row and the worker, or it hangs past any start's length) is
failed by the next reconcile."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpubox.errors import InvalidInputError
from gpubox.tools.box.capacity import pid_alive, start_time
from gpubox.tools.finetune import admission, launcher
from gpubox.tools.finetune.jobs import MIGRATIONS, STARTING_TIMEOUT_S, add_column
from tests.finetune.lifecycle import finetuner, sleeping_worker, write_plan


def test_a_launch_whose_worker_cannot_start_fails_and_the_next_launch_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ft, ledger = finetuner(tmp_path)

    def no_fds(_job_id: str) -> None:
        raise OSError(24, "Too many open files")  # Popen, as on a box out of file descriptors

    monkeypatch.setattr(ft.supervisor, "spawn", no_fds)
    with pytest.raises(OSError):
        ft.launch(write_plan(ft, "p1"))
    [row] = ft.store.all()
    assert row["state"] == "failed" and "Too many open files" in row["error"]
    assert ledger.holding(admission.owner(row["id"])) is None
    with pytest.raises(InvalidInputError, match="not running"):  # not 'being started'
        ft.cancel(row["id"], wait_s=0)
    started: list[str] = []
    monkeypatch.setattr(ft.supervisor, "spawn", started.append)
    assert ft.launch(write_plan(ft, "p2")).state == "starting" and len(started) == 1


def dead_pid() -> tuple[int, float | None]:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    started = start_time(proc.pid)
    proc.wait()
    return proc.pid, started


def test_a_start_abandoned_by_a_server_that_died_fails_on_the_next_reconcile(tmp_path: Path) -> None:
    ft, _ledger = finetuner(tmp_path)
    ft.store.create("j1", "a1", "base", "lora", "starting")
    pid, started = dead_pid()
    ft.store.update("j1", server_pid=pid, server_started=started)  # the server that wrote the row is gone
    row = ft.store.reconcile("j1")
    assert row is not None and row["state"] == "failed" and "never started" in row["error"]
    assert not ft.store.active()


def test_a_start_under_way_stays_starting_until_it_takes_too_long(tmp_path: Path) -> None:
    ft, _ledger = finetuner(tmp_path)
    ft.store.create("j1", "a1", "base", "lora", "starting")  # this (live) server is starting it now
    row = ft.store.reconcile("j1")
    assert row is not None and row["state"] == "starting"
    ft.store.update("j1", starting_since=time.time() - STARTING_TIMEOUT_S - 1)
    row = ft.store.reconcile("j1")
    assert row is not None and row["state"] == "failed"


def test_a_worker_whose_watcher_cannot_start_is_stopped_and_its_job_never_resumed_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the worker got its pid, then no thread was left for its watcher: the start failed, but the job was marked
    # failed while the worker ran on, unwatched, and a resume started a second worker on the same job
    monkeypatch.setattr(launcher, "command", sleeping_worker)
    ft, ledger = finetuner(tmp_path)

    def no_thread(*_args: object) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(ft.supervisor, "_watch", no_thread)
    with pytest.raises(RuntimeError):
        ft.launch(write_plan(ft, "p1"))
    [row] = ft.store.all()
    assert row["pid"] is not None and not pid_alive(row["pid"], row["pid_started"]), "the unwatched worker runs on"
    assert ledger.holding(admission.owner(row["id"])) is None
    assert ft.store.reconcile(row["id"])["state"] == "failed"  # type: ignore[index]


def test_a_column_another_server_added_meanwhile_is_no_error(tmp_path: Path) -> None:
    # two servers opening a database of an older version at once both see a column missing; the second ALTER
    # failed ('duplicate column name') and with it that server's first fine-tuning call
    ft, _ledger = finetuner(tmp_path)
    with sqlite3.connect(ft.store.db) as c:
        for ddl in MIGRATIONS.values():
            add_column(c, ddl)  # every column is there already: a no-op, not an error
