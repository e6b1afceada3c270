"""Warnings finetune_plan gives about the box as it is now: other processes on the GPU, models this server holds
loaded for inference, and clocks throttled by power or temperature.

Plain functions over gpu_status's data objects and the inference manager's `loaded()` probe (this module imports
neither NVML nor the inference stack), so each is testable without a GPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from gpubox.tools.gpu.schemas import GpuDevice
from gpubox.tools.inference.schemas import LoadedInfo

# Clock event reasons that lower clocks under load. gpu_idle, applications/display clock settings and sync boost
# are not a slowdown of a training run (NVML nvmlClocksEventReasons:
# https://docs.nvidia.com/deploy/nvml-api/group__nvmlClocksEventReasons.html).
SLOWDOWN_REASONS = {
    "sw_power_cap": "software power cap",
    "hw_slowdown": "hardware slowdown (temperature or power brake)",
    "sw_thermal_slowdown": "software thermal slowdown",
    "hw_thermal_slowdown": "hardware thermal slowdown",
    "hw_power_brake_slowdown": "external power brake",
}


def busy_gpu(gpus: Iterable[GpuDevice], own_pids: set[int] | None = None) -> list[str]:
    """GPUs in use by processes other than this server (whose own models are named by loaded_models)."""
    own = own_pids if own_pids is not None else {os.getpid()}
    out = []
    for g in gpus:
        others = [p for p in g.processes if p.pid not in own]
        if not others:
            continue
        used = sum(p.used_memory_mib or 0 for p in others)
        names = ", ".join(f"{p.name or 'pid'} ({p.pid})" for p in others[:3]) + (" ..." if len(others) > 3 else "")
        out.append(
            f"GPU {g.index} is in use by {len(others)} other process(es) holding {used / 1024:.1f} GiB: {names}; "
            f"the plan is for all {g.memory_total_mib / 1024:.1f} GiB but {g.memory_free_mib / 1024:.1f} GiB are free "
            "now, and training would share the GPU's compute"
        )
    return out


def throttled(gpus: Iterable[GpuDevice]) -> list[str]:
    """GPUs whose clocks are being lowered now; measured tokens/s will fall short of the estimate."""
    out = []
    for g in gpus:
        active = [SLOWDOWN_REASONS[r] for r in g.throttle_reasons if r in SLOWDOWN_REASONS]
        if not active:
            continue
        details = []
        if g.temperature_c is not None:
            details.append(f"{g.temperature_c} C")
        if g.power_draw_w is not None and g.power_limit_w:
            details.append(f"{g.power_draw_w:g}/{g.power_limit_w:g} W")
        if g.sm_clock_mhz is not None:
            details.append(f"SM clock {g.sm_clock_mhz} MHz")
        where = f" ({', '.join(details)})" if details else ""
        out.append(
            f"GPU {g.index} is throttling now: {', '.join(active)}{where}; tokens/s will be below the estimate until "
            "cooling or the power limit recovers (nvidia-smi -q -d PERFORMANCE shows the reasons)"
        )
    return out


def loaded_models(loaded: dict[str, LoadedInfo], device: str) -> list[str]:
    """Models this server holds loaded for inference, on the memory the plan is for (GPU or host RAM)."""
    out = []
    for name, info in loaded.items():
        on_gpu = str(info.device).startswith("cuda")
        if device == "cuda" and not on_gpu:
            continue
        memory = "GPU memory" if on_gpu else "RAM"
        out.append(
            f"model '{name}' is loaded for inference in this server ({info.backend}, {info.device}) and holds about "
            f"{info.memory_gb:.2f} GB of {memory}; call infer_unload name='{name}' before finetune_launch to give "
            "that memory to training"
        )
    return out
