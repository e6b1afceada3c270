"""A fine-tune job and a loaded model share the box ledger, on the real stack: a launch that does not fit is
refused naming the model and the call that frees it; with queue=true it waits, starts when the model is unloaded,
and its worker's memory is released when the worker ends."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.settings import Settings
from tests.conftest import call_err, call_ok, requires_llama, requires_models, wait_until
from tests.finetune.conftest import DATASET, make_settings

pytestmark = [pytest.mark.anyio, pytest.mark.slow, requires_llama, requires_models]
MODEL = "smollm2-135m-instruct"


async def test_a_launch_that_does_not_fit_is_refused_or_queued_until_memory_frees(
    tmp_path: Path, hf_base: Path
) -> None:
    first = make_settings(tmp_path / "root", hf_base)
    mcp = build_server(first)
    try:
        async with Client(mcp) as c:
            plan = await call_ok(c, "finetune_plan", dataset=str(DATASET), max_length=64, max_steps=2)
            model = await call_ok(c, "box_plan", load=MODEL, context_length=512)
    finally:
        state_of(mcp).close()
    job_gb, model_gb = plan["estimated_memory_gb"], model["admission"]["needs"]["host"]
    # the same state dir, restarted with room for the job or the model, not both
    settings = Settings.load(**{**first.model_dump(), "memory_budget_gb": job_gb + model_gb / 2})
    mcp = build_server(settings)
    try:
        async with Client(mcp) as c:
            await call_ok(c, "infer_load", name=MODEL, context_length=512)
            refused = await call_err(c, "finetune_launch", plan_id=plan["plan_id"])
            assert f"infer_unload name='{MODEL}' frees" in refused, refused
            assert (await call_ok(c, "finetune_list"))["jobs"] == []  # the refusal left nothing behind

            job = await call_ok(c, "finetune_launch", plan_id=plan["plan_id"], queue=True)
            assert job["state"] == "queued" and job["queue_position"] == 1, job
            overtaking = await call_err(c, "finetune_launch", plan_id=plan["plan_id"])  # must not jump the line
            assert f"job {job['job_id']}" in overtaking and "is queued" in overtaking, overtaking
            box = await call_ok(c, "box_plan")
            assert box["box"]["queued"] == [f"fine-tune job {job['job_id']}"]

            await call_ok(c, "infer_unload", name=MODEL)

            async def left_queue() -> dict[str, object] | None:
                st = await call_ok(c, "finetune_status", job_id=job["job_id"], wait_seconds=30)
                return st if st["state"] != "queued" else None

            started = await wait_until(left_queue, timeout=300)
            assert started["state"] in ("starting", "running", "completed"), started

            async def worker_holds() -> bool:
                # "starting" comes a moment before the worker is spawned; then the worker's pid holds the memory
                # (not the server's), until it ends and releases it
                holders = {h["owner"]: h for h in (await call_ok(c, "box_plan"))["box"]["holdings"]}
                worker = holders.get(f"fine-tune job {job['job_id']}")
                return worker is None or worker["pid"] != os.getpid()

            await wait_until(worker_holds, timeout=60, interval=0.1)
            if started["state"] != "completed":
                await call_ok(c, "finetune_cancel", job_id=job["job_id"])

            async def released() -> bool:
                return (await call_ok(c, "box_plan"))["box"]["holdings"] == []

            await wait_until(released, timeout=120, interval=0.5)
    finally:
        state_of(mcp).close()
