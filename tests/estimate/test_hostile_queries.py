"""Estimator questions at the edges, each once answered wrongly or with a crash: a run that cannot start was priced,
a quote of 1e-6 tok/s was 'impossible' below what the GPU gives, the CPU was planned with GPU layers, made-up
weight formats were costed, unbounded sizes crashed, a blank GPU filter listed the whole catalog."""

from __future__ import annotations

import json

import pytest
from mcp import Client

from gpubox.errors import UnknownNameError
from gpubox.tools.estimate.formats import bits_per_weight, known_formats
from tests.conftest import call_err, call_ok

pytestmark = pytest.mark.anyio
L8 = "Llama-3.1-8B"


@pytest.mark.parametrize(
    ("tool", "args", "expected"),
    [
        ("estimate_training", {"gpu": "H100-SXM", "dataset_samples": 10**306}, "dataset_samples"),
        ("estimate_training", {"gpu": "H100-SXM", "more": {"dataset_tokens": 10**400}}, "dataset_tokens"),
        ("estimate_training", {"gpu": "H100-SXM", "max_steps": 10, "more": {"tokens_per_s": 1e-308}}, "tokens_per_s"),
        ("estimate_inference", {"more": {"tokens_per_s": 1e-300}}, "tokens_per_s"),
        ("estimate_inference", {"more": {"tokens_per_s": "inf"}}, "tokens_per_s"),
        ("estimate_inference", {"weight_format": "q" * 100_000}, "weight_format"),
    ],
    ids=["samples", "tokens", "train-speed", "tiny-speed", "inf-speed", "long-format"],
)
async def test_out_of_range_sizes_and_speeds_are_refused_as_input_errors(
    client: Client, tool: str, args: dict[str, object], expected: str
) -> None:
    """They crashed (OverflowError) or came back as an internal 'configuration error' blaming the catalog."""
    text = await call_err(client, tool, model=L8, **args)
    assert "invalid arguments" in text and expected in text and "configuration error" not in text, text[:300]
    assert len(text) < 2000


async def test_a_training_run_that_fits_nowhere_gets_no_time_or_price_and_says_so(client: Client) -> None:
    args = {"method": "full", "num_processes": 8, "dataset_samples": 10_000}
    one = await call_ok(client, "estimate_training", model="Llama-3.1-70B", gpu="H100-SXM", detail=True, **args)
    (r,) = one["results"]
    assert r["micro_batch"] is None and r["wall_hours"] is None and r["costs"] == [], r
    assert any("fits on none of these devices" in w for w in one["warnings"]), one["warnings"]
    ranked = await call_ok(client, "estimate_training", model="Llama-3.1-70B", gpu="all", **args)
    assert all(row[1] is not None or row[5] is None for row in ranked["ranking"]["rows"])  # no price unless it fits


async def test_a_quoted_speed_at_or_below_a_partial_offload_is_not_called_impossible(client: Client) -> None:
    slow = await call_ok(client, "estimate_inference", model=L8, gpu="T4", more={"tokens_per_s": 0.01})
    assert "only possible with part of the model in host memory" in slow["warnings"][0], slow["warnings"]
    fast = await call_ok(client, "estimate_inference", model=L8, gpu="T4", more={"tokens_per_s": 5000})
    assert "is impossible" in fast["warnings"][0]


async def test_a_quoted_speed_over_a_ranking_is_one_line_not_one_per_gpu(client: Client) -> None:
    out = await call_ok(client, "estimate_inference", model=L8, gpu="all", more={"tokens_per_s": 1000})
    quoted = [w for w in out["warnings"] if "1000 tok/s" in w]
    assert len(quoted) == 1 and "above the bandwidth ceiling on" in quoted[0] and "detail=true" in quoted[0], quoted
    detail = await call_ok(client, "estimate_inference", model=L8, gpu="all", detail=True, more={"tokens_per_s": 1000})
    assert len([w for w in detail["warnings"] if "1000 tok/s" in w]) > 10  # each GPU's reason on request


async def test_the_cpu_is_planned_without_gpu_layers_and_a_slow_prefill_is_not_zero(client: Client) -> None:
    out = await call_ok(client, "estimate_inference", model="Llama-3.1-70B", gpu="cpu", detail=True)
    (r,) = out["results"]
    assert r["n_gpu_layers"] in (0, r["total_layers"]) and r["offload"] in ("none", "full"), r
    assert r["prefill_tokens_per_s"] > 0


def test_made_up_weight_formats_are_refused_and_only_costed_names_are_offered() -> None:
    for real in ("q4_k_m", "iq3_m", "mxfp4_moe", "q2_k_s", "nf4_dq", "Q5_K_S", "q4_k_l", "Q6_K_L"):
        assert bits_per_weight(real) > 0
    for fake in ("q4_k_xxs", "f16_m", "bf16_xxs", "q8_0_l", "q6_k_moe", "i8", "q8_k"):
        with pytest.raises(UnknownNameError) as bad:
            bits_per_weight(fake)
        offered = str(bad.value)
        assert not any(f" {n}," in offered or f" {n}?" in offered for n in ("i8", "i16", "f64", "q8_1", "q8_k"))
    assert all(bits_per_weight(n) > 0 for n in known_formats())  # every name offered is costed


async def test_a_blank_gpu_filter_is_refused_and_a_filter_matches_id_or_name(client: Client) -> None:
    assert "blank" in await call_err(client, "estimate_gpus", name_contains="  ")
    found = await call_ok(client, "estimate_gpus", name_contains=" H100 ")
    rows = found["table"]["rows"]
    assert rows and all("H100" in row[0] for row in rows), rows


async def test_training_precision_conflicts_are_refused_and_bf16_on_a_gpu_without_it_is_warned(client: Client) -> None:
    text = await call_err(client, "estimate_training", model=L8, gpu="A10", more={"bf16": True, "fp16": True})
    assert "bf16=true and fp16=true" in text
    t4 = await call_ok(client, "estimate_training", model=L8, gpu="T4", more={"bf16": True})
    assert any("T4 has no bf16" in w for w in t4["warnings"]), t4["warnings"]


async def test_calibrations_are_listed_newest_first_up_to_a_limit(client: Client) -> None:
    for tps in (20, 25, 30):
        await call_ok(client, "estimate_record_measurement", kind="inference", gpu="A10", model=L8, tokens_per_s=tps)
    two = await call_ok(client, "estimate_calibrations", limit=2)
    assert [m["tokens_per_s"] for m in two["measurements"]] == [30, 25] and two["more"] is True
    assert (await call_ok(client, "estimate_calibrations"))["more"] is False
    text = (await client.read_resource("estimate://gpus")).contents[0]
    raw = getattr(text, "text", "")
    assert "\n" not in raw and json.loads(raw)["gpus"]  # compact, as tool results are


async def test_a_training_measurement_below_its_own_static_memory_or_with_no_targets_is_refused(client: Client) -> None:
    """Both were stored: the first without an activation factor, as if measured; the second where
    estimate_training refuses an empty target list."""
    run = {"kind": "training", "gpu": "H100-SXM", "model": L8, "tokens_per_s": 3000}
    low = await call_err(client, "estimate_record_measurement", **run, peak_memory_gb=5.0)
    assert "below the" in low and "before any activation" in low and "Nothing was stored" in low, low
    empty = await call_err(client, "estimate_record_measurement", **run, more={"lora_target_modules": []})
    assert "lora_target_modules is an empty list" in empty
    assert (await call_ok(client, "estimate_calibrations", kind="training"))["measurements"] == []
    # a job's own figure (torch.cuda.max_memory_allocated holds no runtime overhead) is still stored: the H100 run
    # in bench/results/gpu_h100/gpu_finetune.jsonl
    job = {"gpu": "H100-SXM", "model": "SmolLM2-135M", "tokens_per_s": 3504.45, "peak_memory_gb": 0.5414}
    targets = {"lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "max_length": 512}
    per_batch = {"per_device_train_batch_size": 48}
    await call_ok(client, "estimate_record_measurement", kind="training", **job, more={**targets, **per_batch})
