"""QLoRA on a real NVIDIA GPU (skipped without one): the plan is made for the GPU from NVML, the probe measures
peak memory with torch.cuda.max_memory_allocated, the job trains in 4-bit NF4 with paged 8-bit AdamW, and the
planned vs measured figures are written where bench/gpu_checks.sh collects them (GPUBOX_GPU_RESULTS)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from tests.conftest import call_ok
from tests.finetune.conftest import DATASET, follow_job, make_settings

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.gpu]


async def test_a_qlora_job_on_the_gpu_measures_what_the_plan_predicted(tmp_path: Path, hf_base: Path) -> None:
    mcp = build_server(make_settings(tmp_path / "root", hf_base))
    try:
        async with Client(mcp) as client:
            plan = await call_ok(
                client,
                "finetune_plan",
                dataset=str(DATASET),
                method="qlora",
                max_length=512,
                lora_r=16,
                lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                optim="paged_adamw_8bit",
                gradient_checkpointing=True,
                max_steps=6,
                probe_steps=3,
            )
            assert plan["device"] == "cuda" and plan["estimated_memory_gb"], plan
            job = await call_ok(client, "finetune_launch", plan_id=plan["plan_id"])
            st = await follow_job(client, job["job_id"])
    finally:
        state_of(mcp).close()
    assert st["state"] == "completed", st
    probe = st["probe"]
    assert probe and probe["memory_kind"] == "cuda_max_allocated" and probe["peak_memory_gb"] > 0
    assert probe["tokens_per_s"] and probe["tokens_per_s"] > 0
    assert any("calibration" in e for e in st["events"]), st["events"]
    record = {
        "model": "SmolLM2-135M-Instruct, QLoRA NF4 r=16 q/k/v/o, seq 512, checkpointing, paged_adamw_8bit",
        "micro_batch": st["per_device_train_batch_size"],
        "planned_memory_gb": plan["estimated_memory_gb"],
        "probe_peak_memory_gb": probe["peak_memory_gb"],
        "job_peak_memory_gb": st["peak_memory_gb"],
        "planned_tokens_per_s": plan["estimated_tokens_per_s"],
        "probe_tokens_per_s": probe["tokens_per_s"],
        "job_tokens_per_s": st["tokens_per_s"],
    }
    out = os.environ.get("GPUBOX_GPU_RESULTS")
    if out:
        with Path(out).open("a", encoding="utf-8") as f:
            f.write(json.dumps({"test": "finetune_qlora", **record}) + "\n")
