"""What the local devices can do, read from NVML (or psutil for the CPU), for planning.

The estimator's catalog knows a few dozen GPUs; NVML knows the one in the box. From NVML we read the name,
memory, memory bus width and maximum memory clock (-> peak bandwidth), SM count and rated boost clock
(-> peak tensor TFLOPS from the per-SM rate of the architecture). `derive_spec` is a pure function of those facts
so it is tested on published figures without a GPU.

GPUs are matched between NVML and CUDA by UUID / PCI bus id, never by position: NVML numbers GPUs in PCI bus
order, CUDA numbers the GPUs CUDA_VISIBLE_DEVICES lists, in the order it lists them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

import psutil
from pydantic import BaseModel, Field

from gpubox.tools.gpu.host import cpu_model
from gpubox.tools.gpu.nvml import load_pynvml

T = TypeVar("T")
_lock = threading.Lock()

# Dense FP16/BF16 tensor-core FLOPs per SM per clock with FP32 accumulate, by compute capability. Published
# peaks divided by SMs x boost clock: V100 80 SM x 1530 MHz -> 125 TFLOPS; A100 108 x 1410 -> 312; A10 72 x 1695
# -> 125; L40S 142 x 2520 -> 366; H100 SXM 132 x 1830 -> 989 (NVIDIA V100/A100/A10/L40S/H100 datasheets).
# GeForce boards run FP32-accumulate tensor math at half rate (RTX 3090 71, RTX 4090 165.2, RTX 5090 209.5
# TFLOPS: NVIDIA Ampere, Ada and Blackwell architecture whitepapers).
TENSOR_FLOPS_PER_SM_CLOCK: dict[tuple[int, int], int] = {
    (7, 0): 1024,
    (7, 5): 1024,
    (8, 0): 2048,
    (8, 6): 1024,
    (8, 7): 1024,
    (8, 9): 1024,
    (9, 0): 4096,
    (10, 0): 8192,
    (10, 3): 8192,
    (12, 0): 1024,
}
# FP32 lanes per SM (CUDA C Programming Guide, "Arithmetic Instructions" throughput table): 64 on the datacenter
# parts P100 (6.0), Volta/Turing (7.x) and A100 (8.0), 192 on Kepler, 128 elsewhere.
FP32_LANES_PER_SM: dict[tuple[int, int], int] = {(6, 0): 64, (7, 0): 64, (7, 2): 64, (7, 5): 64, (8, 0): 64}


def fp32_lanes(cc: tuple[int, int]) -> int:
    return FP32_LANES_PER_SM.get(cc, {3: 192}.get(cc[0], 128))  # Kepler 192, Maxwell 128


# NVML reports the memory clock at half the per-pin data rate for HBM and GDDR alike: H100 SXM 2619 MHz x 2 x
# 5120 bit / 8 = 3.35 TB/s, RTX 4090 10501 MHz x 2 x 384 / 8 = 1008 GB/s, A10 6251 x 2 x 384 / 8 = 600 GB/s.
DATA_RATE_PER_CLOCK = 2
# Without a measured figure the CPU is planned at dual-channel DDR4-3200 (JEDEC: 2 x 25.6 GB/s) and AVX2 FMA
# (2 units x 8 fp32 lanes x 2 FLOPs per cycle per core); record a device calibration for this box to replace both.
HOST_BANDWIDTH_GBS = 51.2
HOST_FLOPS_PER_CORE_CYCLE = 32


class NvmlFacts(BaseModel):
    """Raw NVML facts about one GPU; None where the driver does not answer."""

    index: int = Field(description="NVML index (PCI bus order)")
    uuid: str
    pci_bus_id: str = ""
    name: str
    memory_total_bytes: int
    memory_free_bytes: int
    memory_bus_width_bits: int | None = None
    max_memory_clock_mhz: int | None = None
    sm_count: int | None = None
    max_sm_clock_mhz: int | None = None
    boost_sm_clock_mhz: int | None = Field(
        default=None,
        description="Rated boost clock (customer boost, else default application clock); GeForce max clocks "
        "run far above the rating (RTX 4090: 3105 MHz max vs 2520 MHz boost)",
    )
    compute_capability: tuple[int, int] | None = None
    power_limit_w: float | None = None
    cuda_index: int | None = Field(default=None, description="Index under CUDA_VISIBLE_DEVICES, when CUDA would see it")


class DerivedSpec(BaseModel):
    """Planning figures derived from NVML facts; `from_nvml` names the figures that were derived."""

    name: str
    vram_gb: float
    available_gb: float
    bandwidth_gbs: float | None
    bf16_tflops: float | None
    fp32_tflops: float | None
    tdp_w: float | None
    bf16_supported: bool
    gpu_class: str
    from_nvml: list[str]


def peak_bandwidth_gbs(bus_width_bits: int, memory_clock_mhz: int) -> float:
    """Peak memory bandwidth in GB/s from NVML's bus width and maximum memory clock."""
    return bus_width_bits / 8 * memory_clock_mhz * 1e6 * DATA_RATE_PER_CLOCK / 1e9


def is_geforce(name: str) -> bool:
    return "geforce" in name.lower() or "titan" in name.lower()


def tensor_tflops(cc: tuple[int, int], sm_count: int, sm_clock_mhz: int, name: str) -> float | None:
    """Dense FP16/BF16 tensor TFLOPS (FP32 accumulate); None before tensor cores (compute capability < 7)."""
    per_sm = TENSOR_FLOPS_PER_SM_CLOCK.get(cc)
    if per_sm is None:
        if cc[0] < 7:
            return None
        per_sm = max(v for k, v in TENSOR_FLOPS_PER_SM_CLOCK.items() if k[0] <= cc[0])
    if is_geforce(name):
        per_sm //= 2
    return sm_count * sm_clock_mhz * 1e6 * per_sm / 1e12


def gpu_class(name: str, bus_width_bits: int | None) -> str:
    if bus_width_bits is not None and bus_width_bits >= 1024:  # HBM stacks are 1024 bits wide each
        return "datacenter-hbm"
    if is_geforce(name):
        return "consumer-gddr"
    if "rtx" in name.lower() or "quadro" in name.lower():
        return "workstation-gddr"
    return "datacenter-gddr"


def derive_spec(f: NvmlFacts) -> DerivedSpec:
    """Planning figures for one GPU from its NVML facts (pure)."""
    derived = ["vram_gb", "available_gb"]
    bw = None
    if f.memory_bus_width_bits and f.max_memory_clock_mhz:
        bw = round(peak_bandwidth_gbs(f.memory_bus_width_bits, f.max_memory_clock_mhz), 1)
        derived.append("bandwidth_gbs")
    bf16 = fp32 = None
    clock = f.boost_sm_clock_mhz or f.max_sm_clock_mhz
    if f.compute_capability and f.sm_count and clock:
        t = tensor_tflops(f.compute_capability, f.sm_count, clock, f.name)
        bf16 = round(t, 1) if t is not None else None
        lanes = fp32_lanes(f.compute_capability)
        fp32 = round(f.sm_count * lanes * 2 * clock * 1e6 / 1e12, 1)
        derived += ["bf16_tflops", "fp32_tflops"] if bf16 is not None else ["fp32_tflops"]
        if bf16 is None:
            bf16 = fp32  # no tensor cores: matrix math at the FP32 rate
    if f.power_limit_w:
        derived.append("tdp_w")
    return DerivedSpec(
        name=f.name,
        vram_gb=round(f.memory_total_bytes / 1e9, 3),
        available_gb=round(f.memory_free_bytes / 1e9, 3),
        bandwidth_gbs=bw,
        bf16_tflops=bf16,
        fp32_tflops=fp32,
        tdp_w=f.power_limit_w,
        bf16_supported=bool(f.compute_capability and f.compute_capability >= (8, 0)),
        gpu_class=gpu_class(f.name, f.memory_bus_width_bits),
        from_nvml=derived,
    )


def visible_to_cuda(devices: list[NvmlFacts], cuda_visible: str | None) -> list[NvmlFacts]:
    """The GPUs CUDA would enumerate, in CUDA's order, each with its `cuda_index`.

    CUDA_VISIBLE_DEVICES lists UUIDs ('GPU-8f3c...', a unique prefix is enough) or indices; CUDA stops at the
    first entry it cannot resolve. Indices are taken in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID); set that,
    or list UUIDs, on boxes with mixed GPUs where CUDA's default fastest-first order differs."""
    by_pci = sorted(devices, key=lambda d: (d.pci_bus_id.lower(), d.index))
    if cuda_visible is None:
        return [d.model_copy(update={"cuda_index": i}) for i, d in enumerate(by_pci)]
    out: list[NvmlFacts] = []
    seen: set[str] = set()
    for entry in (e.strip() for e in cuda_visible.split(",")):
        hit: NvmlFacts | None = None
        if entry.upper().startswith("GPU-"):
            hits = [d for d in by_pci if d.uuid.lower().startswith(entry.lower())]
            hit = hits[0] if len(hits) == 1 else None
        elif entry.isdigit() and int(entry) < len(by_pci):
            hit = by_pci[int(entry)]
        if hit is None or hit.uuid in seen:
            break
        seen.add(hit.uuid)
        out.append(hit.model_copy(update={"cuda_index": len(out)}))
    return out


def _try(fn: Callable[..., T], *args: Any) -> T | None:
    try:
        return fn(*args)
    except Exception:  # unsupported on this GPU/driver: the figure stays unknown
        return None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _boost_clock(nv: Any, h: Any) -> int | None:
    boost_id = getattr(nv, "NVML_CLOCK_ID_CUSTOMER_BOOST_MAX", None)
    clock = _try(nv.nvmlDeviceGetClock, h, nv.NVML_CLOCK_SM, boost_id) if boost_id is not None else None
    return clock or _try(nv.nvmlDeviceGetDefaultApplicationsClock, h, nv.NVML_CLOCK_SM)


def _sm_count(nv: Any, h: Any, attrs: Any, cc: tuple[int, int] | None) -> int | None:
    sms = getattr(attrs, "multiprocessorCount", None) if attrs is not None else None
    if sms:
        return int(sms)
    # nvmlDeviceGetAttributes answers NOT_SUPPORTED for a whole (non-MIG) GPU on some drivers (an H200 under 580.159
    # did); its CUDA core count over the FP32 lanes per SM is the same number
    cores = _try(nv.nvmlDeviceGetNumGpuCores, h) if hasattr(nv, "nvmlDeviceGetNumGpuCores") else None
    return int(cores) // fp32_lanes(cc) if cores and cc else None


def _facts(nv: Any, index: int) -> NvmlFacts:
    h = nv.nvmlDeviceGetHandleByIndex(index)
    mem = nv.nvmlDeviceGetMemoryInfo(h)
    pci = _try(nv.nvmlDeviceGetPciInfo, h)
    attrs = _try(getattr(nv, "nvmlDeviceGetAttributes_v2", None) or nv.nvmlDeviceGetAttributes, h)
    raw_cc = _try(nv.nvmlDeviceGetCudaComputeCapability, h)
    cc = (int(raw_cc[0]), int(raw_cc[1])) if raw_cc else None
    limit = _try(nv.nvmlDeviceGetPowerManagementDefaultLimit, h) or _try(nv.nvmlDeviceGetPowerManagementLimit, h)
    return NvmlFacts(
        index=index,
        uuid=_text(nv.nvmlDeviceGetUUID(h)),
        pci_bus_id=_text(getattr(pci, "busId", "")) if pci is not None else "",
        name=_text(nv.nvmlDeviceGetName(h)),
        memory_total_bytes=int(mem.total),
        memory_free_bytes=int(mem.free),
        memory_bus_width_bits=_try(nv.nvmlDeviceGetMemoryBusWidth, h),
        max_memory_clock_mhz=_try(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_MEM),
        sm_count=_sm_count(nv, h, attrs, cc),
        max_sm_clock_mhz=_try(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM),
        boost_sm_clock_mhz=_boost_clock(nv, h),
        compute_capability=cc,
        power_limit_w=round(limit / 1000, 1) if limit else None,
    )


def local_gpus(nv: ModuleType | Any | None = None, cuda_visible: str | None = None) -> list[NvmlFacts]:
    """NVML facts of the GPUs this process's CUDA would see; [] without NVML, driver or GPU."""
    nv = nv if nv is not None else load_pynvml()
    if nv is None:
        return []
    env = cuda_visible if cuda_visible is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
    with _lock:
        try:
            nv.nvmlInit()
        except Exception:  # no driver / no GPU: the caller plans for the CPU
            return []
        try:
            facts = [_facts(nv, i) for i in range(nv.nvmlDeviceGetCount())]
        except Exception:
            return []
        finally:
            _try(nv.nvmlShutdown)
    return visible_to_cuda(facts, env)


def host_spec() -> DerivedSpec:
    """The CPU as a planning device: memory is RAM (psutil); bandwidth and FLOPs are defaults to calibrate."""
    vm = psutil.virtual_memory()
    cores = psutil.cpu_count(logical=False) or psutil.cpu_count() or 1
    freq = _try(psutil.cpu_freq)
    mhz = (freq.max or freq.current) if freq is not None else 0.0
    flops = cores * (mhz or 2500.0) * 1e6 * HOST_FLOPS_PER_CORE_CYCLE / 1e12
    return DerivedSpec(
        name=cpu_model(),
        vram_gb=round(vm.total / 1e9, 3),
        available_gb=round(vm.available / 1e9, 3),
        bandwidth_gbs=HOST_BANDWIDTH_GBS,
        bf16_tflops=round(flops, 3),
        fp32_tflops=round(flops, 3),
        tdp_w=None,
        bf16_supported=False,
        gpu_class="cpu",
        from_nvml=[],
    )
