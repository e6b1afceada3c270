from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import Client

from gpubox.tools.estimate.catalog import package_catalog
from gpubox.tools.estimate.training import ACTIVATION_FACTOR, TrainingPlanInput, lora_params, memory_at
from tests.conftest import call_err, call_ok

pytestmark = pytest.mark.anyio
QKVO = ["q_proj", "k_proj", "v_proj", "o_proj"]


async def test_seed_003_time_formula_holds_and_an_implausible_throughput_is_flagged(client: Client) -> None:
    est = await call_ok(
        client,
        "estimate_training",
        model="Mistral-7B",
        gpu="RTX-4090",
        dataset_tokens=1_000_000,
        num_train_epochs=1,
        tokens_per_s=15,
    )
    r = est["results"][0]
    assert r["wall_hours"] == pytest.approx(1_000_000 * 1 / (15 * 3600), rel=1e-4)  # ~18.5 h as the seed says
    assert any("implausibly low" in w and "RTX-4090" in w for w in est["warnings"])


async def test_estimated_time_follows_the_same_formula_with_the_estimated_throughput(client: Client) -> None:
    est = await call_ok(
        client, "estimate_training", model="Llama-3-8B", gpu="H100-SXM", dataset_tokens=5_000_000, num_train_epochs=3
    )
    r = est["results"][0]
    assert r["wall_hours"] == pytest.approx(5_000_000 * 3 / (r["tokens_per_s"] * 3600), rel=1e-3)
    assert r["costs"] and all(c["price_observed"] for c in r["costs"])
    assert r["electricity_usd"] > 0


async def test_a_throughput_above_peak_is_called_impossible(client: Client) -> None:
    est = await call_ok(
        client, "estimate_training", model="Llama-3-8B", gpu="T4", dataset_tokens=10_000, tokens_per_s=1e6
    )
    assert any("impossible" in w for w in est["warnings"])


async def test_llama3_8b_rank_16_on_all_seven_projections_has_41943040_lora_params(client: Client) -> None:
    est = await call_ok(client, "estimate_training", model="Llama-3-8B", lora_r=16, gpu="H100-SXM", dataset_tokens=1000)
    assert est["trainable_params"] == 41_943_040
    assert est["trainable_pct"] == pytest.approx(0.52, abs=0.01)


def test_lora_param_count_is_rank_times_in_plus_out_per_layer() -> None:
    shape = package_catalog().model("Mistral-7B")
    # q: 16*(4096+4096), k,v: 16*(4096+1024), o: 16*(4096+4096) per layer x 32 layers
    assert lora_params(shape, 16, QKVO) == 32 * (131072 + 81920 + 81920 + 131072)


async def test_gradient_accumulation_reaches_the_target_global_batch(client: Client) -> None:
    est = await call_ok(
        client, "estimate_training", model="Mistral-7B", gpu="A10", dataset_samples=1000, target_global_batch=64
    )
    r = est["results"][0]
    assert r["micro_batch"] * r["gradient_accumulation"] == r["global_batch"] >= 64


async def test_an_unknown_lora_target_names_the_valid_modules(client: Client) -> None:
    text = await call_err(
        client, "estimate_training", model="Mistral-7B", gpu="A10", dataset_tokens=1, lora_target_modules=["qq"]
    )
    assert "q_proj" in text


async def test_a_model_too_big_for_the_gpu_gets_no_micro_batch(client: Client) -> None:
    est = await call_ok(client, "estimate_training", model="Llama-2-70B", method="full", gpu="A10", dataset_tokens=1000)
    r = est["results"][0]
    assert r["micro_batch"] is None and r["gradient_accumulation"] is None
    assert r["candidates"][0]["status"] == "oom"


@settings(max_examples=60, deadline=None)
@given(
    model=st.sampled_from(["Mistral-7B", "Llama-3-8B", "Qwen2.5-0.5B", "Gemma-3-4B", "SmolLM2-135M"]),
    method=st.sampled_from(["full", "lora", "qlora"]),
    seq=st.integers(min_value=16, max_value=4096),
    b=st.integers(min_value=1, max_value=63),
    gc=st.booleans(),
)
def test_a_larger_micro_batch_never_needs_less_memory(model: str, method: str, seq: int, b: int, gc: bool) -> None:
    shape = package_catalog().model(model)
    fmt = "nf4_dq" if method == "qlora" else "bf16"
    p = TrainingPlanInput(method, 16, QKVO, seq, gc, "adamw_torch", 0.15, fmt)  # type: ignore[arg-type]
    small = memory_at(shape, p, b, gc, ACTIVATION_FACTOR[gc]).total_gb
    large = memory_at(shape, p, b + 1, gc, ACTIVATION_FACTOR[gc]).total_gb
    assert large >= small
