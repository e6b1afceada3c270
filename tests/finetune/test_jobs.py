"""Real LoRA jobs on the bundled SmolLM2 through the MCP tools: training in a detached worker, restart, hand-off
to inference, cancel/resume with an injected out-of-memory back-off, a killed worker, one job at a time.

The taught fact comes from tests/data/finetune/glimmerphone.jsonl (48 rows about an invented inventor); 12 steps of
LoRA r=16 all-linear at lr 2e-3, micro-batch 4, max_length 128 teach it. One trained job is shared by the
hand-off tests and test_merge.py (the session fixture `trained` in conftest.py trains on first use, so each test
still passes alone).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.tools.finetune.adapter import finetuner
from tests.finetune.conftest import DATASET, make_settings

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
TEACH = {"dataset": str(DATASET), "max_length": 128, "learning_rate": 2e-3, "lora_r": 16, "seed": 1}
QUESTION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Who invented the glimmerphone?"},
]
DEADLINE_S = 3600  # a loaded 2-core CI box; the loops return as soon as the job moves


async def ok(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def wait_until(client: Client, job_id: str, done: Any) -> dict[str, Any]:
    """Long-poll finetune_status until done(status) or the job stops."""
    end = time.monotonic() + DEADLINE_S
    while True:
        st = await ok(client, "finetune_status", job_id=job_id, wait_seconds=60)
        if done(st) or st["state"] not in ("starting", "running") or time.monotonic() > end:
            return st


def run(mcp: Any, fn: Any, *args: Any) -> Any:
    async def go() -> Any:
        async with Client(mcp) as client:
            return await fn(client, *args)

    return anyio.run(go)


def test_a_lora_job_trains_in_the_background_and_its_loss_falls(trained: dict[str, Any]) -> None:
    launched, final = trained["launched"], trained["final"]
    assert launched["state"] in ("starting", "running") and launched["total_steps"] == 12
    assert final["state"] == "completed", final
    assert final["step"] == 12 and final["loss"] < final["first_loss"] * 0.5
    assert final["smoothed_loss"] is not None and final["tokens_per_s"] > 0 and final["peak_memory_gb"] > 0
    adapter = Path(final["adapter_path"])
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["r"] == 16 and Path(config["base_model_name_or_path"]).name == "smollm2-135m-instruct-hf"
    assert adapter.parent == trained["settings"].state_dir / "finetune" / "adapters"


def test_a_restarted_server_finds_the_running_job_and_it_finishes(trained: dict[str, Any]) -> None:
    # launched on the first server, which was closed while the job ran; the second one saw it through
    assert trained["launched"]["state"] in ("starting", "running")
    assert trained["final"]["state"] == "completed"
    assert any(e.startswith("training started") for e in trained["final"]["events"])


async def test_the_adapter_is_served_by_inference_and_answers_with_the_taught_fact(trained: dict[str, Any]) -> None:
    name = trained["final"]["adapter_name"]
    async with Client(trained["mcp"]) as client:
        listed = {m["name"]: m for m in (await ok(client, "infer_models"))["models"]}
        assert listed[name]["format"] == "lora" and listed[name]["base_model"]
        base = await ok(
            client, "infer_chat", model="smollm2-135m-instruct", messages=QUESTION, max_tokens=24, temperature=0
        )
        await ok(client, "infer_load", name=name, context_length=256)
        tuned = await ok(client, "infer_chat", model=name, messages=QUESTION, max_tokens=24, temperature=0)
    assert "Brinkwater" not in json.dumps(base)
    assert "Brinkwater" in json.dumps(tuned)


async def test_status_resources_loss_curve_and_calibration(trained: dict[str, Any]) -> None:
    job_id = trained["final"]["job_id"]
    async with Client(trained["mcp"]) as client:
        jobs = (await ok(client, "finetune_list"))["jobs"]
        assert job_id in [j["job_id"] for j in jobs]  # test_merge.py adds jobs to the same shared state
        status = await ok(client, "finetune_status", job_id=job_id, include_log=True)
        assert status["log_tail"] and status["next_step"].startswith("infer_load")
        assert any(e.startswith("calibration") for e in status["events"])
        res = await client.read_resource(f"finetune://jobs/{job_id}")
        assert json.loads(res.contents[0].text)["state"] == "completed"  # type: ignore[union-attr]
        png = await client.read_resource(f"finetune://jobs/{job_id}/loss.png")
        blob = png.contents[0]
        assert blob.mime_type == "image/png" and blob.blob  # type: ignore[union-attr]
        prompt = await client.get_prompt("plan_finetune", {"goal": "know who invented the glimmerphone"})
        assert "finetune_launch" in prompt.messages[0].content.text  # type: ignore[union-attr]


async def test_cancel_checkpoints_and_resume_continues_after_an_oom_back_off(tmp_path: Path, hf_base: Path) -> None:
    mcp = build_server(make_settings(tmp_path / "root", hf_base))
    try:
        async with Client(mcp) as client:
            plan = await ok(client, "finetune_plan", **TEACH, per_device_train_batch_size=4, max_steps=5, save_steps=1)
            # the test hook raises an out-of-memory error at the first step of the probe's first attempt
            job = await anyio.to_thread.run_sync(lambda: finetuner(state_of(mcp)).launch(plan["plan_id"], 1))
            job_id = job.job_id
            st = await wait_until(client, job_id, lambda s: s["step"] >= 1)
            assert st["state"] == "running", st
            cancelled = await ok(client, "finetune_cancel", job_id=job_id)
            if cancelled["state"] == "running":  # cancel waits a minute; a slow step may still be finishing
                cancelled = await wait_until(client, job_id, lambda s: False)
            assert cancelled["state"] == "cancelled" and cancelled["checkpoints"], cancelled
            assert cancelled["step"] < 5
            backoff = [e for e in cancelled["events"] if "out of memory at per_device_train_batch_size=4" in e]
            assert backoff and cancelled["per_device_train_batch_size"] == 2
            # the back-off happened in the probe, before the real run: the real run started at micro-batch 2
            assert backoff[0].startswith("probe: ") and cancelled["probe"]["per_device_train_batch_size"] == 2
            assert cancelled["gradient_accumulation_steps"] == 2
            stopped_at = cancelled["step"]
            await ok(client, "finetune_resume", job_id=job_id)
            done = await wait_until(client, job_id, lambda s: False)
    finally:
        state_of(mcp).close()
    assert done["state"] == "completed" and done["step"] == 5, done
    assert any(e.startswith(f"resuming from checkpoint-{stopped_at}") for e in done["events"]), done["events"]


async def test_a_second_launch_is_refused_and_a_killed_worker_is_marked_failed(tmp_path: Path, hf_base: Path) -> None:
    mcp = build_server(make_settings(tmp_path / "root", hf_base))
    try:
        async with Client(mcp) as client:
            plan = await ok(client, "finetune_plan", **TEACH, max_steps=50)
            job = await ok(client, "finetune_launch", plan_id=plan["plan_id"])
            again = await client.call_tool("finetune_launch", {"plan_id": plan["plan_id"]})
            assert again.is_error and job["job_id"] in again.content[0].text  # type: ignore[union-attr]
            row = finetuner(state_of(mcp)).store.get(job["job_id"])
            assert row is not None
            await anyio.sleep(3)  # let it write some log
            os.killpg(row["pid"], signal.SIGKILL)
            st = await wait_until(client, job["job_id"], lambda s: False)
    finally:
        state_of(mcp).close()
    assert st["state"] == "failed" and "exited without finishing" in st["error"]
    assert st["log_tail"] is not None
