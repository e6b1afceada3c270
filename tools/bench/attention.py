"""Attention-kernel sweep, run inside the bench worker process (imports torch; never imported by the server).

Each backend is timed on the same q/k/v, its output compared with an fp32 math reference, and every shape a
backend cannot run is reported as a skip with the reason the library gave. FLOPs follow the count used by
FlashAttention's benchmarks (Dao et al., 2022): 4·B·H·N²·D forward, half of it when causal, ×2.5 with backward.
"""

from __future__ import annotations

import contextlib
import math
import re
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Emit = Callable[[dict[str, Any]], None]

SWEEP_HEAD_DIMS = [64, 128, *range(320, 1025, 64)]
GPU_DEFAULTS = {"heads": 48, "seq_lens": [8192], "head_dims": SWEEP_HEAD_DIMS, "dtype": "float16"}
CPU_DEFAULTS = {"heads": 4, "seq_lens": [256], "head_dims": [32, 64], "dtype": "float32"}
# fp16 keeps 11 significant bits and bf16 8, so a fused kernel legitimately differs from an fp32 reference by
# a few units in the last place of O(1) outputs; fp32 kernels differ only by summation order.
TOLERANCE = {"float32": 2e-4, "float16": 1e-2, "bfloat16": 4e-2}
SDPA = {
    "sdpa_math": "MATH",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
}
ORDER = ("sdpa_math", "sdpa_efficient", "sdpa_flash", "sdpa_cudnn", "ffpa", "flash_attn")


def attention_flops(batch: int, heads: int, seq_len: int, head_dim: int, causal: bool, backward: bool) -> float:
    flops = 4.0 * batch * heads * seq_len * seq_len * head_dim
    if causal:
        flops /= 2
    return flops * 2.5 if backward else flops


class Unavailable(Exception):
    """A backend cannot run a shape; the message is the reason shown to the user."""


@dataclass
class Kernel:
    """A backend bound to one shape: `call(q, k, v)` in the backend's own layout, output in B,H,N,D."""

    call: Callable[[Any, Any, Any], Any]
    prepare: Callable[[Any], Any] = lambda t: t
    restore: Callable[[Any], Any] = lambda t: t


def kernel(name: str, cuda: bool, dtype: str, seq_len: int, head_dim: int, causal: bool) -> Kernel:
    import torch.nn.functional as F

    if name in SDPA:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, SDPA[name])

        def sdpa(q: Any, k: Any, v: Any) -> Any:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return Kernel(sdpa)
    if not cuda:
        raise Unavailable(f"{name} has CUDA kernels only; this run is on the CPU")
    if name == "ffpa":
        try:
            from ffpa_attn import ffpa_attn_func  # type: ignore[import-not-found]
        except ImportError as exc:
            raise Unavailable(f"ffpa-attn is not importable ({exc}); pip install ffpa-attn") from exc
        # ffpa_attn_func silently delegates these shapes to SDPA, so timing them would time SDPA
        if head_dim <= 256 or head_dim > 1024 or seq_len < 512:
            raise Unavailable("FFPA runs head_dim 257–1024 with seq_len ≥ 512; it hands other shapes to SDPA")
        if dtype == "float32":
            raise Unavailable("FFPA takes fp16/bf16 inputs only")
        return Kernel(lambda q, k, v: ffpa_attn_func(q, k, v, is_causal=causal))
    if name == "flash_attn":
        try:
            from flash_attn import flash_attn_func  # type: ignore[import-not-found]
        except ImportError as exc:
            raise Unavailable(f"flash-attn is not importable ({exc}); pip install flash-attn") from exc
        if head_dim > 256:
            raise Unavailable("flash-attn supports head_dim ≤ 256")
        if dtype == "float32":
            raise Unavailable("flash-attn takes fp16/bf16 inputs only")
        # flash-attn wants B,N,H,D: the transposes happen outside the timed call
        return Kernel(
            lambda q, k, v: flash_attn_func(q, k, v, causal=causal),
            prepare=lambda t: t.transpose(1, 2).contiguous(),
            restore=lambda t: t.transpose(1, 2),
        )
    raise Unavailable(f"unknown backend {name}")


def reference(q: Any, k: Any, v: Any, causal: bool, budget_bytes: float) -> Any:
    """fp32 math-backend attention, a few heads at a time so the N×N scores stay within `budget_bytes`."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, n, _ = q.shape
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    step = max(1, int(budget_bytes // (3 * 4 * n * n)))
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        for i in range(b):
            for j in range(0, h, step):
                sl = (slice(i, i + 1), slice(j, j + step))
                out[sl] = F.scaled_dot_product_attention(q[sl].float(), k[sl].float(), v[sl].float(), is_causal=causal)
    return out


def time_calls(run: Callable[[], Any], warmup: int, iterations: int, cuda: bool, flush: Any | None) -> list[float]:
    """Milliseconds per call. GPU: CUDA events around each call in one synchronised loop, with the L2 cache
    overwritten before each call so every iteration reads q/k/v from HBM as a real prefill would."""
    import torch

    for _ in range(warmup):
        run()
    if not cuda:
        times = []
        for _ in range(iterations):
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1e3)
        return times
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iterations)]
    for start, end in events:
        if flush is not None:
            flush.zero_()
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    idx = (len(s) - 1) * q
    lo, hi = math.floor(idx), math.ceil(idx)
    return s[lo] + (s[hi] - s[lo]) * (idx - lo)


def free_bytes(cuda: bool) -> float:
    import torch

    if cuda:
        return float(torch.cuda.mem_get_info()[0])
    import psutil

    return float(psutil.virtual_memory().available)


_TRIGGERED = re.compile(r"\(Triggered internally at [^()]*\)\.?")


def describe(exc: BaseException, caught: list[warnings.WarningMessage]) -> str:
    """The library's own words: PyTorch explains a refused SDPA backend in warnings, then raises a generic error.

    It first heads each backend it checks ('Flash attention kernel not used because:') and notes those the forced
    backend turned off ('... has been runtime disabled'); only the requirement that failed says why (on an H200 at
    D=1024 the 600-character reason used to end before it)."""
    parts = []
    for w in caught:
        text = _TRIGGERED.sub("", str(w.message)).replace("\n", " ").strip()
        if text and not text.endswith("because:") and not text.endswith("has been runtime disabled."):
            parts.append(text)
    parts.append(f"{type(exc).__name__}: {str(exc).strip()}")
    text = " | ".join(dict.fromkeys(p.replace("\n", " ") for p in parts))
    return text[:600]


def run(params: dict[str, Any], emit: Emit) -> None:
    import torch

    cuda = params.get("device", "auto") != "cpu" and torch.cuda.is_available()
    if params.get("device") == "cuda" and not torch.cuda.is_available():
        emit({"type": "error", "message": "device='cuda' but torch sees no CUDA GPU; use device='auto' or 'cpu'"})
        return
    defaults = GPU_DEFAULTS if cuda else CPU_DEFAULTS
    dtype_name = params.get("dtype") or defaults["dtype"]
    heads = params.get("heads") or defaults["heads"]
    seq_lens = params.get("seq_lens") or defaults["seq_lens"]
    head_dims = params.get("head_dims") or defaults["head_dims"]
    batch, causal, backward = params["batch"], params["causal"], params["backward"]
    warmup, iterations = params["warmup"], params["iterations"]
    tolerance = params.get("tolerance") or TOLERANCE[dtype_name] * (10 if cuda and dtype_name == "float32" else 1)
    names = params.get("backends") or list(ORDER)
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = getattr(torch, dtype_name)
    flush = None
    if cuda:
        props = torch.cuda.get_device_properties(dev)
        flush = torch.empty(
            max(2 * int(getattr(props, "L2_cache_size", 0)), 1 << 20) // 4, dtype=torch.int32, device=dev
        )
    emit(
        {
            "type": "env",
            "device": dev.type,
            "device_name": torch.cuda.get_device_name(dev) if cuda else cpu_name(),
            "dtype": dtype_name,
            "heads": heads,
            "seq_lens": seq_lens,
            "head_dims": head_dims,
            "tolerance": tolerance,
            "timing": "CUDA events per call in a synchronised loop after warmup, L2 flushed before each call"
            if cuda
            else "time.perf_counter per call after warmup (CPU)",
            "versions": versions(torch),
        }
    )
    torch.manual_seed(0)
    unavailable: set[str] = set()
    peak = 0.0  # per-backend peaks are reset between backends, so the run's peak is their maximum
    for n in seq_lens:
        for d in head_dims:
            elem = torch.finfo(dtype).bits // 8
            tensors = batch * heads * n * d * elem * (8 if backward else 4)
            if tensors > 0.9 * free_bytes(cuda):
                for name in names:
                    reason = f"q/k/v/o need {tensors / 1e9:.1f} GB, {free_bytes(cuda) / 1e9:.1f} GB free"
                    emit({"type": "skip", "backend": name, "head_dim": d, "seq_len": n, "reason": reason})
                continue
            q, k, v = (torch.randn(batch, heads, n, d, device=dev, dtype=dtype) for _ in range(3))
            ref = reference(q, k, v, causal, budget_bytes=min(2e9, 0.25 * free_bytes(cuda)))
            grad = torch.randn_like(q) if backward else None
            for name in names:
                if name in unavailable:
                    continue
                row = measure(name, q, k, v, ref, grad, cuda, dtype_name, causal, warmup, iterations, flush)
                if isinstance(row, str):
                    # a backend missing on this machine is one skip for the whole run, not one per shape
                    whole = any(m in row for m in ("CUDA kernels only", "for CUDA only", "not importable"))
                    if whole:
                        unavailable.add(name)
                    emit(
                        {
                            "type": "skip",
                            "backend": name,
                            "head_dim": None if whole else d,
                            "seq_len": None if whole else n,
                            "reason": row,
                        }
                    )
                    continue
                flops = attention_flops(batch, heads, n, d, causal, backward)
                row.update(
                    backend=name,
                    head_dim=d,
                    seq_len=n,
                    tflops=flops / (row["time_ms"] * 1e-3) / 1e12,
                    within_tolerance=row["max_abs_error"] <= tolerance,
                )
                peak = max(peak, row["peak_memory_mb"] or 0.0)
                emit({"type": "row", **row})
            del q, k, v, ref, grad
            if cuda:
                torch.cuda.empty_cache()
    emit({"type": "done", "peak_memory_mb": max(peak, peak_memory_mb(cuda)) or None})  # None: not measurable


def measure(
    name: str,
    q: Any,
    k: Any,
    v: Any,
    ref: Any,
    grad: Any | None,
    cuda: bool,
    dtype: str,
    causal: bool,
    warmup: int,
    iterations: int,
    flush: Any | None,
) -> dict[str, Any] | str:
    """One backend at one shape: a dict of figures, or the reason it cannot run."""
    import torch

    n, d = q.shape[2], q.shape[3]
    try:
        kern = kernel(name, cuda, dtype, n, d, causal)
    except Unavailable as exc:
        return str(exc)
    if name == "sdpa_math":
        scores = q.shape[0] * q.shape[1] * n * n * 4 * 3
        if scores > 0.8 * free_bytes(cuda):
            free = free_bytes(cuda) / 1e9
            return f"the math backend materialises {scores / 1e9:.1f} GB of N×N scores; {free:.1f} GB free"
    # detached copies: with backward, each backend gets its own leaf tensors and gradients
    qi, ki, vi = (kern.prepare(t.detach()) for t in (q, k, v))
    if grad is not None:
        qi, ki, vi = (t.clone().requires_grad_(True) for t in (qi, ki, vi))
    g = kern.prepare(grad) if grad is not None else None

    def call() -> Any:
        if g is None:
            with torch.no_grad():
                return kern.call(qi, ki, vi)
        for t in (qi, ki, vi):
            t.grad = None
        out = kern.call(qi, ki, vi)
        out.backward(g)
        return out

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = kern.restore(call())
        except Exception as exc:  # every library signals "cannot run this shape" differently
            if cuda:
                torch.cuda.empty_cache()
            reason = describe(exc, caught)
            if not cuda and name in ("sdpa_efficient", "sdpa_cudnn"):
                reason = f"PyTorch has this kernel for CUDA only | {reason}"
            return reason
    err = float((out.detach().float() - ref).abs().max().item())
    del out
    try:
        times = time_calls(call, warmup, iterations, cuda, flush)
    except Exception as exc:
        return describe(exc, [])
    median = statistics.median(times)
    return {
        "time_ms": median,
        "time_ms_min": min(times),
        "time_ms_max": max(times),
        "spread_pct": 100 * (percentile(times, 0.9) - percentile(times, 0.1)) / median if median else 0.0,
        "max_abs_error": err,
        "peak_memory_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
    }


def peak_memory_mb(cuda: bool) -> float:
    """Peak device memory on a GPU; on the CPU the worker's own VmHWM, not ru_maxrss, which Linux carries over
    across exec from the server the worker was started by (0.0 where /proc cannot tell)."""
    if cuda:
        import torch

        return torch.cuda.max_memory_allocated() / 2**20
    from gpubox.tools.bench.worker import host_peak_bytes

    return (host_peak_bytes() or 0) / 2**20


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def versions(torch: Any) -> dict[str, str]:
    import platform
    from importlib import metadata

    out = {"python": platform.python_version(), "torch": torch.__version__}
    if torch.version.cuda:
        out["cuda"] = str(torch.version.cuda)
    if torch.backends.cudnn.is_available():
        out["cudnn"] = str(torch.backends.cudnn.version())
    for dist in ("ffpa-attn", "flash-attn", "numpy"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    return out
