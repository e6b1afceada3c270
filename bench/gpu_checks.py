"""Checks that need a real NVIDIA GPU, in one call; writes bench/results/gpu_<gpu>.md (or $OUT/ when set).

    python bench/gpu_checks.py

Measures what the estimator assumes: dense BF16 matmul TFLOPS and device memory bandwidth (torch), reads NVML
through gpu_status, and records the figures as calibration inputs. Then runs the bench_* tools through MCP:
bench_attention over the FFPA head-dimension sweep (B=1, H=48, N=8192, D=64, 128, 320…1024 step 64, fp16) and
bench_device, writing bench_attention_<gpu>.md / bench_device_<gpu>.md with the plots. Skips what is not installed.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from gpubox.tools.gpu.nvml import gpu_status

HERE = Path(__file__).resolve().parent
SWEEP = [64, 128, *range(320, 1025, 64)]
# the tools' own time limits (seconds): a lent box is held for minutes, so bench/gpu_checks.sh may shorten them
ATTENTION_S = int(os.environ.get("GPU_CHECKS_ATTENTION_S", "420"))
DEVICE_S = int(os.environ.get("GPU_CHECKS_DEVICE_S", "120"))
# FFPA L1 vs SDPA efficient attention on a GH200, fp16, B=1 H=48 N=8192 (the report quoted in issue #11)
GH200_REFERENCE = "SDPA EA 92–110 TFLOPS; FFPA (fp16 acc) 180–215 TFLOPS; FFPA (fp32 acc) 150–205 TFLOPS"


def torch_figures() -> dict[str, float]:
    import torch

    if not torch.cuda.is_available():
        return {}
    dev = torch.device("cuda")
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    reps = 20
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    tflops = 2 * n**3 * reps / (time.perf_counter() - t) / 1e12
    x = torch.empty(4 * 1024**3 // 2, device=dev, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    bw = 2 * x.numel() * 2 * 10 / (time.perf_counter() - t) / 1e9  # read + write
    return {"bf16_matmul_tflops_8192": round(tflops, 1), "device_copy_gbs": round(bw, 1)}


async def bench_tools(state_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The seed sweep and bench_device through the MCP tools, as a client would call them."""
    from mcp import Client

    from gpubox.app import build_server, state_of
    from gpubox.settings import Settings

    server = build_server(Settings.load(state_dir=state_dir))
    try:
        async with Client(server) as client:
            args = {"batch": 1, "heads": 48, "seq_len": 8192, "head_dim": SWEEP, "dtype": "fp16", "warmup": 3}
            att = await client.call_tool("bench_attention", {**args, "iterations": 10, "time_limit_s": ATTENTION_S})
            dev = await client.call_tool("bench_device", {"time_limit_s": DEVICE_S})
    finally:
        state_of(server).close()
    out = []
    for result in (att, dev):
        text = str(result.content[0]) if result.content else ""
        out.append(result.structured_content or {"status": "error", "message": text})
    return out[0], out[1]


def attention_markdown(data: dict[str, Any], name: str) -> str:
    lines = [f"# bench_attention on {name} ({time.strftime('%Y-%m-%d')})", ""]
    if data.get("status") == "error":
        return "\n".join([*lines, f"Tool error: {data.get('message')}", ""])
    lines += [
        f"run {data['run_id']}, status {data['status']}{': ' + data['message'] if data.get('message') else ''}; "
        f"{data['dtype']}, B={data['batch']} H={data['heads']}, baseline {data['baseline']}; {data['timing']}; "
        f"versions {json.dumps(data['versions'])}",
        "",
        f"Reference (GH200, same shapes): {GH200_REFERENCE}.",
        "",
        "| D | N | backend | ms (median) | spread % | TFLOPS | speedup | max abs err | ok | peak MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        lines.append(
            f"| {r['head_dim']} | {r['seq_len']} | {r['backend']}{' **winner**' if r['winner'] else ''} | "
            f"{r['time_ms']:.3f} | {r['spread_pct']:.1f} | {r['tflops']:.1f} | {r['speedup'] or '-'} | "
            f"{r['max_abs_error']:.2g} | {'yes' if r['within_tolerance'] else 'FLAGGED'} | "
            f"{r['peak_memory_mb'] or '-'} |"
        )
    lines += ["", "Skipped:", ""]
    lines += [f"- {s['backend']} (D={s['head_dim']}, N={s['seq_len']}): {s['reason']}" for s in data["skipped"]]
    lines += ["", *[f"![{p['name']}]({name}_{p['name']}.png)" for p in data["plots"]], ""]
    return "\n".join(lines)


def device_markdown(data: dict[str, Any], name: str) -> str:
    lines = [f"# bench_device on {name} ({time.strftime('%Y-%m-%d')})", ""]
    if data.get("status") == "error":
        return "\n".join([*lines, f"Tool error: {data.get('message')}", ""])
    lines += [
        f"run {data['run_id']}, status {data['status']}, catalog entry {data['catalog_id']}; {data['calibration']}",
        "",
        "| figure | measured | datasheet | share of datasheet | how |",
        "|---|---|---|---|---|",
    ]
    for f in data["figures"]:
        share = f"{f['ratio']:.0%}" if f["ratio"] else "-"
        lines.append(
            f"| {f['name']} | {f['measured']} {f['unit']} | {f['datasheet'] or '-'} | {share} | {f['detail']} |"
        )
    return "\n".join([*lines, ""])


def main() -> None:
    status = gpu_status()
    figures = torch_figures() if status.available else {}
    name = status.gpus[0].name.replace(" ", "_") if status.gpus else "none"
    text = "\n".join(
        [
            f"# GPU checks on {name} ({time.strftime('%Y-%m-%d')})",
            "",
            "```json",
            json.dumps({"gpu_status": status.model_dump(), "measured": figures}, indent=2),
            "```",
            "",
        ]
    )
    print(text)
    out = Path(os.environ.get("OUT") or HERE / "results")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"gpu_{name}.md").write_text(text)
    if not status.available:
        return
    state_dir = Path(tempfile.mkdtemp(prefix="gpubox-bench-"))
    att, dev = asyncio.run(bench_tools(state_dir))
    for data, kind, render in ((att, "attention", attention_markdown), (dev, "device", device_markdown)):
        report = render(data, name)
        print(report)
        (out / f"bench_{kind}_{name}.md").write_text(report)
        run_dir = state_dir / "bench" / "runs" / str(data.get("run_id"))
        for png in run_dir.glob("*.png") if run_dir.is_dir() else []:
            shutil.copy(png, out / f"{name}_{png.name}")


if __name__ == "__main__":
    main()
