"""QLoRA: the base loads in 4-bit NF4 through bitsandbytes (on the CPU here; on a GPU where there is one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from tests.finetune.conftest import DATASET, make_settings
from tests.finetune.test_jobs import ok, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_a_qlora_job_trains_a_4bit_base_and_saves_an_adapter(tmp_path: Path, hf_base: Path) -> None:
    pytest.importorskip("bitsandbytes", reason="needs gpubox[train]")
    mcp = build_server(make_settings(tmp_path / "root", hf_base))
    try:
        async with Client(mcp) as client:
            plan = await ok(
                client,
                "finetune_plan",
                dataset=str(DATASET),
                method="qlora",
                max_length=128,
                per_device_train_batch_size=2,
                max_steps=1,
            )
            assert plan["request"]["method"] == "qlora"
            job = await ok(client, "finetune_launch", plan_id=plan["plan_id"])
            st = await wait_until(client, job["job_id"], lambda s: False)
    finally:
        state_of(mcp).close()
    assert st["state"] == "completed", st
    assert st["step"] == 1 and st["loss"] is not None
    assert json.loads((Path(st["adapter_path"]) / "adapter_config.json").read_text())["peft_type"] == "LORA"
