"""num_processes > 1: a LoRA job on the bundled SmolLM2 through `accelerate launch` with two CPU ranks (gloo).

Both ranks train (each logs its rank and world size), only rank 0 writes the job state and the adapter, the
adapter is served by inference, and a rank that dies fails the job with its log tail instead of hanging it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.tools.finetune.adapter import finetuner
from tests.conftest import call_ok
from tests.finetune.conftest import DATASET, follow_job, make_settings

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
SMALL = {"dataset": str(DATASET), "max_length": 64, "lora_r": 8, "per_device_train_batch_size": 1, "num_processes": 2}


def ranks_of(launcher_pid: int) -> dict[int, psutil.Process]:
    """The worker processes under the accelerate launcher, by their RANK."""
    out: dict[int, psutil.Process] = {}
    for p in psutil.Process(launcher_pid).children(recursive=True):
        try:
            if "gpubox.tools.finetune.worker" in " ".join(p.cmdline()):
                out[int(p.environ().get("RANK", "-1"))] = p
        except psutil.Error:
            continue
    return out


async def test_a_two_process_job_trains_on_both_ranks_and_its_adapter_is_served(tmp_path: Path, hf_base: Path) -> None:
    settings = make_settings(tmp_path / "root", hf_base)
    mcp = build_server(settings)
    try:
        async with Client(mcp) as client:
            plan = await call_ok(client, "finetune_plan", **SMALL, gradient_accumulation_steps=2, max_steps=2)
            assert plan["global_batch"] == 1 * 2 * 2
            assert any("gloo" in w for w in plan["warnings"]), plan["warnings"]
            job = await call_ok(client, "finetune_launch", plan_id=plan["plan_id"])
            done = await follow_job(client, job["job_id"])
            listed = {m["name"]: m for m in (await call_ok(client, "infer_models"))["models"]}
            await call_ok(client, "infer_load", name=done["adapter_name"], context_length=256)
    finally:
        state_of(mcp).close()
    log = (settings.state_dir / "finetune" / "jobs" / job["job_id"] / "log.txt").read_text(errors="replace")
    assert done["state"] == "completed", (done, log[-3000:])
    assert "rank 0 of world size 2" in log and "rank 1 of world size 2" in log
    assert done["num_processes"] == 2 and done["step"] == 2
    assert any(e.startswith("training started (2 processes)") for e in done["events"]), done["events"]
    assert any(e.startswith("probe skipped") for e in done["events"])
    assert Path(done["adapter_path"], "adapter_config.json").is_file()
    assert listed[done["adapter_name"]]["format"] == "lora"


async def test_a_killed_rank_fails_the_job_with_its_log_tail(tmp_path: Path, hf_base: Path) -> None:
    mcp = build_server(make_settings(tmp_path / "root", hf_base))
    try:
        async with Client(mcp) as client:
            plan = await call_ok(client, "finetune_plan", **SMALL, max_steps=200, probe_steps=0)
            job = await call_ok(client, "finetune_launch", plan_id=plan["plan_id"])
            st = await follow_job(client, job["job_id"], until=lambda s: s["step"] >= 1)
            assert st["state"] == "running", st
            row = finetuner(state_of(mcp)).store.get(job["job_id"])
            assert row is not None
            ranks = ranks_of(row["pid"])
            assert set(ranks) == {0, 1}, ranks
            os.kill(ranks[1].pid, signal.SIGKILL)
            st = await follow_job(client, job["job_id"])
    finally:
        state_of(mcp).close()
    assert st["state"] == "failed", st
    assert st["log_tail"] and st["error"], st
    assert st["step"] < 200  # it failed rather than training on with one rank
    # the job fails once the launcher has stopped every rank, so its summary names the rank that died
    assert "rank 1 (local_rank: 1) failed first: exitcode -9 (SIGKILL)" in st["error"], st
    assert "Root Cause (first observed failure)" in st["log_tail"], st["log_tail"]


async def test_cancel_reaches_every_rank_and_they_stop_at_the_same_step_with_a_checkpoint(
    tmp_path: Path, hf_base: Path
) -> None:
    mcp = build_server(make_settings(tmp_path / "root", hf_base))
    try:
        async with Client(mcp) as client:
            plan = await call_ok(client, "finetune_plan", **SMALL, max_steps=200, save_steps=100, probe_steps=0)
            job = await call_ok(client, "finetune_launch", plan_id=plan["plan_id"])
            st = await follow_job(client, job["job_id"], until=lambda s: s["step"] >= 1)
            assert st["state"] == "running", st
            row = finetuner(state_of(mcp)).store.get(job["job_id"])
            assert row is not None
            ranks = ranks_of(row["pid"])
            cancelled = await call_ok(client, "finetune_cancel", job_id=job["job_id"])
            if cancelled["state"] == "running":  # cancel waits a minute; a slow step may still be finishing
                cancelled = await follow_job(client, job["job_id"])
    finally:
        state_of(mcp).close()
    assert cancelled["state"] == "cancelled", cancelled
    # saved at the step both ranks stopped at (save_steps=100 would not have saved yet)
    assert cancelled["checkpoints"] == [f"checkpoint-{cancelled['step']}"], cancelled
    assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in ranks.values())
