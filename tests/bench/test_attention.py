"""bench_attention through the MCP tools on the CPU: real torch kernels in the real worker process."""

from __future__ import annotations

import base64
import io
import json
import mmap
import subprocess
import sys
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.types import BlobResourceContents, ImageContent, TextResourceContents

from gpubox.tools.bench.results import rank, winners
from tests.bench.conftest import PNG, SMALL, bench_workers
from tests.conftest import call_err, call_ok, call_result, wait_until

pytestmark = pytest.mark.anyio


async def test_cpu_backends_match_the_math_reference_and_a_winner_is_named_per_shape(bench_client: Client) -> None:
    data = await call_ok(bench_client, "bench_attention", **SMALL)
    assert data["status"] == "complete" and data["device"] == "cpu" and data["dtype"] == "float32"
    assert data["baseline"] == "sdpa_math"
    ran = {(r["backend"], r["head_dim"], r["seq_len"]) for r in data["rows"]}
    # PyTorch's CPU kernels: the math reference implementation and the fused (flash) one
    assert ran == {(b, d, 64) for b in ("sdpa_math", "sdpa_flash") for d in (16, 32)}
    for r in data["rows"]:
        assert r["within_tolerance"] and r["max_abs_error"] <= data["tolerance"] == 2e-4
        assert r["time_ms"] > 0 and r["tflops"] > 0 and r["time_ms_min"] <= r["time_ms"] <= r["time_ms_max"]
        expected = 4 * 1 * 2 * 64 * 64 * r["head_dim"] / (r["time_ms"] * 1e-3) / 1e12
        assert r["tflops"] == pytest.approx(expected, rel=2e-3)
    for w in data["winners"]:
        shape = [r for r in data["rows"] if (r["head_dim"], r["seq_len"]) == (w["head_dim"], w["seq_len"])]
        assert w["backend"] == max(shape, key=lambda r: r["tflops"])["backend"]
    math_rows = [r for r in data["rows"] if r["backend"] == "sdpa_math"]
    assert all(r["speedup"] == 1.0 for r in math_rows)
    assert data["peak_memory_mb"] > 0 and data["versions"]["torch"]


async def test_backends_this_machine_lacks_are_skipped_with_the_reason_they_gave(bench_client: Client) -> None:
    data = await call_ok(bench_client, "bench_attention", **SMALL)
    reasons = {s["backend"]: s["reason"] for s in data["skipped"]}
    assert set(reasons) == {"sdpa_efficient", "sdpa_cudnn", "ffpa", "flash_attn"}
    assert "CUDA only" in reasons["sdpa_efficient"] and "No viable backend" in reasons["sdpa_efficient"]
    assert "CUDA kernels only" in reasons["ffpa"]
    assert all(s["head_dim"] is None for s in data["skipped"])  # missing everywhere: one entry, not one per shape


async def test_only_unavailable_backends_gives_skips_and_a_note_not_a_crash(bench_client: Client) -> None:
    args = {**SMALL, "backends": ["sdpa_efficient", "ffpa"], "baseline": "sdpa_efficient"}
    res = await call_result(bench_client, "bench_attention", **args)
    data, content = res.structured_content, res.content
    assert data["status"] == "complete" and data["rows"] == [] and data["plots"] == []
    assert {s["backend"] for s in data["skipped"]} == {"sdpa_efficient", "ffpa"}
    assert any("did not run" in n for n in data["notes"])
    assert [w["backend"] for w in data["winners"]] == []
    assert not [c for c in content if isinstance(c, ImageContent)]


async def test_plots_come_back_as_png_images_with_one_series_per_backend(bench_client: Client) -> None:
    from PIL import Image

    res = await call_result(bench_client, "bench_attention", **SMALL)
    data, content = res.structured_content, res.content
    images = [c for c in content if isinstance(c, ImageContent)]
    assert [i.mime_type for i in images] == ["image/png", "image/png"]
    for img in images:
        raw = base64.b64decode(img.data)
        assert raw.startswith(PNG)
        with Image.open(io.BytesIO(raw)) as im:
            im.verify()
            assert im.size[0] > 300 and im.size[1] > 200
    plots = {p["name"]: p for p in data["plots"]}
    assert plots["tflops"]["series"] == ["sdpa_flash", "sdpa_math"]
    assert plots["speedup"]["series"] == ["sdpa_flash"]  # the baseline is the y=1 line, not a series
    stored = await bench_client.read_resource(plots["tflops"]["uri"])
    blob = stored.contents[0]
    assert isinstance(blob, BlobResourceContents) and blob.mime_type == "image/png"
    assert base64.b64decode(blob.blob) == base64.b64decode(images[0].data)


async def test_the_raw_table_is_kept_as_json_and_csv_resources(bench_client: Client) -> None:
    data = await call_ok(bench_client, "bench_attention", **SMALL)
    as_json = (await bench_client.read_resource(data["table_json"])).contents[0]
    as_csv = (await bench_client.read_resource(data["table_csv"])).contents[0]
    assert isinstance(as_json, TextResourceContents) and isinstance(as_csv, TextResourceContents)
    rows = json.loads(as_json.text)
    assert [(r["backend"], r["head_dim"]) for r in rows] == [(r["backend"], r["head_dim"]) for r in data["rows"]]
    lines = as_csv.text.strip().splitlines()
    assert lines[0].startswith("backend,head_dim,seq_len,time_ms") and len(lines) == 1 + len(rows)


async def test_a_worker_over_its_time_limit_is_killed_and_reported(bench_client: Client) -> None:
    # minutes of work on two cores; the one-second limit expires while torch is still importing or computing
    args = {**SMALL, "seq_len": 4096, "head_dim": 512, "heads": 8, "iterations": 1000, "time_limit_s": 1}
    data = await call_ok(bench_client, "bench_attention", **args)
    assert data["status"] == "timed_out"
    assert "time limit of 1 s" in data["message"] and "killed" in data["message"]
    assert bench_workers() == []
    listed = await call_ok(bench_client, "bench_list")  # the server is still answering
    assert listed["runs"][0]["run_id"] == data["run_id"] and listed["runs"][0]["status"] == "timed_out"


async def test_bad_shapes_are_refused_with_a_clear_message(bench_client: Client) -> None:
    assert "at least 1 item" in await call_err(bench_client, "bench_attention", head_dim=[], device="cpu")
    assert "greater than or equal to 1" in await call_err(bench_client, "bench_attention", head_dim=0, device="cpu")


async def test_a_long_list_of_bad_values_is_refused_by_its_length(bench_client: Client) -> None:
    # 20,000 out-of-range values were checked (and each error logged) one by one, holding the event loop ~10 s
    text = await call_err(bench_client, "bench_attention", head_dim=list(range(5000, 25000)), device="cpu")
    assert "at most 64 items" in text and text.count("less than or equal to 4096") <= 1
    text = await call_err(bench_client, "bench_attention", seq_len=[64] * 17, device="cpu")
    assert "at most 16 items" in text


def test_a_cpu_worker_reports_its_own_peak_memory_not_the_one_it_inherited() -> None:
    """Linux carries ru_maxrss over exec: a worker started by a large server would report the server's size."""
    ballast = bytearray(768 * 2**20)
    ballast[:: mmap.PAGESIZE] = b"\x01" * len(ballast[:: mmap.PAGESIZE])  # touched: resident in this process
    code = "from gpubox.tools.bench.attention import peak_memory_mb; print(peak_memory_mb(False))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    del ballast
    assert 1 < float(out.stdout) < 384  # a bare interpreter, far below the 768 MiB this process holds


def test_a_backend_over_tolerance_is_flagged_and_never_wins() -> None:
    rows: list[dict[str, Any]] = [
        {"backend": "sdpa_efficient", "head_dim": 64, "seq_len": 512, "time_ms": 2.0, "tflops": 10.0,
         "within_tolerance": True},
        {"backend": "fast_but_wrong", "head_dim": 64, "seq_len": 512, "time_ms": 0.5, "tflops": 40.0,
         "within_tolerance": False},
        {"backend": "sdpa_flash", "head_dim": 64, "seq_len": 512, "time_ms": 1.0, "tflops": 20.0,
         "within_tolerance": True},
    ]  # fmt: skip
    rank(rows, "sdpa_efficient")
    assert [r["speedup"] for r in rows] == [1.0, None, 2.0]
    assert [r["winner"] for r in rows] == [False, False, True]
    assert winners(rows)[0].backend == "sdpa_flash"


async def test_causal_forward_and_backward_count_half_then_two_and_a_half_times_the_flops(bench_client: Client) -> None:
    args = {**SMALL, "head_dim": 16, "causal": True, "backward": True, "backends": ["sdpa_math"]}
    data = await call_ok(bench_client, "bench_attention", **args)
    (row,) = data["rows"]
    assert data["causal"] and data["backward"] and row["within_tolerance"]
    expected = 4 * 1 * 2 * 64 * 64 * 16 / 2 * 2.5 / (row["time_ms"] * 1e-3) / 1e12
    assert row["tflops"] == pytest.approx(expected, rel=2e-3)


async def test_while_a_benchmark_runs_the_server_answers_and_a_second_one_is_refused(bench_client: Client) -> None:
    long_run = {**SMALL, "seq_len": 4096, "head_dim": 512, "heads": 8, "iterations": 1000, "time_limit_s": 120}
    results: list[Any] = []
    async with anyio.create_task_group() as tg:

        async def first() -> None:
            results.append(await bench_client.call_tool("bench_attention", long_run))

        tg.start_soon(first)
        await wait_until(bench_workers, timeout=60)
        await call_ok(bench_client, "bench_list")  # answered while the worker computes
        assert not results
        assert "another benchmark (attention) is running" in await call_err(bench_client, "bench_attention", **SMALL)
        tg.cancel_scope.cancel()  # the client gives up: the server cancels the call and kills the worker
    await wait_until(lambda: not bench_workers(), timeout=30)
    assert results == []
    data = await call_ok(bench_client, "bench_list")
    assert all(r["run_id"] for r in data["runs"])
    data = await call_ok(bench_client, "bench_attention", **{**SMALL, "head_dim": 16})  # the lock was released
    assert data["status"] == "complete"


def test_a_refused_backend_is_explained_by_its_failed_requirement_not_the_headers_around_it() -> None:
    import warnings

    from gpubox.tools.bench.attention import describe

    trig = " (Triggered internally at /pytorch/aten/src/ATen/native/transformers/cuda/sdp_utils.cpp:986.)"
    said = [  # what torch 2.11 warned on an H200 when sdpa_flash was forced at D=1024 (bench/results/gpu_h200/)
        "Memory efficient kernel not used because:" + trig,
        "Memory Efficient attention has been runtime disabled." + trig,
        "Flash attention kernel not used because:" + trig,
        "Flash attention requires q,k,v to have the same last dimension and to be less than or equal to 256. "
        "Got Query.size(-1): 1024, Key.size(-1): 1024, Value.size(-1): 1024 instead." + trig,
        "cuDNN attention has been runtime disabled." + trig,
    ]
    caught = [warnings.WarningMessage(UserWarning(m), UserWarning, "x.py", 1) for m in said]
    text = describe(RuntimeError("No available kernel. Aborting execution."), caught)
    assert text.startswith("Flash attention requires q,k,v to have the same last dimension")
    assert "Triggered internally" not in text and "runtime disabled" not in text
    assert text.endswith("RuntimeError: No available kernel. Aborting execution.")
