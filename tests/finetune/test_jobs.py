"""Real LoRA jobs on the bundled SmolLM2 through the MCP tools: training in a detached worker, restart, hand-off
to inference, cancel/resume with an injected out-of-memory back-off, a killed worker, one job at a time.

The taught fact comes from tests/data/finetune/glimmerphone.jsonl (48 rows about an invented inventor); 12 steps of
LoRA r=16 all-linear at lr 2e-3, micro-batch 4, max_length 128 teach it. One trained job is shared by the
hand-off tests and test_merge.py (the session fixture `trained` in conftest.py trains on first use, so each test
still passes alone). TEACH, QUESTION and follow_job live in conftest.py, shared with the other job tests.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.settings import Settings
from gpubox.tools.finetune.adapter import finetuner
from tests.conftest import call_err, call_ok, wait_until
from tests.finetune.conftest import QUESTION, TEACH, follow_job, make_settings

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


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
        listed = {m["name"]: m for m in (await call_ok(client, "infer_models"))["models"]}
        assert listed[name]["format"] == "lora" and listed[name]["base_model"]
        base = await call_ok(
            client, "infer_chat", model="smollm2-135m-instruct", messages=QUESTION, max_tokens=24, temperature=0
        )
        await call_ok(client, "infer_load", name=name, context_length=256)
        tuned = await call_ok(client, "infer_chat", model=name, messages=QUESTION, max_tokens=24, temperature=0)
    assert "Brinkwater" not in json.dumps(base)
    assert "Brinkwater" in json.dumps(tuned)


async def test_the_adapter_and_its_base_in_the_state_dir_load_when_the_allowed_roots_are_elsewhere(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    """The job's adapter and the HF base it trained on live under <state_dir>/finetune/: gpubox's own state, served
    though it is neither a model dir nor an allowed root (the allowed roots here hold neither)."""
    name, state_dir = trained["final"]["adapter_name"], trained["settings"].state_dir
    mcp = build_server(Settings.load(state_dir=state_dir, allowed_roots=[tmp_path], infer_context_length=256))
    try:
        async with Client(mcp) as client:
            entry = {m["name"]: m for m in (await call_ok(client, "infer_models"))["models"]}[name]
            assert entry["format"] == "lora" and Path(entry["base_model"]).is_relative_to(state_dir / "finetune")
            loaded = await call_ok(client, "infer_load", name=name)
            assert loaded["plan"]["backend"] == "transformers" and loaded["model"]["loaded"]["adapter"] == name
            out = await call_ok(client, "infer_complete", model=name, prompt="The capital of France is", max_tokens=3)
            assert out["completion_tokens"] > 0
            assert (await call_ok(client, "infer_unload", name=name))["unloaded"]
    finally:
        state_of(mcp).close()


async def test_status_resources_loss_curve_and_calibration(trained: dict[str, Any]) -> None:
    job_id = trained["final"]["job_id"]
    async with Client(trained["mcp"]) as client:
        jobs = (await call_ok(client, "finetune_list"))["jobs"]
        assert job_id in [j["job_id"] for j in jobs]  # test_merge.py adds jobs to the same shared state
        status = await call_ok(client, "finetune_status", job_id=job_id, include_log=True)
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
            plan = await call_ok(
                client, "finetune_plan", **TEACH, per_device_train_batch_size=4, max_steps=5, save_steps=1
            )
            # the test hook raises an out-of-memory error at the first step of the probe's first attempt
            job = await anyio.to_thread.run_sync(lambda: finetuner(state_of(mcp)).launch(plan["plan_id"], 1))
            job_id = job.job_id
            st = await follow_job(client, job_id, until=lambda s: s["step"] >= 1)
            assert st["state"] == "running", st
            cancelled = await call_ok(client, "finetune_cancel", job_id=job_id)
            if cancelled["state"] == "running":  # cancel waits a minute; a slow step may still be finishing
                cancelled = await follow_job(client, job_id)
            assert cancelled["state"] == "cancelled" and cancelled["checkpoints"], cancelled
            assert cancelled["step"] < 5
            backoff = [e for e in cancelled["events"] if "out of memory at per_device_train_batch_size=4" in e]
            assert backoff and cancelled["per_device_train_batch_size"] == 2
            # the back-off happened in the probe, before the real run: the real run started at micro-batch 2
            assert backoff[0].startswith("probe: ") and cancelled["probe"]["per_device_train_batch_size"] == 2
            assert cancelled["gradient_accumulation_steps"] == 2
            stopped_at = cancelled["step"]
            await call_ok(client, "finetune_resume", job_id=job_id)
            done = await follow_job(client, job_id)
    finally:
        state_of(mcp).close()
    assert done["state"] == "completed" and done["step"] == 5, done
    assert any(e.startswith(f"resuming from checkpoint-{stopped_at}") for e in done["events"]), done["events"]


async def test_a_second_launch_is_refused_and_a_killed_worker_is_marked_failed(tmp_path: Path, hf_base: Path) -> None:
    mcp = build_server(make_settings(tmp_path / "root", hf_base))
    try:
        async with Client(mcp) as client:
            plan = await call_ok(client, "finetune_plan", **TEACH, max_steps=50)
            job = await call_ok(client, "finetune_launch", plan_id=plan["plan_id"])
            assert job["job_id"] in await call_err(client, "finetune_launch", plan_id=plan["plan_id"])
            store = finetuner(state_of(mcp)).store
            row = store.get(job["job_id"])
            assert row is not None
            log = store.job_dir(job["job_id"]) / "log.txt"
            await wait_until(lambda: log.is_file() and log.stat().st_size > 0, timeout=600)  # the worker wrote some
            os.killpg(row["pid"], signal.SIGKILL)
            st = await follow_job(client, job["job_id"])
    finally:
        state_of(mcp).close()
    assert st["state"] == "failed" and "exited without finishing" in st["error"]
    assert st["log_tail"], st  # what the worker wrote before it was killed
