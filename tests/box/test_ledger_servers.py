"""Two gpubox servers on one box whose work has the same owner name (each loaded a model 'm'): each server's
holding is its own. The other server here is a real live process (`sleeper`) named in the ledger file as the
server of its holding, as that server writes it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gpubox.errors import CapacityError
from gpubox.tools.box.capacity import start_time
from tests.box.test_ledger import holding_row, ledger


def test_a_holding_named_like_another_live_servers_keeps_both_in_the_file_and_the_budget(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    path = tmp_path / "state" / "box" / "ledger.json"
    path.parent.mkdir(parents=True)
    server: dict[str, object] = {"server_pid": sleeper.pid, "server_started": start_time(sleeper.pid)}
    row = holding_row("model m", "inference", 3.0, sleeper.pid, server)  # loaded in that server's own process
    path.write_text(json.dumps({"holdings": [row]}), encoding="utf-8")
    led = ledger(tmp_path, memory_budget_gb=8.0)
    led.reserve("model m", "inference", {"host": 3.0}, "infer_unload name='m'")  # this server's own model m
    in_file = [(h["owner"], h["server_pid"]) for h in json.loads(path.read_text(encoding="utf-8"))["holdings"]]
    assert sorted(in_file, key=str) == sorted([("model m", sleeper.pid), ("model m", os.getpid())], key=str)
    with pytest.raises(CapacityError):  # 3 + 3 GB held of 8: another 3 GB would over-commit the budget
        led.reserve("job x", "finetune", {"host": 3.0}, "finetune_cancel job_id='x'")


def test_another_servers_in_process_work_is_not_measured_as_that_whole_server(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """A model loaded inside another server's process was measured as that server's whole process tree (its
    RSS), which read as more than its reservation and warned 'the box may be over-committed' on every box_plan
    of the other server (and counted the RSS once per holding)."""
    path = tmp_path / "state" / "box" / "ledger.json"
    path.parent.mkdir(parents=True)
    server: dict[str, object] = {"server_pid": sleeper.pid, "server_started": start_time(sleeper.pid)}
    inproc = holding_row("model m", "inference", 0.0001, sleeper.pid, server)
    worker = holding_row("job w", "finetune", 0.0001, sleeper.pid, {"server_pid": os.getpid()})
    path.write_text(json.dumps({"holdings": [inproc, worker]}), encoding="utf-8")
    state = ledger(tmp_path, memory_budget_gb=8.0).state()
    held = {h.owner.split(" [")[0]: h for h in state.holdings}  # another server's work shows its pid
    assert held["model m"].measured_gb is None, held["model m"]  # its share of that process is not knowable
    assert held["job w"].measured_gb is not None  # a worker's own process tree is measured
    assert not any("model m" in w for w in state.warnings), state.warnings
