"""estimate_training answers what was asked: TrainingRequest names, 'auto', no dataset size, optimizer states."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp import Client
from pydantic import Field

from gpubox.app import state_of
from gpubox.tools.estimate.adapter import estimator
from gpubox.tools.estimate.requests import TrainingRequest
from gpubox.tools.estimate.training import OPTIMIZER_BYTES
from tests.conftest import call_err, call_ok

pytestmark = pytest.mark.anyio
QKVO = ["q_proj", "k_proj", "v_proj", "o_proj"]


async def test_the_tool_takes_exactly_the_training_request_fields(client: Client) -> None:
    full = json.loads((await client.read_resource("gpubox://tools/estimate_training")).contents[0].text)  # type: ignore[union-attr]
    props = full["properties"]
    assert set(props) == {*TrainingRequest.model_fields, "detail"}
    assert props["lora_r"]["default"] == 16 and "description" in props["optim"]
    listed = {t.name: t for t in (await client.list_tools()).tools}["estimate_training"].input_schema["properties"]
    assert set(listed) - {"more"} | set(listed["more"]["description"].replace(",", " ").split()) >= set(props)


async def test_several_gpus_come_as_a_ranking_with_the_same_order_as_the_detail(client: Client) -> None:
    args = {"model": "Llama-3.1-8B", "gpu": "all", "method": "qlora", "dataset_samples": 10_000}
    full = await call_ok(client, "estimate_training", **args, detail=True)
    compact = await call_ok(client, "estimate_training", **args)
    assert full["ranking"] is None and len(full["results"]) >= 20
    assert compact["results"] == [] and len(json.dumps(compact)) < len(json.dumps(full)) / 10
    rows = compact["ranking"]["rows"]
    assert [row[0] for row in rows] == [r["gpu"] for r in full["results"]]
    for (_, micro, peak, tok_s, hours, usd, provider), r in zip(rows, full["results"], strict=True):
        assert micro == r["micro_batch"]
        assert peak == pytest.approx(r["memory"]["total_gb"], abs=0.06) and tok_s == pytest.approx(
            r["tokens_per_s"], abs=0.51
        )
        assert hours == pytest.approx(r["wall_hours"], rel=5e-3)
        cheapest = min(r["costs"], key=lambda c: c["usd"], default=None)
        assert (usd, provider) == (
            (pytest.approx(cheapest["usd"], rel=5e-3), cheapest["provider"]) if cheapest else (None, None)
        )
    assert any("detail=true" in a for a in compact["assumptions"])
    one = await call_ok(client, "estimate_training", **{**args, "gpu": "A10"})
    assert one["ranking"] is None and len(one["results"]) == 1  # one GPU keeps its full breakdown


async def test_without_a_dataset_size_the_memory_plan_is_given_and_time_is_null(client: Client) -> None:
    est = await call_ok(
        client,
        "estimate_training",
        model="Mistral-7B",
        gpu="A10",
        lora_target_modules=QKVO,
        gradient_checkpointing=True,
    )
    r = est["results"][0]
    assert r["micro_batch"] == 8 and r["memory"]["total_gb"] > 0  # same plan as with a dataset
    assert r["wall_hours"] is None and r["costs"] == [] and r["electricity_usd"] is None
    assert est["dataset_tokens"] is None
    assert any("No dataset size" in a and "wall_hours" in a for a in est["assumptions"])
    steps = await call_ok(
        client, "estimate_training", model="Mistral-7B", gpu="A10", max_steps=100, per_device_train_batch_size=4
    )
    s = steps["results"][0]
    assert s["wall_hours"] == pytest.approx(100 * 4 * 512 / (s["tokens_per_s"] * 3600), rel=1e-3)


@pytest.mark.parametrize("batch", ["auto", None])
async def test_auto_and_null_micro_batch_both_let_the_planner_choose(client: Client, batch: str | None) -> None:
    est = await call_ok(
        client,
        "estimate_training",
        model="Mistral-7B",
        gpu="A10",
        lora_target_modules=QKVO,
        gradient_checkpointing=True,
        per_device_train_batch_size=batch,
    )
    assert est["results"][0]["micro_batch"] == 8


async def test_a_fixed_micro_batch_and_accumulation_steps_are_kept(client: Client) -> None:
    est = await call_ok(
        client,
        "estimate_training",
        model="Mistral-7B",
        gpu="A10",
        per_device_train_batch_size=2,
        gradient_accumulation_steps=16,
    )
    r = est["results"][0]
    assert r["micro_batch"] == 2 and r["gradient_accumulation"] == 16 and r["global_batch"] == 32
    assert [c["micro_batch"] for c in r["candidates"]] == [2]


async def test_auto_checkpointing_is_off_when_the_batch_fits_without_it_and_on_when_it_does_not(
    client: Client,
) -> None:
    roomy = await call_ok(
        client, "estimate_training", model="Mistral-7B", gpu="H100-SXM", gradient_checkpointing="auto"
    )
    assert roomy["results"][0]["gradient_checkpointing"] is False
    assert roomy["results"][0]["without_checkpointing"] == []
    # Mistral-7B QLoRA at 4096 tokens on an A10: even micro-batch 1 needs ~50 GB without checkpointing
    tight = await call_ok(
        client, "estimate_training", model="Mistral-7B", gpu="A10", max_length=4096, gradient_checkpointing="auto"
    )
    r = tight["results"][0]
    assert r["gradient_checkpointing"] is True and r["micro_batch"] == 1
    assert r["without_checkpointing"][0]["status"] == "oom"
    assert any("gradient_checkpointing='auto'" in a for a in tight["assumptions"])
    fixed = await call_ok(
        client,
        "estimate_training",
        model="Mistral-7B",
        gpu="A10",
        per_device_train_batch_size=8,
        gradient_checkpointing="auto",
    )
    assert fixed["results"][0]["gradient_checkpointing"] is True  # micro-batch 8 only fits with it


@pytest.mark.parametrize(
    ("optim", "bytes_per_param"),
    [
        ("adamw_torch", 8),
        ("adamw_torch_fused", 8),
        ("adamw_8bit", 2),
        ("adamw_bnb_8bit", 2),
        ("paged_adamw_8bit", 2),
        ("paged_adamw_32bit", 8),
        ("adafactor", 4),
        ("sgd", 0),
    ],
)
async def test_optimizer_state_follows_the_transformers_optim_name(
    client: Client, optim: str, bytes_per_param: float
) -> None:
    est = await call_ok(client, "estimate_training", model="Llama-3-8B", gpu="H100-SXM", method="lora", optim=optim)
    assert est["optimizer_bytes_per_param"] == bytes_per_param == OPTIMIZER_BYTES[optim]
    got = est["results"][0]["memory"]["optimizer_gb"]
    assert got == pytest.approx(bytes_per_param * est["trainable_params"] / 1e9, abs=1e-3)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"per_device_train_batch_size": 0}, "per_device_train_batch_size"),
        ({"per_device_train_batch_size": -4}, "between 1 and 4096"),
        ({"lora_target_modules": []}, "lora_target_modules"),
    ],
)
async def test_out_of_range_request_fields_are_clear_errors(client: Client, args: dict[str, Any], words: str) -> None:
    assert words in await call_err(client, "estimate_training", model="Mistral-7B", gpu="A10", **args)


async def test_an_unknown_optim_is_refused_with_the_valid_names(client: Client) -> None:
    assert "paged_adamw_8bit" in await call_err(client, "estimate_training", model="Mistral-7B", optim="adam")


class FinetuneLike(TrainingRequest):
    """What the fine-tuning family passes: the shared request plus its own fields."""

    dataset: str = Field(default="rows.jsonl")


async def test_the_core_takes_one_request_including_a_subclass(server: object) -> None:
    est = estimator(state_of(server)).training(  # type: ignore[arg-type]
        FinetuneLike(model="Mistral-7B", gpu="A10", lora_target_modules=QKVO, gradient_checkpointing=True)
    )
    assert est.results[0].micro_batch == 8 and est.optimizer == "paged_adamw_8bit"


async def test_training_calibrations_apply_only_to_comparable_runs(client: Client) -> None:
    run = {
        "kind": "training",
        "gpu": "A10",
        "model": "Mistral-7B",
        "method": "qlora",
        "max_length": 512,
        "per_device_train_batch_size": 8,
        "gradient_checkpointing": True,
        "lora_r": 16,
        "lora_target_modules": QKVO,
        "optim": "paged_adamw_8bit",
        "peak_memory_gb": 12.0,
        "tokens_per_s": 900.0,
    }
    rec = await call_ok(client, "estimate_record_measurement", **run)
    cfg = rec["config"]
    assert cfg["lora_r"] == 16 and cfg["lora_target_modules"] == sorted(QKVO) and cfg["optim"] == "paged_adamw_8bit"
    same = {"model": "Mistral-7B", "gpu": "A10", "lora_target_modules": QKVO, "gradient_checkpointing": True}
    used = (await call_ok(client, "estimate_training", **same))["results"][0]
    assert used["calibration"] and f"run #{rec['id']}" in used["calibration"]
    for change in ({"lora_r": 64}, {"lora_target_modules": "all-linear"}, {"optim": "adamw_torch"}):
        other = (await call_ok(client, "estimate_training", **{**same, **change}))["results"][0]
        assert other["calibration"] is None, change
        assert other["mfu_source"].startswith("default"), change
