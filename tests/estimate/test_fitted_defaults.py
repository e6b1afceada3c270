"""FITTED cases: the figures these tests expect follow from constants fitted to data, or from a planner rule.

They guard the fit (a refactor must not move it); they do not validate the model. Independent checks against
published measurements are in test_published.py and bench/results/estimator_training.md.

- ACTIVATION_FACTOR[True] (checkpointing) is fitted to the 'fit' rows of bench/estimator_eval/training_memory.csv
  (published trl/HF Trainer + peft runs: fms-acceleration's Mistral-7B on an A100-80GB, Qwen's LoRA profile).
- The seed case (A10 24 GB, Mistral-7B-Instruct-v0.3 QLoRA NF4 double quant, r=16 on q/k/v/o, paged_adamw_8bit,
  checkpointing) plans micro-batch 8 at sequence 512 and 4 at 1024: the largest that fits, at most
  MICRO_BATCH_TOKENS (4096) tokens; larger ones fit in memory too and the candidates say so.
- q4_k_m's 4.89 bits per weight was fitted to llama.cpp's reported Llama-3-8B Q4_K_M size (4.58 GiB).
"""

from __future__ import annotations

import pytest
from mcp import Client

from tests.conftest import call_ok

pytestmark = pytest.mark.anyio
QKVO = ["q_proj", "k_proj", "v_proj", "o_proj"]


async def test_fitted_a10_mistral_qlora_plans_micro_batch_8_at_sequence_512(client: Client) -> None:
    est = await call_ok(
        client,
        "estimate_training",
        model="Mistral-7B-Instruct-v0.3",
        method="qlora",
        lora_r=16,
        lora_target_modules=QKVO,
        max_length=512,
        gradient_checkpointing=True,
        optim="paged_adamw_8bit",
        gpu="A10",
        dataset_samples=10_000,
    )
    a10 = est["results"][0]
    assert a10["micro_batch"] == 8  # 8 x 512 = 4096 tokens: the planner's cap, not the memory
    assert 9.0 <= a10["memory"]["total_gb"] <= 12.0
    status = {c["micro_batch"]: c["status"] for c in a10["candidates"]}
    assert status[16] == "fits" and status[32] == "oom"
    nogc = {c["micro_batch"]: c["status"] for c in a10["without_checkpointing"]}
    assert nogc[4] == "oom"


async def test_fitted_a10_mistral_qlora_at_sequence_1024_drops_to_micro_batch_4(client: Client) -> None:
    est = await call_ok(
        client,
        "estimate_training",
        model="Mistral-7B",
        lora_target_modules=QKVO,
        max_length=1024,
        gpu="A10",
        gradient_checkpointing=True,
        dataset_samples=100,
    )
    assert est["results"][0]["micro_batch"] == 4


async def test_fitted_q4_k_m_bits_reproduce_the_llama_cpp_file_size(client: Client) -> None:
    est = await call_ok(client, "estimate_inference", model="Llama-3-8B", weight_format="q4_k_m", gpu="A10")
    assert est["results"][0]["memory"]["weights_gb"] == pytest.approx(4.92, rel=0.02)  # 4.58 GiB in llama-bench
