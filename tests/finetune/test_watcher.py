"""The supervisor's watcher of a worker: it releases the memory of the worker it watches, once that worker has
exited, and nothing else. The workers are real detached processes (launcher.command gives a sleeping Python in
place of training), so spawn, the ledger and the job rows run as in a launch; each test decides when a worker
exits by killing it, and waits on events, not time."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from gpubox.tools.finetune import admission, launcher
from gpubox.tools.finetune.jobs import append_metric, write_json
from tests.finetune.lifecycle import finetuner, kill, sleeping_worker, write_plan

PROBE = {"steps": 2, "per_device_train_batch_size": 1, "tokens_per_s": 10.0, "peak_memory_gb": 1.0, "seconds": 1.0}


def watchers(job_id: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"finetune-watch-{job_id}"]


def test_the_old_workers_watcher_leaves_the_resumed_workers_reservation_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launcher, "command", sleeping_worker)
    ft, ledger = finetuner(tmp_path)
    in_settle, go = threading.Event(), threading.Event()

    def calibrate(_info: dict[str, Any]) -> str:  # the estimator's write, held open while the job is resumed
        in_settle.set()
        go.wait(30)
        return "calibrated"

    ft.supervisor.calibrate = calibrate
    jid = ft.launch(write_plan(ft, "p1")).job_id
    owner = admission.owner(jid)
    first = ft.store.get(jid)["pid"]  # type: ignore[index]
    try:
        append_metric(ft.store.job_dir(jid), {"probe": {**PROBE, "memory_kind": "cpu_rss"}})
        old = watchers(jid)
        ft.store.finish(jid, "failed", error="rank 0: RuntimeError: boom")  # as the worker records its failure
        kill(first)
        assert in_settle.wait(30), "the watcher never settled the failed job"
        assert ledger.holding(owner) is None  # the first worker's memory was given back
        ft.resume(jid)  # another client saw 'failed' while the old watcher still records calibrations
        second = ft.store.get(jid)["pid"]  # type: ignore[index]
        go.set()
        for t in old:
            t.join(30)
        held = ledger.holding(owner)
        assert held is not None and held.pid == second, "the old watcher released the resumed worker's memory"
    finally:
        go.set()
        kill(first)
        if (row := ft.store.get(jid)) and row["pid"]:
            kill(row["pid"])


def test_an_error_while_watching_leaves_the_live_workers_reservation_and_the_watch_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launcher, "command", sleeping_worker)
    ft, ledger = finetuner(tmp_path)
    jid = ft.launch(write_plan(ft, "p1")).job_id
    owner = admission.owner(jid)
    pid = ft.store.get(jid)["pid"]  # type: ignore[index]
    update, tries, retried = ledger.update, [], threading.Event()

    def full_disk_once(who: str, **kw: Any) -> Any:
        if kw.get("source") == "probe measurement":
            tries.append(who)
            if len(tries) == 1:
                raise OSError(28, "No space left on device")  # e.g. checkpoints filled the disk
            retried.set()
        return update(who, **kw)

    monkeypatch.setattr(ledger, "update", full_disk_once)
    try:
        old = watchers(jid)
        append_metric(ft.store.job_dir(jid), {"probe": {**PROBE, "memory_kind": "cpu_rss"}})
        assert retried.wait(30), "the watcher stopped at the error"
        held = ledger.holding(owner)
        assert held is not None and held.pid == pid and held.source == "probe measurement"
        kill(pid)
        for t in old:
            t.join(30)
        assert ledger.holding(owner) is None  # released once the worker exited
    finally:
        kill(pid)


def test_a_json_file_rewritten_is_never_seen_half_written(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    write_json(path, {"request": "x" * 10_000})
    with path.open(encoding="utf-8") as reader:  # a read under way when the worker rewrites the file
        write_json(path, {"request": "y" * 10_000})
        assert json.loads(reader.read()) == {"request": "x" * 10_000}  # not truncated, not mixed
    assert json.loads(path.read_text(encoding="utf-8")) == {"request": "y" * 10_000}
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]  # no temporary file left
