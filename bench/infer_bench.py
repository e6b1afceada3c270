"""Decode and prefill tokens/s through the MCP tool vs calling llama-cpp-python directly, same run and settings.

.venv/bin/python bench/infer_bench.py [--model PATH.gguf] [--reps 5] [--max-tokens 128]
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

from gpubox.app import build_server
from gpubox.bundled import smollm2_gguf
from gpubox.settings import Settings

HERE = Path(__file__).resolve().parent
PROMPT = "Write a detailed story about a lighthouse keeper who discovers a message in a bottle. " * 4


def direct(path: Path, reps: int, max_tokens: int, n_ctx: int) -> tuple[list[float], list[float]]:
    import psutil

    from gpubox.tools.inference.llama_import import llama_cpp as import_llama

    llama_cpp = import_llama()  # libstdc++ global first, as gpubox loads it

    threads = psutil.cpu_count(logical=False) or 1  # what gpubox uses by default
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)
    llm.create_completion(PROMPT, max_tokens=4, temperature=0)  # warm-up
    pre, dec = [], []
    for _ in range(reps):
        llama_cpp.llama_perf_context_reset(llm.ctx)
        llm.reset()  # no prompt cache: both sides prefill the whole prompt
        for _chunk in llm.create_completion(
            PROMPT, max_tokens=max_tokens, temperature=0, repeat_penalty=1.1, stream=True
        ):
            pass
        perf = llama_cpp.llama_perf_context(llm.ctx)
        pre.append(perf.n_p_eval / (perf.t_p_eval_ms / 1000))
        dec.append(perf.n_eval / (perf.t_eval_ms / 1000))
    llm.close()
    return pre, dec


def via_mcp(path: Path, reps: int, max_tokens: int, n_ctx: int) -> tuple[list[float], list[float]]:
    state = Path(tempfile.mkdtemp(prefix="gpubox-infer-bench-"))
    models = state / "models"
    models.mkdir()
    os.symlink(path, models / "bench-model.gguf")
    # the link points at the model's own folder: allow it as a root (gpubox refuses links that leave the roots)
    settings = Settings.load(
        state_dir=state, model_dirs=[models], allowed_roots=[path.resolve().parent], infer_context_length=n_ctx
    )
    mcp = build_server(settings)

    async def go() -> tuple[list[float], list[float]]:
        pre, dec = [], []
        async with Client(mcp) as c:
            await c.call_tool("infer_load", {"name": "bench-model", "context_length": n_ctx})
            await c.call_tool("infer_complete", {"model": "bench-model", "prompt": PROMPT, "max_tokens": 4})
            for i in range(reps):
                # a distinct first token defeats llama.cpp's prompt-prefix reuse, like llm.reset() above
                r = await c.call_tool(
                    "infer_complete",
                    {"model": "bench-model", "prompt": f"{i} " + PROMPT, "max_tokens": max_tokens, "temperature": 0},
                )
                out = r.structured_content
                assert out is not None, r.content
                pre.append(out["prefill_tokens_per_s"])
                dec.append(out["decode_tokens_per_s"])
        return pre, dec

    return anyio.run(go)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=smollm2_gguf())
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--part", choices=["direct", "mcp"], help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.part:  # one side per process: OpenMP thread teams must not leak from one side into the other
        fn = direct if ns.part == "direct" else via_mcp
        print(json.dumps(fn(ns.model, ns.reps, ns.max_tokens, ns.ctx)))
        return
    t = time.strftime("%Y-%m-%d")

    def part(name: str) -> tuple[list[float], list[float]]:
        cmd = [
            sys.executable,
            __file__,
            "--part",
            name,
            "--model",
            str(ns.model),
            "--reps",
            str(ns.reps),
            "--max-tokens",
            str(ns.max_tokens),
            "--ctx",
            str(ns.ctx),
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        pre, dec = json.loads(out)
        return pre, dec

    d_pre, d_dec = part("direct")
    m_pre, m_dec = part("mcp")
    med = statistics.median
    lines = [
        f"# Inference through MCP vs direct llama-cpp-python ({ns.model.name}, {os.cpu_count()} CPU cores, {t})",
        "",
        f"{ns.reps} runs each, greedy, {ns.max_tokens} new tokens, n_ctx {ns.ctx}, same llama.cpp settings, each "
        "side in a fresh process.",
        "",
        "| | direct median tok/s | gpubox infer_complete median tok/s | gpubox / direct |",
        "|---|---|---|---|",
        f"| prefill | {med(d_pre):.1f} | {med(m_pre):.1f} | {med(m_pre) / med(d_pre):.3f} |",
        f"| decode | {med(d_dec):.1f} | {med(m_dec):.1f} | {med(m_dec) / med(d_dec):.3f} |",
        "",
        "Goal: >= 0.95 of direct.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    (HERE / "results" / "inference_cpu.md").write_text(text)


if __name__ == "__main__":
    main()
