"""How fast can vLLM serve SmolLM2-135M on this box at all? The engine alone (no gpubox, no MCP), started with each
set of flags below in turn, driven over its OpenAI API by N concurrent clients (each sends 2 requests back to back,
64 tokens, greedy, EOS honoured), 2 rounds per level. This is the ceiling for serve_bench.py's engine series: it
says whether a throughput goal is out of reach of any engine configuration here, or only of gpubox's plan.

    .venv/bin/python bench/serve_engine_variants.py [--model HF_DIR] [--out bench/results/serve_engine_variants.md]

The model is the HF copy of the bundled SmolLM2 that the fine-tuning tests cache (as serve_bench.py uses).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import glob
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from serve_bench import PROMPTS  # the same prompts as the MCP benchmark (bench/ is on sys.path)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ENGINE = ROOT / ".venv-vllm" / "bin" / "python"
PORT = 8711
# (label, extra flags, extra environment)
VARIANTS: list[tuple[str, list[str], dict[str, str]]] = [
    ("bf16, enforce_eager (serve_bench.py until 2026-11-25)", ["--dtype", "bfloat16", "--enforce-eager"], {}),
    ("fp32, enforce_eager", ["--dtype", "float32", "--enforce-eager"], {}),
    ("bf16, compiled (gpubox's plan)", ["--dtype", "bfloat16"], {}),
    ("bf16, compiled, async scheduling", ["--dtype", "bfloat16", "--async-scheduling"], {}),
    ("bf16, compiled, OMP threads on both cores", ["--dtype", "bfloat16"], {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}),
]
LEVELS = (1, 8, 16)


async def one(c: httpx.AsyncClient, i: int) -> int:
    body = {"model": "m", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 64, "temperature": 0}
    r = await c.post(f"http://127.0.0.1:{PORT}/v1/completions", json=body)
    return int(r.json()["usage"]["completion_tokens"])


async def drive(proc: subprocess.Popen[bytes]) -> tuple[float, dict[int, list[float]]]:
    t0 = time.perf_counter()
    out: dict[int, list[float]] = {}
    async with httpx.AsyncClient(timeout=600) as c:
        while True:
            try:
                if (await c.get(f"http://127.0.0.1:{PORT}/health")).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError("the engine exited during start-up")
            await asyncio.sleep(1)
        start = time.perf_counter() - t0
        await one(c, 0)  # warm-up
        for n in LEVELS:
            for _ in range(2):
                t = time.perf_counter()

                async def client(k: int) -> int:
                    return await one(c, k) + await one(c, k + 1)

                tokens = sum(await asyncio.gather(*[client(k) for k in range(n)]))
                out.setdefault(n, []).append(tokens / (time.perf_counter() - t))
    return start, out


def run(model: str, flags: list[str], env: dict[str, str], log: Path) -> tuple[float, dict[int, list[float]]]:
    cmd = [str(ENGINE), "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", "m"]
    cmd += ["--max-model-len", "2048", "--port", str(PORT), *flags]
    full_env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1"} | env
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, env=full_env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        return asyncio.run(drive(proc))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cached = glob.glob(str(Path(tempfile.gettempdir()) / "gpubox-finetune-cache" / "*" / "smollm2-135m-instruct-hf"))
    ap.add_argument("--model", default=cached[0] if cached else None)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "serve_engine_variants.md")
    args = ap.parse_args()
    if not args.model:
        raise SystemExit("no HF copy of SmolLM2 cached: run the fine-tuning tests once, or pass --model")
    started, load = dt.datetime.now(dt.UTC), os.getloadavg()[0]
    rows = []
    for label, flags, env in VARIANTS:
        start, tps = run(args.model, flags, env, Path(tempfile.gettempdir()) / "serve_engine_variants.log")
        cells = [f"{max(v):.0f} ({', '.join(f'{x:.0f}' for x in v)})" for v in tps.values()]
        rows.append(f"| {label} | {start:.0f} | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
    head = "| engine flags | start-up s | " + " | ".join(f"{n} clients tok/s (rounds)" for n in LEVELS) + " |"
    text = (
        f"# vLLM alone on this box: SmolLM2-135M, flags side by side\n\n"
        f"Run {started:%Y-%m-%d %H:%M} UTC, `.venv/bin/python bench/serve_engine_variants.py`; load average before "
        f"{load:.1f}. Best round shown, both rounds in brackets.\n\n"
        + head
        + "\n|"
        + "---|" * (2 + len(LEVELS))
        + "\n"
        + "\n".join(rows)
        + "\n"
    )
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
