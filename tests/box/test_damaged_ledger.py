"""The ledger file is state other processes wrote: one bad holding emptied the whole ledger (live reservations with
it: the box over-committed), a negative size let a reservation past the budget, a NaN refused every one and broke
box_plan's result, a negative pid failed every tool that reads the ledger, and a NaN measured footprint had a load
reserve nothing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpubox.errors import CapacityError
from gpubox.tools.box.capacity import pid_alive, start_time
from gpubox.tools.box.footprints import FootprintStore
from tests.box.test_ledger import holding_row, ledger


@pytest.mark.parametrize(
    "bad",
    [
        {"devices": {"host": "lots"}},
        {"kind": "training"},
        {"devices": {"host": -1000.0}},
        {"devices": {"host": float("nan")}},
        {"pid": -5},
        None,
    ],
    ids=["string size", "unknown kind", "negative size", "nan size", "negative pid", "null"],
)
def test_one_bad_holding_is_skipped_and_the_live_ones_still_count(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], bad: dict[str, object] | None
) -> None:
    path = tmp_path / "state" / "box" / "ledger.json"
    path.parent.mkdir(parents=True)
    server: dict[str, object] = {"server_pid": sleeper.pid, "server_started": start_time(sleeper.pid)}
    good = holding_row("model m", "inference", 5.0, sleeper.pid, server)
    broken = None if bad is None else {**holding_row("model n", "inference", 1.0, sleeper.pid, server), **bad}
    path.write_text(json.dumps({"holdings": [good, broken]}), encoding="utf-8")
    led = ledger(tmp_path, memory_budget_gb=8.0)
    held = [h.owner for h in led.state().holdings]
    assert len(held) == 1 and held[0].startswith("model m"), (
        held
    )  # before: none at all, or every tool failed (the negative pid)
    with pytest.raises(CapacityError):  # 5 GB of 8 held: 4 more would over-commit it
        led.reserve("job x", "finetune", {"host": 4.0}, "finetune_cancel job_id='x'")


def test_a_pid_that_cannot_be_a_process_is_not_alive() -> None:
    assert not pid_alive(-5, None) and not pid_alive(0, None)  # psutil raised ValueError


def test_a_measured_footprint_that_is_not_a_size_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "footprints.json"
    path.write_text(
        '{"a": {"host": NaN}, "b": {"host": Infinity, "cuda:0": 2.5}, "c": {"host": -1}, "d": {"host": "x"}}'
    )
    store = FootprintStore(path)
    assert store.known("a") is None and store.known("c") is None and store.known("d") is None
    assert store.known("b") == {"cuda:0": 2.5}


def test_a_folder_in_the_ledger_files_place_is_one_clear_error(tmp_path: Path) -> None:
    from gpubox.errors import GpuboxError

    (tmp_path / "state" / "box" / "ledger.json").mkdir(parents=True)
    with pytest.raises(GpuboxError, match=r"ledger\.json cannot be written .*remove whatever is in its place"):
        ledger(tmp_path).reserve("job x", "finetune", {"host": 1.0}, "finetune_cancel job_id='x'")
