"""bench_attention's figures vs a bare script timing the same kernels, interleaved in the same run.

    .venv/bin/python bench/bench_tools_vs_script.py [--device cpu|cuda] [--rounds 3] [--out bench/results]

Each round runs the tool (through an in-process MCP client; the tool starts its worker process) and then the
bare script (a fresh interpreter, like the worker), so both sides see the same machine state. The table compares
the medians over rounds per (backend, D); the goal is a tool/script ratio within 5%.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.settings import Settings

HERE = Path(__file__).resolve().parent
SHAPES = {
    "cpu": {"batch": 1, "heads": 4, "seq_len": 512, "head_dim": [64, 128], "dtype": "fp32"},
    "cuda": {"batch": 1, "heads": 48, "seq_len": 8192, "head_dim": [128, 512], "dtype": "fp16"},
}
BACKENDS = {"cpu": ["sdpa_math", "sdpa_flash"], "cuda": ["sdpa_efficient", "sdpa_flash", "sdpa_cudnn"]}

# What a user would write: random q/k/v, the backend forced with sdpa_kernel, a warm-up, then a timed loop.
BARE = r"""
import json, statistics, sys, time
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
cfg = json.loads(sys.argv[1])
dev = cfg["device"]
dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[cfg["dtype"]]
kinds = {"sdpa_math": SDPBackend.MATH, "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
         "sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}
out = {}
for d in cfg["head_dim"]:
    q, k, v = (torch.randn(cfg["batch"], cfg["heads"], cfg["seq_len"], d, device=dev, dtype=dtype) for _ in range(3))
    for name in cfg["backends"]:
        def call():
            with torch.no_grad(), sdpa_kernel(kinds[name]):
                return F.scaled_dot_product_attention(q, k, v)
        try:
            for _ in range(cfg["warmup"]):
                call()
        except RuntimeError:
            continue
        if dev == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(cfg["iterations"]):
                call()
            end.record()
            torch.cuda.synchronize()
            ms = best = start.elapsed_time(end) / cfg["iterations"]
        else:
            times = []
            for _ in range(cfg["iterations"]):
                t0 = time.perf_counter()
                call()
                times.append((time.perf_counter() - t0) * 1e3)
            ms, best = statistics.median(times), min(times)
        out[f"{name}/{d}"] = [ms, best]
print(json.dumps(out))
"""


async def tool_round(client: Client, device: str, warmup: int, iterations: int) -> dict[str, list[float]]:
    args = {**SHAPES[device], "device": device, "backends": BACKENDS[device], "warmup": warmup}
    result = await client.call_tool("bench_attention", {**args, "iterations": iterations, "baseline": "auto"})
    data = result.structured_content
    if result.is_error or not data or data["status"] != "complete":
        raise SystemExit(f"bench_attention failed: {result.content}")
    return {f"{r['backend']}/{r['head_dim']}": [r["time_ms"], r["time_ms_min"]] for r in data["rows"]}


def script_round(device: str, warmup: int, iterations: int) -> dict[str, list[float]]:
    cfg = {**SHAPES[device], "device": device, "backends": BACKENDS[device], "warmup": warmup, "iterations": iterations}
    proc = subprocess.run([sys.executable, "-c", BARE, json.dumps(cfg)], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


async def main_async(device: str, rounds: int, warmup: int, iterations: int) -> tuple[list[dict], list[dict]]:
    state = Path(tempfile.mkdtemp(prefix="gpubox-bench-vs-script-"))
    server = build_server(Settings.load(state_dir=state))
    tool, script = [], []
    try:
        async with Client(server) as client:
            for i in range(rounds):
                tool.append(await tool_round(client, device, warmup, iterations))
                script.append(await anyio.to_thread.run_sync(script_round, device, warmup, iterations))
                print(f"round {i + 1}/{rounds}: tool {tool[-1]} script {script[-1]}", file=sys.stderr)
    finally:
        state_of(server).close()
    return tool, script


def report(device: str, rounds: int, warmup: int, iterations: int, tool: list[dict], script: list[dict]) -> str:
    shape = SHAPES[device]
    keys = sorted(set(tool[0]) & set(script[0]), key=lambda k: (int(k.split("/")[1]), k))
    lines = [
        f"# bench_attention vs a bare script ({device}, {os.cpu_count()} CPU threads visible, "
        f"{time.strftime('%Y-%m-%d')})",
        "",
        f"B={shape['batch']} H={shape['heads']} N={shape['seq_len']} {shape['dtype']}, non-causal forward; "
        f"{rounds} interleaved rounds (tool, then script, each in a fresh process); warmup {warmup}, "
        f"{iterations} timed calls per backend and shape. Tool: median per call"
        + (" (CUDA events, L2 flushed before each call)" if device == "cuda" else " (perf_counter)")
        + "; script: "
        + ("CUDA events around the whole loop / calls" if device == "cuda" else "median per call (perf_counter)")
        + ". Cells: median over rounds of each side's median call, and the fastest call of all rounds.",
        "",
        "| backend | D | tool median ms | script median ms | ratio | tool best ms | script best ms | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    worst = {"median": 0.0, "best": 0.0}
    for key in keys:
        t = statistics.median(r[key][0] for r in tool)
        s = statistics.median(r[key][0] for r in script)
        tb, sb = min(r[key][1] for r in tool), min(r[key][1] for r in script)
        worst["median"] = max(worst["median"], abs(t / s - 1))
        worst["best"] = max(worst["best"], abs(tb / sb - 1))
        backend, d = key.split("/")
        lines.append(f"| {backend} | {d} | {t:.3f} | {s:.3f} | {t / s:.3f} | {tb:.3f} | {sb:.3f} | {tb / sb:.3f} |")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines += [
        "",
        f"Largest deviation of the medians: {worst['median']:.1%} (goal: within 5%); of the best calls: "
        f"{worst['best']:.1%}. Load average at the end (1/5/15 min): {load} on {os.cpu_count()} cores. Where the "
        "load average is far above the core count, single calls are preempted at random, so the best calls and "
        "single rounds scatter; repeat on an idle box (or a GPU) for a tighter comparison.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=15)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or HERE / "results"))
    args = ap.parse_args()
    tool, script = anyio.run(main_async, args.device, args.rounds, args.warmup, args.iterations)
    text = report(args.device, args.rounds, args.warmup, args.iterations, tool, script)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"bench_{args.device}.md").write_text(text)


if __name__ == "__main__":
    main()
