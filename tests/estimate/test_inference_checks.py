"""Quoted decode speeds are checked against physics; GGUF formats are costed at their real size."""

from __future__ import annotations

import pytest
from mcp import Client

from gpubox.errors import UnknownNameError
from gpubox.tools.estimate import formats
from gpubox.tools.estimate.catalog import package_catalog
from gpubox.tools.estimate.inference import weight_plan
from tests.conftest import call_ok, requires_hf

pytestmark = pytest.mark.anyio


# A vendor-style claim for Qwen2.5-Coder FP16 on an A100 40GB: 120-160 tok/s for 7B, 80-110 for 14B, 40-60 for 32B.
async def test_a_7b_fp16_claim_above_the_bandwidth_ceiling_is_impossible(client: Client) -> None:
    est = await call_ok(
        client, "estimate_inference", model="Qwen2.5-Coder-7B", weight_format="f16", gpu="A100 40GB", tokens_per_s=140
    )
    r = est["results"][0]
    assert 90 <= r["decode_tokens_per_s_ceiling"] <= 105  # 1555 GB/s over ~15.2 GB of weights + KV
    assert r["quoted_verdict"] == "above_bandwidth_ceiling"
    assert any("impossible" in w and "A100-40GB-SXM" in w for w in est["warnings"])


async def test_a_14b_fp16_claim_above_the_bandwidth_ceiling_is_impossible(client: Client) -> None:
    est = await call_ok(
        client, "estimate_inference", model="Qwen2.5-Coder-14B", weight_format="f16", gpu="A100 40GB", tokens_per_s=95
    )
    r = est["results"][0]
    assert 45 <= r["decode_tokens_per_s_ceiling"] <= 55 and r["fits"]
    assert r["quoted_verdict"] == "above_bandwidth_ceiling" and est["warnings"]


async def test_a_32b_fp16_claim_on_40_gb_is_impossible_because_it_does_not_fit(client: Client) -> None:
    est = await call_ok(
        client, "estimate_inference", model="Qwen2.5-Coder-32B", weight_format="f16", gpu="A100 40GB", tokens_per_s=50
    )
    r = est["results"][0]
    assert not r["fits"] and r["memory"]["weights_gb"] > 60
    assert r["quoted_verdict"] == "does_not_fit"
    assert any("does not fit" in w for w in est["warnings"])


async def test_a_plausible_claim_is_accepted_and_prices_the_tokens(client: Client) -> None:
    est = await call_ok(
        client, "estimate_inference", model="Qwen2.5-Coder-7B", weight_format="f16", gpu="A100 40GB", tokens_per_s=60
    )
    r = est["results"][0]
    assert r["quoted_verdict"] == "plausible" and not est["warnings"]
    cost = r["costs_per_million_tokens"][0]
    assert cost["usd"] == pytest.approx(cost["usd_per_hour"] / (60 * 3600) * 1e6, rel=1e-3)


# --- weight formats from the gguf package ----------------------------------------------------------------
async def test_an_iq2_file_is_costed_at_about_two_bits_not_sixteen(client: Client) -> None:
    iq2 = await call_ok(client, "estimate_inference", model="Llama-3-8B", weight_format="iq2_xxs", gpu="RTX-4090")
    bf16 = await call_ok(client, "estimate_inference", model="Llama-3-8B", weight_format="bf16", gpu="RTX-4090")
    ratio = iq2["results"][0]["memory"]["weights_gb"] / bf16["results"][0]["memory"]["weights_gb"]
    assert ratio == pytest.approx(2.0625 / 16, rel=0.01)
    assert iq2["results"][0]["decode_tokens_per_s_ceiling"] > 5 * bf16["results"][0]["decode_tokens_per_s_ceiling"]


@requires_hf
def test_every_gguf_file_type_has_a_size() -> None:
    import gguf

    for ftype in gguf.LlamaFileType:
        if ftype.name == "GUESSED":
            continue
        name = formats.file_type_name(int(ftype))
        assert name is not None
        assert 1 <= formats.bits_per_weight(name) <= 32, name
    assert formats.file_type_name(19) == "iq2_xxs" and formats.file_type_name(15) == "q4_k_m"


@requires_hf
def test_the_core_fallback_table_agrees_with_the_gguf_package(monkeypatch: pytest.MonkeyPatch) -> None:
    import gguf

    real = {t.name.lower(): size * 8 / block for t, (block, size) in gguf.GGML_QUANT_SIZES.items()}
    for name, bits in formats.FALLBACK_BLOCK_BITS.items():
        base = name.removesuffix("_s") if name == "q2_k_s" else name
        if base in real:
            assert bits == pytest.approx(real[base]), name
    formats.gguf_block_bits.cache_clear()
    monkeypatch.setattr(formats, "_gguf", lambda: None)
    try:
        assert formats.bits_per_weight("iq2_xxs") == pytest.approx(2.0625)
        assert formats.bits_per_weight("q4_k_m") == pytest.approx(4.89)
        with pytest.raises(UnknownNameError):
            formats.bits_per_weight("q9_k")
    finally:
        formats.gguf_block_bits.cache_clear()


def test_an_unknown_format_lists_the_real_ones() -> None:
    with pytest.raises(UnknownNameError, match="iq4_xs"):
        weight_plan(package_catalog().model("Llama-3-8B"), "iq4_xx")
