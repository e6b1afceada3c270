"""NVML telemetry (nvidia-ml-py). No NVML, no driver or no GPU is data, never an exception."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

import psutil

from gpubox.tools.gpu.host import host_info
from gpubox.tools.gpu.schemas import EccErrors, GpuDevice, GpuProcess, GpuStatus

MIB = 1024**2
T = TypeVar("T")

# nvmlClocksEventReason* bits (same values as the older ...ThrottleReason* names)
THROTTLE_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

_init_lock = threading.Lock()


def load_pynvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def decode_throttle(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


def _try(fn: Callable[..., T], *args: Any) -> T | None:
    """Call an NVML getter; unsupported queries (and any NVML error) become None."""
    try:
        return fn(*args)
    except Exception:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _process_name(pid: int) -> str | None:
    try:
        return psutil.Process(pid).name()
    except (psutil.Error, OSError):
        return None


def _device(nv: Any, index: int) -> GpuDevice:
    h = nv.nvmlDeviceGetHandleByIndex(index)
    mem = nv.nvmlDeviceGetMemoryInfo(h)
    util = _try(nv.nvmlDeviceGetUtilizationRates, h)
    power = _try(nv.nvmlDeviceGetPowerUsage, h)
    limit = _try(nv.nvmlDeviceGetPowerManagementLimit, h)
    reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    mask = _try(reasons_fn, h) if reasons_fn else None
    cc = _try(nv.nvmlDeviceGetCudaComputeCapability, h)
    ecc: EccErrors | None = None
    mode = _try(nv.nvmlDeviceGetEccMode, h)
    if mode and mode[0]:
        get = nv.nvmlDeviceGetTotalEccErrors
        ecc = EccErrors(
            corrected_volatile=_try(get, h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
            uncorrected_volatile=_try(get, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
            corrected_aggregate=_try(get, h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_AGGREGATE_ECC),
            uncorrected_aggregate=_try(get, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_AGGREGATE_ECC),
        )
    procs = _try(nv.nvmlDeviceGetComputeRunningProcesses, h) or []
    return GpuDevice(
        index=index,
        name=_text(nv.nvmlDeviceGetName(h)),
        uuid=_text(nv.nvmlDeviceGetUUID(h)),
        memory_total_mib=round(mem.total / MIB, 1),
        memory_used_mib=round(mem.used / MIB, 1),
        memory_free_mib=round(mem.free / MIB, 1),
        utilization_gpu_pct=util.gpu if util is not None else None,
        utilization_memory_pct=util.memory if util is not None else None,
        temperature_c=_try(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
        power_draw_w=round(power / 1000, 1) if power is not None else None,
        power_limit_w=round(limit / 1000, 1) if limit is not None else None,
        sm_clock_mhz=_try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
        memory_clock_mhz=_try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
        throttle_reasons=decode_throttle(mask) if mask is not None else [],
        ecc_errors=ecc,
        compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
        processes=[
            GpuProcess(
                pid=p.pid,
                name=_process_name(p.pid),
                used_memory_mib=round(p.usedGpuMemory / MIB, 1) if p.usedGpuMemory is not None else None,
            )
            for p in procs
        ],
    )


def gpu_status(nv: ModuleType | Any | None = None) -> GpuStatus:
    """Snapshot every GPU NVML sees, plus the host. `nv` defaults to the installed pynvml module."""
    host = host_info()
    nv = nv if nv is not None else load_pynvml()
    if nv is None:
        return GpuStatus(
            available=False,
            reason="nvidia-ml-py is not installed (pip install 'gpubox[gpu]')",
            host=host,
            session=None,  # the gpu adapter adds the session meter
        )
    with _init_lock:  # nvmlInit/Shutdown are reference counted, but not safe to race
        try:
            nv.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            return GpuStatus(
                available=False, reason=f"NVML unavailable: {exc} (no NVIDIA driver/GPU?)", host=host, session=None
            )
        try:
            count = nv.nvmlDeviceGetCount()
            driver = _try(nv.nvmlSystemGetDriverVersion)
            cuda = _try(nv.nvmlSystemGetCudaDriverVersion_v2) or _try(nv.nvmlSystemGetCudaDriverVersion)
            gpus = [_device(nv, i) for i in range(count)]
        except Exception as exc:
            return GpuStatus(available=False, reason=f"NVML query failed: {exc}", host=host, session=None)
        finally:
            _try(nv.nvmlShutdown)
    return GpuStatus(
        available=bool(gpus),
        reason=None if gpus else "NVML found no GPU",
        driver_version=_text(driver) if driver is not None else None,
        cuda_driver_version=f"{cuda // 1000}.{(cuda % 1000) // 10}" if isinstance(cuda, int) else None,
        gpus=gpus,
        host=host,
        session=None,  # the gpu adapter adds the session meter
    )
