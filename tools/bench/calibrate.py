"""bench_device against the estimator: datasheet figures from its device specs, measured figures into its store.

The catalog lists dense BF16/FP16 and FP32 TFLOPS; TF32 and FP8 are derived from BF16 with the ratios NVIDIA's
Ampere/Hopper/Ada datasheets give for dense tensor-core math (TF32 = BF16 / 2, FP8 = 2 × BF16).
"""

from __future__ import annotations

from typing import Any

from gpubox.errors import GpuboxError, InvalidInputError
from gpubox.tools.bench.schemas import DeviceFigure
from gpubox.tools.estimate.service import Estimator

Sheet = dict[str, tuple[float | None, str | None]]
TFLOPS_KEYS = {
    "matmul_fp32": "fp32",
    "matmul_tf32": "tf32",
    "matmul_bf16": "bf16",
    "matmul_fp16": "fp16",
    "matmul_fp8": "fp8",
    "matmul_fp64": "fp64",
}


# The smallest run whose figures stand for the device: below these, caches (a GPU's L2 is up to ~126 MB, a
# server CPU's L3 hundreds of MB with 3D V-cache: the three buffers together must outgrow it) and per-call
# overhead dominate, and a 128×128 matmul measured 0.1% of the datasheet. The tools' defaults are well above.
CALIBRATION_MIN = {
    "cuda": {"matmul_size": 4096, "buffer_mb": 256, "iterations": 3},
    "cpu": {"matmul_size": 512, "buffer_mb": 128, "iterations": 3},
}


def too_small(device: str, sizes: dict[str, Any] | None) -> str | None:
    """Why a run is too small to calibrate the device, in words; None when it is representative."""
    floor = CALIBRATION_MIN["cuda" if device == "cuda" else "cpu"]
    if not isinstance(sizes, dict):
        return "nothing stored: the worker did not report the sizes it measured with"
    short = [f"{k} {sizes.get(k, 0)} < {v}" for k, v in floor.items() if sizes.get(k, 0) < v]
    if not short:
        return None
    return (
        f"nothing stored: this run is too small to stand for the device ({', '.join(short)}; caches and call "
        "overhead dominate), so estimates keep their figures; run bench_device with the default sizes, with free "
        "memory for 8 times the buffer (it shrinks to fit), to calibrate"
    )


def datasheet(est: Estimator, device: str, name: str) -> tuple[Any | None, Sheet]:
    """(the estimator's spec for this device or None, figure name -> (datasheet value, source)).

    The spec is the one estimates use: a catalog entry, a GPU described from NVML, or the host CPU's defaults.
    """
    try:
        spec = est.device_spec("cpu" if device == "cpu" else name)
    except GpuboxError:
        return None, {}
    src = f"estimator {spec.id}: " + "; ".join(spec.sources.values())
    if device == "cpu":
        # CPU matmuls are measured in GFLOPS; with AVX2/AVX-512 FMA an fp64 lane is twice an fp32 lane
        return spec, {
            "memory_copy": (spec.bandwidth_gbs, src),
            "memory_triad": (spec.bandwidth_gbs, src),
            "matmul_fp32": (spec.fp32_tflops * 1e3, src),
            "matmul_fp64": (spec.fp32_tflops * 1e3 / 2, src + " (fp64 = fp32 / 2)"),
        }
    bf16 = spec.bf16_tflops if spec.bf16_supported else None
    derived = src + " (derived from dense BF16)"
    return spec, {
        "memory_copy": (spec.bandwidth_gbs, src),
        "memory_triad": (spec.bandwidth_gbs, src),
        "matmul_fp32": (spec.fp32_tflops, src),
        "matmul_bf16": (bf16, src),
        "matmul_fp16": (spec.bf16_tflops, src),
        "matmul_tf32": (bf16 / 2 if bf16 else None, derived),
        "matmul_fp8": (bf16 * 2 if bf16 else None, derived),
    }


def record(est: Estimator, device: str, spec: Any | None, figures: list[DeviceFigure], run_id: str) -> str:
    """Store the measured bandwidth and TFLOPS as a device calibration; returns what happened, in words."""
    store = est.store
    by_name = {f.name: f.measured for f in figures if f.measured is not None}
    bandwidth = max((by_name[k] for k in ("memory_copy", "memory_triad") if k in by_name), default=None)
    # GPU matmuls are reported in TFLOPS, CPU BLAS in GFLOPS: the store takes TFLOPS throughout
    per_unit = 1.0 if device == "cuda" else 1e-3
    tflops = {TFLOPS_KEYS[k]: round(v * per_unit, 6) for k, v in by_name.items() if k in TFLOPS_KEYS}
    if spec is None:
        return "nothing stored: the estimator does not know this device (add it to <state_dir>/catalog/gpus.json)"
    gpu = spec.id
    if bandwidth is None:
        return "nothing stored: no bandwidth was measured"
    record_device = getattr(store, "record_device", None)
    if record_device is None:
        return (
            "nothing stored: this gpubox's estimator has no CalibrationStore.record_device yet, so estimates "
            "keep catalog figures"
        )
    try:  # the estimator's bounds: finite, > 0, within the device's datasheet ceiling
        profile = record_device(gpu, round(bandwidth, 3), tflops, f"bench_device run {run_id}", spec=spec)
    except InvalidInputError as exc:
        return f"nothing stored: {str(exc).removesuffix(' Nothing was stored.')}"
    return (
        f"stored as a device calibration for '{gpu}' (profile #{getattr(profile, 'id', '?')}): {bandwidth:.1f} GB/s, "
        f"TFLOPS {tflops}; estimate_* on '{gpu}' now use these in place of the datasheet figures"
    )
