"""The same tools on a real NVIDIA GPU (skipped without one): SDPA backends, FFPA where installed, bench_device."""

from __future__ import annotations

import pytest
from mcp import Client

from tests.conftest import call_ok

pytestmark = [pytest.mark.anyio, pytest.mark.gpu]


async def test_gpu_sweep_times_sdpa_backends_with_cuda_events_and_skips_flash_above_256(bench_client: Client) -> None:
    args = {"heads": 8, "seq_len": 2048, "head_dim": [128, 512], "warmup": 2, "iterations": 5}
    data = await call_ok(bench_client, "bench_attention", **args)
    assert data["status"] == "complete" and data["device"] == "cuda" and data["dtype"] == "float16"
    assert data["baseline"] == "sdpa_efficient" and "CUDA events" in data["timing"]
    rows = {(r["backend"], r["head_dim"]): r for r in data["rows"]}
    for d in (128, 512):
        base = rows[("sdpa_efficient", d)]
        assert base["within_tolerance"] and base["speedup"] == 1.0 and base["peak_memory_mb"] > 0
    assert ("sdpa_flash", 128) in rows
    flash_512 = [s for s in data["skipped"] if s["backend"] == "sdpa_flash" and s["head_dim"] == 512]
    assert flash_512 and flash_512[0]["reason"]
    ffpa = [r for r in data["rows"] if r["backend"] == "ffpa"]
    if ffpa:  # ffpa-attn installed: it runs D=512 and agrees with the reference
        assert [r["head_dim"] for r in ffpa] == [512] and ffpa[0]["within_tolerance"]
    else:
        assert any(s["backend"] == "ffpa" for s in data["skipped"])
    assert all(w["backend"] for w in data["winners"])


async def test_gpu_device_bandwidth_and_bf16_tflops_are_a_plausible_share_of_the_datasheet(
    bench_client: Client,
) -> None:
    data = await call_ok(bench_client, "bench_device", iterations=5)
    assert data["status"] == "complete" and data["device"] == "cuda"
    figures = {f["name"]: f for f in data["figures"]}
    assert figures["memory_copy"]["measured"] > 100 and figures["matmul_bf16"]["measured"] > 5
    assert figures["h2d_pinned"]["measured"] > 1
    if figures["memory_copy"]["ratio"] is not None:
        assert 0.2 < figures["memory_copy"]["ratio"] < 1.2
    if figures["matmul_bf16"]["ratio"] is not None:
        assert 0.2 < figures["matmul_bf16"]["ratio"] < 1.2
    assert data["calibration"].startswith("stored")
