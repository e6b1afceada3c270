"""Checks that need a real NVIDIA GPU, in one call; writes bench/results/gpu_<gpu>.md (or $OUT/ when set).

    python bench/gpu_checks.py

Measures what the estimator assumes: dense BF16 matmul TFLOPS and device memory bandwidth (torch), reads NVML
through gpu_status, and records the figures as calibration inputs. Skips what is not installed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from gpubox.tools.gpu.nvml import gpu_status

HERE = Path(__file__).resolve().parent


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


if __name__ == "__main__":
    main()
