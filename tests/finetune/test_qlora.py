"""QLoRA: the base loads in 4-bit NF4 through bitsandbytes (on the CPU here; on a GPU where there is one), and
finetune_merge folds the adapter into a 16-bit reload of the base, never into the 4-bit model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from tests.conftest import call_ok
from tests.finetune.conftest import DATASET, PROMPTS, follow_job, last_logits_hf, make_settings

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_a_qlora_job_trains_a_4bit_base_saves_an_adapter_and_merges_into_16bit(
    tmp_path: Path, hf_base: Path
) -> None:
    import numpy as np  # bitsandbytes' and datasets' dependency: the folder's requires_train checks them
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    mcp = build_server(make_settings(tmp_path / "root", hf_base))
    try:
        async with Client(mcp) as client:
            plan = await call_ok(
                client,
                "finetune_plan",
                dataset=str(DATASET),
                method="qlora",
                max_length=128,
                per_device_train_batch_size=2,
                max_steps=1,
                learning_rate=2e-3,
            )
            assert plan["request"]["method"] == "qlora"
            job = await call_ok(client, "finetune_launch", plan_id=plan["plan_id"])
            st = await follow_job(client, job["job_id"])
            assert st["state"] == "completed", st
            m = await call_ok(client, "finetune_merge", job=st["adapter_name"], dtype="bf16")
    finally:
        state_of(mcp).close()
    assert st["state"] == "completed", st
    assert st["step"] == 1 and st["loss"] is not None
    assert json.loads((Path(st["adapter_path"]) / "adapter_config.json").read_text())["peft_type"] == "LORA"
    assert m["method"] == "qlora" and m["dtype"] == "bf16" and m["gguf_path"] is None
    config = json.loads((Path(m["hf_path"]) / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and "quantization_config" not in config
    tok = AutoTokenizer.from_pretrained(m["hf_path"])
    plain = AutoModelForCausalLM.from_pretrained(m["hf_path"], dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(m["base_model"], dtype=torch.float32)
    peft = PeftModel.from_pretrained(base, st["adapter_path"])
    a, b = last_logits_hf(plain, tok, PROMPTS[0]), last_logits_hf(peft, tok, PROMPTS[0])
    np.testing.assert_allclose(a, b, atol=0.5, rtol=0.05)  # bf16 keeps 8 bits of mantissa
    assert a.argmax() == b.argmax()
