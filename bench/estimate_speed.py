"""How fast is a full 'all GPUs' comparison? Core call vs the MCP tool round trip (in-process), same run.

.venv/bin/python bench/estimate_speed.py [--reps 50]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client

from gpubox.app import build_server
from gpubox.settings import Settings
from gpubox.tools.estimate.requests import TrainingRequest
from gpubox.tools.estimate.service import Estimator

OUT = Path(__file__).resolve().parent / "results" / "estimate_speed.md"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    ns = ap.parse_args()
    settings = Settings.load(state_dir=Path(tempfile.mkdtemp(prefix="gpubox-bench-")))
    est = Estimator(settings)
    cases = {
        "estimate_inference Llama-3-8B q4_k_m gpu=all": (
            "estimate_inference",
            {"model": "Llama-3-8B", "weight_format": "q4_k_m", "gpu": "all"},
        ),
        "estimate_training Mistral-7B qlora gpu=all": (
            "estimate_training",
            {"model": "Mistral-7B", "gpu": "all", "dataset_samples": 10000},
        ),
    }
    rows = []
    for label, (tool, args) in cases.items():
        core = []
        for _ in range(ns.reps):
            t = time.perf_counter()
            if tool == "estimate_inference":
                est.inference(**args)
            else:
                est.training(TrainingRequest(**args))  # type: ignore[arg-type]
            core.append((time.perf_counter() - t) * 1000)

        async def via_mcp(tool: str = tool, args: dict[str, object] = args) -> list[float]:
            out = []
            async with Client(build_server(settings)) as c:
                for _ in range(ns.reps):
                    t = time.perf_counter()
                    r = await c.call_tool(tool, args)
                    out.append((time.perf_counter() - t) * 1000)
                    assert not r.is_error
            return out

        mcp_ms = anyio.run(via_mcp)
        rows.append((label, statistics.median(core), statistics.median(mcp_ms)))
    est.close()
    lines = [
        f"# Estimator speed ({ns.reps} reps, 2-core CPU, {time.strftime('%Y-%m-%d')})",
        "",
        "| case | core p50 ms | MCP tool p50 ms | MCP / core |",
        "|---|---|---|---|",
        *(f"| {label} | {c:.1f} | {m:.1f} | {m / c:.2f} |" for label, c, m in rows),
        "",
        "Goal: a full 'all GPUs' comparison well under 100 ms.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    OUT.write_text(text)


if __name__ == "__main__":
    main()
