"""What the box really delivers, run inside the bench worker process (imports torch).

GPU: device-memory bandwidth (copy, STREAM triad), dense matmul TFLOPS per dtype, pinned host<->device copies.
CPU: RAM bandwidth (copy, triad) and BLAS GFLOPS in fp32/fp64. Bytes moved follow STREAM's convention
(McCalpin, https://www.cs.virginia.edu/stream/): copy counts read + write, triad two reads + one write.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from gpubox.tools.bench.attention import Emit, cpu_name, versions


def timed(run: Callable[[], Any], warmup: int, iterations: int, cuda: bool) -> float:
    """Median seconds per call (CUDA events on a GPU)."""
    import torch

    for _ in range(warmup):
        run()
    times = []
    if cuda:
        torch.cuda.synchronize()
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iterations)
        ]
        for start, end in events:
            start.record()
            run()
            end.record()
        torch.cuda.synchronize()
        times = [start.elapsed_time(end) / 1e3 for start, end in events]
    else:
        for _ in range(iterations):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def figure(emit: Emit, name: str, unit: str, measured: float | None, detail: str) -> None:
    emit({"type": "figure", "name": name, "unit": unit, "measured": measured, "detail": detail})


def bandwidth(emit: Emit, torch: Any, dev: Any, nbytes: int, iterations: int, cuda: bool) -> None:
    n = nbytes // 4
    a, b, c = (torch.ones(n, dtype=torch.float32, device=dev) for _ in range(3))
    size = f"{3 * nbytes / 2**20:.0f} MiB in 3 fp32 buffers"
    t = timed(lambda: b.copy_(a), 2, iterations, cuda)
    figure(emit, "memory_copy", "GB/s", 2 * nbytes / t / 1e9, f"b.copy_(a), {size}, read+write counted")
    t = timed(lambda: torch.add(b, c, alpha=3.0, out=a), 2, iterations, cuda)
    figure(emit, "memory_triad", "GB/s", 3 * nbytes / t / 1e9, f"a = b + 3·c, {size}, 2 reads + 1 write counted")


def matmul(emit: Emit, torch: Any, dev: Any, dtype: str, n: int, iterations: int, cuda: bool) -> None:
    unit = "TFLOPS" if cuda else "GFLOPS"
    scale = 1e12 if cuda else 1e9
    name = f"matmul_{dtype}"
    try:
        if dtype == "fp8":
            # torch._scaled_mm wants a row-major A and a column-major B in float8_e4m3fn (sm89+)
            if torch.cuda.get_device_capability(dev) < (8, 9):
                raise RuntimeError("fp8 tensor cores need compute capability 8.9+ (Ada, Hopper, Blackwell)")
            a = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)
            b = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn).t()
            one = torch.ones((), device=dev)

            def run() -> Any:
                return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

        else:
            torch_dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16}.get(dtype)
            torch_dtype = torch_dtype or {"fp16": torch.float16, "fp64": torch.float64}[dtype]
            if cuda:
                torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
            a = torch.randn(n, n, device=dev, dtype=torch_dtype)
            b = torch.randn(n, n, device=dev, dtype=torch_dtype)

            def run() -> Any:
                return a @ b

        t = timed(run, 2, iterations, cuda)
    except Exception as exc:  # an unsupported dtype on this device is a skip, not a failure
        figure(emit, name, unit, None, f"skipped: {type(exc).__name__}: {str(exc).strip()[:300]}")
        return
    finally:
        if cuda:
            torch.backends.cuda.matmul.allow_tf32 = False
    figure(emit, name, unit, 2 * n**3 / t / scale, f"{n}×{n} @ {n}×{n}, median of {iterations}")


def transfers(emit: Emit, torch: Any, dev: Any, nbytes: int, iterations: int) -> None:
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    on_dev = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    size = f"{nbytes / 2**20:.0f} MiB pinned buffer, non_blocking copy"
    t = timed(lambda: on_dev.copy_(host, non_blocking=True), 2, iterations, True)
    figure(emit, "h2d_pinned", "GB/s", nbytes / t / 1e9, size)
    t = timed(lambda: host.copy_(on_dev, non_blocking=True), 2, iterations, True)
    figure(emit, "d2h_pinned", "GB/s", nbytes / t / 1e9, size)


def run(params: dict[str, Any], emit: Emit) -> None:
    import torch

    cuda = params.get("device", "auto") != "cpu" and torch.cuda.is_available()
    if params.get("device") == "cuda" and not cuda:
        emit({"type": "error", "message": "device='cuda' but torch sees no CUDA GPU; use device='auto' or 'cpu'"})
        return
    dev = torch.device("cuda" if cuda else "cpu")
    iterations = params.get("iterations") or (10 if cuda else 5)
    if cuda:
        free = torch.cuda.mem_get_info(dev)[0]
        nbytes = int(min(params.get("buffer_mb") or 1024, free / 8 / 2**20)) * 2**20
    else:
        import psutil

        nbytes = int(min(params.get("buffer_mb") or 256, psutil.virtual_memory().available / 8 / 2**20)) * 2**20
    n = params.get("matmul_size") or (8192 if cuda else 1024)
    emit(
        {
            "type": "env",
            "device": dev.type,
            "device_name": torch.cuda.get_device_name(dev) if cuda else cpu_name(),
            "versions": versions(torch),
            "threads": torch.get_num_threads(),
            # the sizes really used (the buffer shrinks to fit free memory): whether the run can calibrate
            "sizes": {"matmul_size": n, "buffer_mb": nbytes // 2**20, "iterations": iterations},
        }
    )
    bandwidth(emit, torch, dev, nbytes, iterations, cuda)
    for dtype in ("fp32", "tf32", "bf16", "fp16", "fp8") if cuda else ("fp32", "fp64"):
        matmul(emit, torch, dev, dtype, n, iterations, cuda)
    if cuda:
        transfers(emit, torch, dev, min(nbytes, 512 * 2**20), iterations)
    emit({"type": "done"})
