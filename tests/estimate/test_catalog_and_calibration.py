from __future__ import annotations

import json
from typing import Any

import pytest
from mcp import Client

from gpubox.tools.estimate.training import ACTIVATION_FACTOR
from tests.conftest import call_ok

pytestmark = pytest.mark.anyio
SEED_GPUS = [
    "T4",
    "V100-16GB",
    "V100-32GB",
    "A10",
    "A10G",
    "L4",
    "L40S",
    "A6000",
    "A100-40GB-SXM",
    "A100-40GB-PCIe",
    "A100-80GB-SXM",
    "A100-80GB-PCIe",
    "H100-SXM",
    "H100-PCIe",
    "H100-NVL",
    "H200",
    "GH200",
    "RTX-3090",
    "RTX-4090",
    "RTX-5090",
    "M2-Max",
    "M3-Max",
]


async def test_gpu_catalog_covers_every_seed_gpu_with_sources_and_dated_prices(client: Client) -> None:
    data = await call_ok(client, "estimate_gpus", detail=True)
    ids = {g["id"] for g in data["gpus"]}
    assert set(SEED_GPUS) <= ids
    for g in data["gpus"]:
        assert g["sources"] and g["bandwidth_gbs"] > 0 and g["vram_gb"] > 0
        for p in g["prices"]:
            assert p["price_observed"] and p["source"]
    h100 = next(g for g in data["gpus"] if g["id"] == "H100-SXM")
    assert {p["provider"] for p in h100["prices"]} >= {"Lambda", "RunPod", "AWS", "GCP", "Azure", "OCI"}

    # without detail: a row per GPU with its cheapest price
    table = (await call_ok(client, "estimate_gpus"))["table"]
    assert table["columns"] == ["id", "vram_gb", "bandwidth_gbs", "bf16_tflops", "usd_per_hour", "provider"]
    rows = {row[0]: row for row in table["rows"]}
    assert set(rows) == ids
    cheapest = min(h100["prices"], key=lambda p: p["usd_per_hour"])
    assert rows["H100-SXM"][1:] == [
        h100["vram_gb"],
        h100["bandwidth_gbs"],
        h100["bf16_tflops"],
        cheapest["usd_per_hour"],
        cheapest["provider"],
    ]


async def test_gpu_resource_serves_the_catalog(client: Client) -> None:
    res = await client.read_resource("estimate://gpus")
    assert "H100-SXM" in {g["id"] for g in json.loads(res.contents[0].text)["gpus"]}  # type: ignore[union-attr]


async def test_a_user_catalog_file_adds_a_gpu_and_a_price(client: Client, settings: Any) -> None:
    cat = settings.state_dir / "catalog"
    cat.mkdir(parents=True)
    (cat / "gpus.json").write_text(
        json.dumps(
            {
                "gpus": [
                    {
                        "id": "MI300X",
                        "name": "AMD Instinct MI300X",
                        "vram_gb": 192,
                        "bandwidth_gbs": 5300,
                        "bf16_tflops": 1307,
                        "fp32_tflops": 163,
                        "tdp_w": 750,
                        "gpu_class": "datacenter-hbm",
                        "memory_type": "HBM3",
                        "sources": {"all": "AMD datasheet"},
                    }
                ]
            }
        )
    )
    (cat / "prices.json").write_text(
        json.dumps(
            {
                "prices": [
                    {
                        "provider": "MyCloud",
                        "gpu": "MI300X",
                        "usd_per_hour": 2.0,
                        "observed": "2026-11-01",
                        "source": "quote",
                    }
                ]
            }
        )
    )
    est = await call_ok(client, "estimate_inference", model="Llama-3-70B", weight_format="f16", gpu="MI300X")
    r = est["results"][0]
    assert r["fits"] and r["costs_per_million_tokens"][0]["provider"] == "MyCloud"


async def test_a_recorded_inference_run_calibrates_later_estimates(client: Client) -> None:
    args = {"model": "Llama-3-8B", "weight_format": "q4_k_m", "gpu": "H100-SXM", "context_length": 4096}
    before = await call_ok(client, "estimate_inference", **args)
    rec = await call_ok(
        client,
        "estimate_record_measurement",
        kind="inference",
        gpu="H100-SXM",
        model="Llama-3-8B",
        weight_format="q4_k_m",
        tokens_per_s=150.0,
        context_length=0,
        note="test",
    )
    eff = rec["decode_efficiency"]
    assert eff == pytest.approx(150 * 4.9e9 / 3350e9, rel=0.02)
    after = await call_ok(client, "estimate_inference", **args)
    r = after["results"][0]
    assert r["decode_efficiency"] == pytest.approx(eff, abs=1e-3)
    assert f"run #{rec['id']}" in r["efficiency_source"]
    assert r["decode_tokens_per_s"] < before["results"][0]["decode_tokens_per_s"]
    listed = await call_ok(client, "estimate_calibrations", kind="inference")
    assert listed["measurements"][0]["id"] == rec["id"]


async def test_a_recorded_training_run_replaces_the_default_memory_factor(client: Client) -> None:
    args = {
        "model": "Mistral-7B",
        "gpu": "A10",
        "dataset_samples": 100,
        "max_length": 512,
        "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
        "gradient_checkpointing": True,
    }
    rec = await call_ok(
        client,
        "estimate_record_measurement",
        kind="training",
        gpu="A10",
        model="Mistral-7B",
        method="qlora",
        max_length=512,
        per_device_train_batch_size=8,
        gradient_checkpointing=True,
        lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        peak_memory_gb=21.5,
        tokens_per_s=900.0,
    )
    factor = rec["activation_factor"]
    assert factor > ACTIVATION_FACTOR[True]  # a heavier measured run than the default (a different stack)
    after = await call_ok(client, "estimate_training", **args)
    r = after["results"][0]
    assert r["memory"]["activation_factor"] == pytest.approx(factor)
    assert r["micro_batch"] < 8 and "run #" in (r["calibration"] or "")  # micro-batch 8 took 21.5 GB there
    assert "measured" in r["mfu_source"]
    res = await client.read_resource("estimate://calibrations/training")
    assert json.loads(res.contents[0].text)["measurements"]  # type: ignore[union-attr]


async def test_an_unknown_calibration_kind_is_refused_with_the_valid_ones(client: Client) -> None:
    from mcp import MCPError

    with pytest.raises(MCPError, match="training"):
        await client.read_resource("estimate://calibrations/benchmarks")
