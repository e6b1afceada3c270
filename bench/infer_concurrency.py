"""Client C's gpu_status latency while client A generates with llama.cpp and client B loads a model with
transformers, all over HTTP against a real `gpubox serve` (three connections, one server process).

.venv/bin/python bench/infer_concurrency.py [--seconds 20] [--out bench/results/inference_concurrency.md]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from gpubox.bundled import smollm2_gguf

GPUBOX = str(Path(sys.executable).parent / "gpubox")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tmp: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    gguf = smollm2_gguf()
    assert gguf is not None, "install gpubox[models]"
    models = tmp / "models"
    models.mkdir()
    shutil.copy(gguf, models / "smollm2-copy.gguf")  # B loads this one, A keeps generating with the bundled one
    token = "bench-" + os.urandom(8).hex()
    (tmp / "token").write_text(token)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUBOX_")}
    env.update(
        GPUBOX_STATE_DIR=str(tmp / "state"),
        GPUBOX_MODEL_DIRS=str(models),
        GPUBOX_ALLOWED_ROOTS=str(tmp),
        HF_HUB_OFFLINE="1",
    )
    cmd = [GPUBOX, "serve", "--transport", "http", "--port", str(port), "--token-file", str(tmp / "token")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=(tmp / "server.log").open("wb"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, f"http://127.0.0.1:{port}/mcp", token
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError((tmp / "server.log").read_text())


async def call(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    r = await client.call_tool(tool, args)
    if r.is_error or r.structured_content is None:
        raise RuntimeError(f"{tool}: {r.content}")
    return r.structured_content


async def scenario(url: str, token: str, seconds: float) -> dict[str, Any]:
    def connect() -> tuple[httpx2.AsyncClient, Client]:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=900))
        return http, Client(streamable_http_client(url, http_client=http))

    (ha, a), (hb, b), (hc, c) = connect(), connect(), connect()
    async with ha, hb, hc, a, b, c:
        await call(a, "infer_load", name="smollm2-135m-instruct", context_length=512)
        idle: list[float] = []
        for _ in range(10):
            t = time.perf_counter()
            await call(c, "gpu_status")
            idle.append(time.perf_counter() - t)
        busy: list[float] = []
        tokens = 0
        load_s: list[float] = []
        stop = anyio.Event()

        async def gen() -> None:
            nonlocal tokens
            while not stop.is_set():
                out = await call(a, "infer_complete", prompt="Count: 1, 2, 3,", max_tokens=16, temperature=0)
                tokens += out["completion_tokens"]

        async def load() -> None:
            t = time.perf_counter()
            await call(b, "infer_load", name="smollm2-copy", backend="transformers", context_length=256)
            load_s.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(gen)
            tg.start_soon(load)
            await anyio.sleep(0.5)
            while time.perf_counter() - t0 < seconds or not load_s:
                t = time.perf_counter()
                await call(c, "gpu_status")
                busy.append(time.perf_counter() - t)
                await anyio.sleep(0.2)
            stop.set()
        wall = time.perf_counter() - t0
    return {"idle": idle, "busy": busy, "load_s": load_s[0], "tokens": tokens, "wall": wall}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "inference_concurrency.md")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpubox-infer-conc-"))
    proc, url, token = start_server(tmp)
    try:
        res = anyio.run(scenario, url, token, args.seconds)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    idle, busy = res["idle"], res["busy"]
    rows = [
        ("idle server", len(idle), statistics.median(idle), pct(idle, 0.95), max(idle)),
        ("A generating + B loading", len(busy), statistics.median(busy), pct(busy, 0.95), max(busy)),
    ]
    lines = [
        "# Inference concurrency: gpu_status latency while another client generates and a third loads",
        "",
        f"`{' '.join(['.venv/bin/python', 'bench/infer_concurrency.py', '--seconds', str(args.seconds)])}` "
        f"on {os.cpu_count()} CPUs, no GPU; `gpubox serve --transport http`, three MCP connections.",
        "A: `infer_complete` (16 tokens, llama.cpp, bundled SmolLM2-135M Q4_1) in a loop. "
        "B: `infer_load smollm2-copy backend=transformers` (GGUF dequantised). C: `gpu_status` every 0.2 s.",
        "",
        "| C's gpu_status | calls | p50 s | p95 s | max s |",
        "|---|---|---|---|---|",
        *(f"| {n} | {k} | {p50:.3f} | {p95:.3f} | {mx:.3f} |" for n, k, p50, p95, mx in rows),
        "",
        f"B's load took {res['load_s']:.1f} s; A generated {res['tokens']} tokens in {res['wall']:.1f} s meanwhile.",
        "",
        "Before the fix (same scenario, measured when the issue was filed): C's gpu_status took 80-93 s, because "
        "`ModelManager.load` held the manager lock for the whole load and A's `release()` waited for that lock "
        "on the event loop, freezing every connection until the load finished.",
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
