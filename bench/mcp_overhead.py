"""gpubox vs a bare MCPServer: gpu_status round trip over in-process, stdio and HTTP; spawn-to-initialize.

    .venv/bin/python bench/mcp_overhead.py [--calls 200] [--out bench/results/mcp_overhead.md]

Both servers serve the same core function, in the same run, so the ratio is gpubox's own overhead.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

HERE = Path(__file__).resolve().parent
GPUBOX = str(Path(sys.executable).parent / "gpubox")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


async def timed_calls(client: Client, n: int, warmup: int = 20) -> list[float]:
    for _ in range(warmup):
        await client.call_tool("gpu_status", {})
    out = []
    for _ in range(n):
        t = time.perf_counter()
        r = await client.call_tool("gpu_status", {})
        out.append((time.perf_counter() - t) * 1000)
        assert not r.is_error
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            raise RuntimeError("server exited")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("server did not start")


async def run(n: int, env: dict[str, str]) -> list[tuple[str, str, list[float]]]:
    from gpubox.app import build_server
    from gpubox.settings import Settings

    sys.path.insert(0, str(HERE))
    import bare_server

    rows: list[tuple[str, str, list[float]]] = []
    gb = build_server(Settings.load(state_dir=env["GPUBOX_STATE_DIR"]))
    async with Client(gb) as c:
        rows.append(("in-process", "gpubox", await timed_calls(c, n)))
    async with Client(bare_server.mcp) as c:
        rows.append(("in-process", "bare", await timed_calls(c, n)))

    for name, cmd in (
        ("gpubox", [GPUBOX, "serve"]),
        ("bare", [sys.executable, str(HERE / "bare_server.py")]),
    ):
        async with Client(StdioServerParameters(command=cmd[0], args=cmd[1:], env=env)) as c:
            rows.append(("stdio", name, await timed_calls(c, n)))

    for name in ("gpubox", "bare"):
        port = free_port()
        cmd = (
            [GPUBOX, "serve", "--transport", "http", "--port", str(port), "--log-level", "WARNING"]
            if name == "gpubox"
            else [sys.executable, str(HERE / "bare_server.py"), str(port)]
        )
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_port(port, proc)
            http = httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=120))
            async with (
                http,
                Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)) as c,
            ):
                rows.append(("http", name, await timed_calls(c, n)))
        finally:
            proc.terminate()
            proc.wait()
    return rows


async def spawn_to_initialize(cmd: list[str], env: dict[str, str], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        async with Client(StdioServerParameters(command=cmd[0], args=cmd[1:], env=env), mode="legacy"):
            out.append((time.perf_counter() - t) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--spawns", type=int, default=5)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "mcp_overhead.md")
    ns = ap.parse_args()
    state = tempfile.mkdtemp(prefix="gpubox-bench-")
    env = {**os.environ, "GPUBOX_STATE_DIR": state, "PYTHONPATH": str(HERE)}

    async def all_runs() -> tuple[list[tuple[str, str, list[float]]], list[float], list[float]]:
        rows = await run(ns.calls, env)
        g = await spawn_to_initialize([GPUBOX, "serve"], env, ns.spawns)
        b = await spawn_to_initialize([sys.executable, str(HERE / "bare_server.py")], env, ns.spawns)
        return rows, g, b

    rows, spawn_g, spawn_b = anyio.run(all_runs)
    by = {(t, s): xs for t, s, xs in rows}
    lines = [
        f"# MCP overhead: gpubox vs bare MCPServer ({platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, {ns.calls} calls after 20 warm-ups, {time.strftime('%Y-%m-%d')})",
        "",
        "| transport | gpubox p50 ms | gpubox p95 ms | bare p50 ms | bare p95 ms | ratio p50 |",
        "|---|---|---|---|---|---|",
    ]
    for t in ("in-process", "stdio", "http"):
        g, b = by[(t, "gpubox")], by[(t, "bare")]
        lines.append(
            f"| {t} | {statistics.median(g):.2f} | {pct(g, 0.95):.2f} | {statistics.median(b):.2f} | "
            f"{pct(b, 0.95):.2f} | {statistics.median(g) / statistics.median(b):.2f} |"
        )
    lines += [
        "",
        "| spawn to completed initialize (stdio) | median ms | min ms |",
        "|---|---|---|",
        f"| gpubox serve | {statistics.median(spawn_g):.0f} | {min(spawn_g):.0f} |",
        f"| bare MCPServer | {statistics.median(spawn_b):.0f} | {min(spawn_b):.0f} |",
        "",
        "Goal: gpubox adds at most 20% over the bare SDK (ratio <= 1.2); initialize under 1.5 s.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(text)


if __name__ == "__main__":
    main()
