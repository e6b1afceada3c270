"""Physical bounds on measured figures: checked when a measurement or device profile is recorded, and again when
a stored one is read (a row written by an older gpubox, or edited by hand, must not steer an estimate).

Every ceiling comes from the device's own figures (catalog datasheet, NVML, or the host defaults):
  decode tok/s    <= bandwidth / bytes read per token (all weights once, plus the KV cache)
  prefill tok/s   <= dense BF16 peak / (2 x params)  (a forward pass costs 2 FLOPs per parameter)
  training tok/s  <= dense BF16 peak / FLOPs per token (MFU <= 1)
  peak memory     <= the device's memory
A measured figure may exceed its ceiling by CEILING_SLACK: datasheet peaks are rounded, boost clocks run above
the rated ones and a small model is partly read from cache. Further above is a unit slip (a batch's aggregate
rate, samples/s, MiB for GB) or a typo, and one such row would steer every later estimate for the device.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TypeVar

from pydantic import BaseModel

from gpubox.errors import ConfigError, InvalidInputError
from gpubox.tools.estimate.catalog import GpuSpec
from gpubox.tools.estimate.schemas import DeviceProfile, Measurement

Result = TypeVar("Result", bound=BaseModel)
CEILING_SLACK = 1.5
MEMORY_SLACK = 1.25  # memory reported in GiB where GB is asked is 7% more; a CPU run's RSS counts shared pages
# Below 1/10,000 of the ceiling a figure is a unit slip the other way; it is also the precision at which
# efficiencies and MFU are stored (4 decimals), so a smaller share would be stored as 0.
MIN_SHARE = 1e-4
MIN_MEMORY_GB = 1e-3  # 1 MB: less than any runtime's own footprint
ACTIVATION_FACTOR = (1e-3, 50.0)  # measured / textbook activation bytes (stored at 3 decimals)
# A CPU's bandwidth and TFLOPS in the estimator are defaults, not a datasheet, so a CPU is held to what any
# current host can reach: 12-channel DDR5 on two sockets is ~1.2 TB/s, matrix engines (AMX) a few hundred TFLOPS.
HOST_MAX_BANDWIDTH_GBS = 2000.0
HOST_MAX_TFLOPS = 1000.0
# Bounds that need no device: what a stored row is held to before its device is known.
ABSOLUTE_MAX = {
    "tokens_per_s": 1e8,
    "prefill_tokens_per_s": 1e9,
    "peak_memory_gb": 1e5,
    "memory_bandwidth_gbs": 1e5,
    "tflops": 1e5,
}
MEASURED = ("tokens_per_s", "prefill_tokens_per_s", "peak_memory_gb")
SHARE_OF_BW = " (share of the bandwidth ceiling)"


def problem(field: str, value: object, low: float, high: float, why: str = "") -> str | None:
    """Why `value` of `field` is refused, naming the bound; None when it is inside [low, high] (or absent)."""
    if value is None:
        return None
    try:  # an int beyond float range (10**400) overflows here: it is no finite float either
        number = float(value) if isinstance(value, int | float) and is_number(value) else math.nan
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        shown = repr(value)
        return f"{field} must be a finite number, got {shown if len(shown) <= 40 else shown[:37] + '...'}"
    value = number
    if value <= 0:
        return f"{field} must be positive (> 0), got {value:g}"
    if value < low:
        return f"{field} {value:g} is below the lower bound {low:.4g}{why}"
    if value > high:
        return f"{field} {value:g} is above the upper bound {high:.4g}{why}"
    return None


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def raise_if(problems: Iterable[str | None]) -> None:
    found = [p for p in problems if p]
    if found:
        raise InvalidInputError("; ".join(found) + ". Nothing was stored.")


def is_host(spec: GpuSpec) -> bool:
    return spec.id == "cpu"


def rate_problem(
    field: str, value: float | None, ceiling: float, how: str, floor_ceiling: float | None = None
) -> str | None:
    """`value` against [MIN_SHARE x `floor_ceiling` (default: `ceiling`), CEILING_SLACK x `ceiling`]; `how` says
    where the ceiling comes from."""
    low = (floor_ceiling if floor_ceiling is not None else ceiling) * MIN_SHARE
    why = f" ({how} = {ceiling:.4g} tok/s; accepted: {low:.4g} to {CEILING_SLACK:g}x that)"
    return problem(field, value, low, ceiling * CEILING_SLACK, why)


def memory_problem(spec: GpuSpec, peak_gb: float | None) -> str | None:
    why = f" ({spec.id} has {spec.vram_gb:g} GB; accepted: up to {MEMORY_SLACK:g}x that)"
    return problem("peak_memory_gb", peak_gb, MIN_MEMORY_GB, spec.vram_gb * MEMORY_SLACK, why)


def inference_problems(
    spec: GpuSpec, bytes_per_step: float, batch: int, params: int, decode: float, prefill: float | None
) -> list[str | None]:
    """Decode against the bandwidth ceiling and prefill against the compute ceiling of `spec`."""
    bw = HOST_MAX_BANDWIDTH_GBS if is_host(spec) else spec.bandwidth_gbs
    tf = HOST_MAX_TFLOPS if is_host(spec) else spec.bf16_tflops
    decode_ceiling = batch * bw * 1e9 / bytes_per_step
    prefill_ceiling = tf * 1e12 / (2 * params)
    # a host's upper bound is the fastest host there is, but its lower bound must come from an ordinary one
    # (the estimator's CPU defaults): 1/10,000 of 1,000 TFLOPS would refuse a real 2-core box's prefill
    floors = (spec.bandwidth_gbs, spec.bf16_tflops) if is_host(spec) else (bw, tf)
    return [
        rate_problem(
            "tokens_per_s",
            decode,
            decode_ceiling,
            f"decode ceiling on {spec.id}: {bw:g} GB/s / {bytes_per_step / 1e9:.3g} GB read per token"
            + (f" x batch {batch}" if batch > 1 else ""),
            batch * floors[0] * 1e9 / bytes_per_step,
        ),
        rate_problem(
            "prefill_tokens_per_s",
            prefill,
            prefill_ceiling,
            f"prefill ceiling on {spec.id}: {tf:g} TFLOPS / (2 x {params / 1e9:.3g}B params)",
            floors[1] * 1e12 / (2 * params),
        ),
    ]


def training_problem(spec: GpuSpec, flops_per_token: float, tokens_per_s: float | None) -> str | None:
    """Training tok/s against the device's dense peak (the ceiling MFU is derived from)."""
    ceiling = spec.bf16_tflops * 1e12 / flops_per_token
    how = f"training ceiling on {spec.id}: {spec.bf16_tflops:g} TFLOPS / {flops_per_token / 1e9:.3g} GFLOP per token"
    return rate_problem("tokens_per_s", tokens_per_s, ceiling, how)


def device_problems(spec: GpuSpec | None, bandwidth_gbs: float | None, tflops: dict[str, object]) -> list[str]:
    """A device profile against the device's datasheet; a CPU against what hosts reach; no spec: absolute."""
    if spec is None:
        bw, tf = ABSOLUTE_MAX["memory_bandwidth_gbs"], ABSOLUTE_MAX["tflops"]
        bw_why = tf_why = " (beyond any current device)"
    elif is_host(spec):
        bw, tf = HOST_MAX_BANDWIDTH_GBS, HOST_MAX_TFLOPS
        bw_why = tf_why = " (what any current host reaches)"
    else:
        # no dense matrix rate exceeds FP8/INT8, twice dense BF16 (NVIDIA Ampere/Hopper/Ada datasheets)
        peak = 2 * max(spec.bf16_tflops, spec.fp32_tflops)
        bw, tf = spec.bandwidth_gbs * CEILING_SLACK, peak * CEILING_SLACK
        bw_why = f" ({spec.id}'s datasheet {spec.bandwidth_gbs:g} GB/s x {CEILING_SLACK:g})"
        tf_why = f" ({spec.id}'s fastest dense rate, FP8 = 2 x {spec.bf16_tflops:g} TFLOPS BF16, x {CEILING_SLACK:g})"
    out = [problem("memory_bandwidth_gbs", bandwidth_gbs, 0.0, bw, bw_why)]
    for key, value in tflops.items():
        if not isinstance(value, int | float) or not is_number(value):
            out.append(f"tflops['{key}'] must be a number, got {value!r}")
        else:
            out.append(problem(f"tflops['{key}']", value, 0.0, tf, tf_why))
    return [p for p in out if p]


def stored_problem(row: Mapping[str, object]) -> str | None:
    """Why a stored measurement (its columns) must not steer estimates whatever the device, or None."""
    checks = [
        *(problem(col, row.get(col), 0.0, high) for col, high in ABSOLUTE_MAX.items() if col in MEASURED),
        problem("decode_efficiency", row.get("decode_efficiency"), MIN_SHARE, CEILING_SLACK, SHARE_OF_BW),
        problem("mfu", row.get("mfu"), MIN_SHARE, CEILING_SLACK, " (share of the dense peak)"),
        problem("activation_factor", row.get("activation_factor"), *ACTIVATION_FACTOR),
    ]
    return next((c for c in checks if c), None)


def prefill_problem(m: Measurement, spec: GpuSpec) -> str | None:
    """A stored prefill rate so low against this device's compute ceiling that it is a unit slip."""
    if not m.prefill_tokens_per_s or not m.params:
        return None
    ceiling = spec.bf16_tflops * 1e12 / (2 * m.params)
    why = (
        f" ({MIN_SHARE:g} x {spec.id}'s prefill ceiling {ceiling:.4g} tok/s = {spec.bf16_tflops:g} TFLOPS / 2 x params)"
    )
    return problem("prefill_tokens_per_s", m.prefill_tokens_per_s, ceiling * MIN_SHARE, math.inf, why)


def stored_device_problem(p: DeviceProfile, spec: GpuSpec | None) -> str | None:
    found = device_problems(spec, p.memory_bandwidth_gbs, dict(p.tflops))
    return p.ignored or (found[0] if found else None)


def non_finite(value: object, path: str = "") -> str | None:
    """The path of the first NaN/inf float in a result model (JSON would carry it as null), or None."""
    if isinstance(value, BaseModel):
        items: Iterable[tuple[str, object]] = ((n, getattr(value, n)) for n in type(value).model_fields)
    elif isinstance(value, dict):
        items = ((str(k), v) for k, v in value.items())
    elif isinstance(value, list | tuple):
        items = ((f"[{i}]", v) for i, v in enumerate(value))
    else:
        ok = not isinstance(value, float) or math.isfinite(value)
        return None if ok else f"{path} = {value}"
    for key, v in items:
        sub = f"{path}{key}" if key.startswith("[") or not path else f"{path}.{key}"
        if (found := non_finite(v, sub)) is not None:
            return found
    return None


def finite(result: Result) -> Result:
    """The last guard on an estimate: JSON carries NaN/inf as null, which the output schema (a number) refuses,
    so the client would see 'Invalid structured content' instead of the figure that went wrong."""
    where = non_finite(result)
    if where is not None:
        raise ConfigError(
            f"the estimate came out non-finite at {where}: a figure it used is out of range. Check the GPU and "
            "model entries in <state_dir>/catalog/*.json and the calibrations estimate_calibrations marks 'ignored'."
        )
    return result
