"""Which devices an estimate is for: catalog GPUs, the local GPUs (from NVML), or the CPU (host RAM).

A local GPU is described from NVML; the catalog adds detail (datasheet figures, prices) only when it has an
exact entry for the NVML name, so a GPU the catalog lacks (an RTX 4070, an A40, a B200) is still planned for.
A measured device profile (CalibrationStore.record_device) replaces peak bandwidth and TFLOPS.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from gpubox.errors import NotFoundError
from gpubox.tools.estimate import bounds
from gpubox.tools.estimate.calibration import CalibrationStore
from gpubox.tools.estimate.catalog import Catalog, GpuSpec
from gpubox.tools.gpu.devices import DerivedSpec, NvmlFacts, derive_spec, host_spec, local_gpus

# Figures for a GPU whose NVML driver does not report bus width or clocks (old drivers, some vGPUs):
# conservative, and said so in the assumptions.
UNKNOWN_BANDWIDTH_GBS = 300.0
UNKNOWN_TFLOPS = 30.0
CPU_TDP_W = 65.0  # a typical desktop CPU package power; only used for the electricity line


@dataclass
class Target:
    spec: GpuSpec
    available_gb: float | None = None  # plan against this (free memory) when set
    total_gb: float | None = None  # the device's real memory when it differs from the marketed figure
    source: str = "catalog"
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # stored figures left out (out of bounds)


def _nvml_spec(d: DerivedSpec) -> tuple[GpuSpec, list[str]]:
    notes: list[str] = []
    bw, bf16, fp32 = d.bandwidth_gbs, d.bf16_tflops, d.fp32_tflops
    if bw is None:
        bw = UNKNOWN_BANDWIDTH_GBS
        notes.append(f"NVML gave no memory bus width/clock for {d.name}: bandwidth assumed {bw:g} GB/s")
    if bf16 is None:
        bf16 = fp32 = UNKNOWN_TFLOPS
        notes.append(f"NVML gave no SM count/clock for {d.name}: {bf16:g} TFLOPS assumed")
    gid = re.sub(r"^nvidia\s+", "", d.name, flags=re.IGNORECASE).strip() or d.name
    spec = GpuSpec(
        id=gid,
        name=d.name,
        vram_gb=d.vram_gb,
        bandwidth_gbs=bw,
        bf16_tflops=bf16,
        fp32_tflops=fp32 or bf16,
        tdp_w=d.tdp_w or 300.0,
        gpu_class=d.gpu_class,
        memory_type="HBM" if d.gpu_class == "datacenter-hbm" else "GDDR",
        bf16_supported=d.bf16_supported,
        sources={"all": "NVML on this machine: " + ", ".join(d.from_nvml)},
    )
    return spec, notes


def local_target(f: NvmlFacts, catalog: Catalog) -> Target:
    d = derive_spec(f)
    cat = catalog.find_gpu(f.name)
    where = f"CUDA device {f.cuda_index}" if f.cuda_index is not None else f"NVML device {f.index}"
    if cat is not None:
        note = (
            f"{where} '{f.name}' is catalog entry {cat.id}: datasheet bandwidth/TFLOPS and prices from the "
            f"catalog; memory from NVML ({d.vram_gb:g} GB total, {d.available_gb:g} GB free, planned on free)."
        )
        return Target(cat, d.available_gb, d.vram_gb, "catalog + NVML memory", [note])
    spec, notes = _nvml_spec(d)
    figures = ", ".join(
        f"{k} {getattr(spec, k):g}" for k in ("vram_gb", "bandwidth_gbs", "bf16_tflops", "fp32_tflops", "tdp_w")
    )
    notes.insert(
        0,
        f"{where} '{f.name}' is not in the catalog: described from NVML ({figures}; bandwidth = bus width x "
        "max memory clock x 2, TFLOPS = SMs x max SM clock x per-SM tensor rate of its architecture). No prices.",
    )
    return Target(spec, d.available_gb, d.vram_gb, "NVML", notes)


def cpu_target() -> Target:
    d = host_spec()
    spec = GpuSpec(
        id="cpu",
        name=d.name,
        vram_gb=d.vram_gb,
        bandwidth_gbs=d.bandwidth_gbs or 50.0,
        bf16_tflops=d.bf16_tflops or 1.0,
        fp32_tflops=d.fp32_tflops or 1.0,
        tdp_w=CPU_TDP_W,
        gpu_class="cpu",
        memory_type="DDR",
        bf16_supported=False,
        sources={"all": "psutil on this machine (RAM); bandwidth and TFLOPS are defaults"},
    )
    note = (
        f"No GPU: planning for the CPU, device 'cpu', against host RAM (psutil: {d.vram_gb:g} GB total, "
        f"{d.available_gb:g} GB available). Bandwidth {spec.bandwidth_gbs:g} GB/s (dual-channel DDR4-3200) and "
        f"{spec.bf16_tflops:g} TFLOPS (AVX2 FMA x cores x clock) are defaults until a device calibration for "
        "'cpu' is recorded."
    )
    return Target(spec, d.available_gb, d.vram_gb, "host RAM (psutil)", [note])


def resolve(spec: str, catalog: Catalog) -> list[Target]:
    """'auto' (local GPUs, else every catalog GPU), 'local' (local GPUs, else the CPU), 'cpu', 'all', or a
    catalog name."""
    key = spec.strip().lower()
    if key in ("auto", "local"):
        found = local_gpus()
        if found:
            return [local_target(f, catalog) for f in found]
        if key == "local":
            return [cpu_target()]
        key = "all"
    if key == "cpu":
        return [cpu_target()]
    if key == "all":
        return [Target(g) for g in catalog.gpus.values()]
    return [Target(catalog.gpu(spec))]


def local_spec(catalog: Catalog, uuid: str | None = None) -> GpuSpec:
    """The planning spec of a local GPU (by NVML UUID, else the first CUDA device), for callers outside the
    estimator such as the inference family's load plan."""
    found = local_gpus()
    for f in found:
        if uuid is None or f.uuid == uuid:
            return local_target(f, catalog).spec
    raise NotFoundError("no local GPU visible to NVML/CUDA" + (f" with UUID {uuid}" if uuid else ""))


def with_measured(t: Target, store: CalibrationStore | None, dtype: str = "bf16") -> Target:
    """Replace peak bandwidth/TFLOPS by a device profile measured on this box, when one exists."""
    if store is None:
        return t
    prof, skipped = None, []
    for p in store.devices(gpu=t.spec.id, limit=20):  # the newest profile within bounds; say which were not
        if (why := bounds.stored_device_problem(p, t.spec)) is None:
            prof = p
            break
        skipped.append(f"device profile #{p.id} for {t.spec.id} is ignored: {why}")
    t = replace(t, warnings=[*t.warnings, *skipped])
    if prof is None:
        return t
    update: dict[str, float] = {}
    parts = []
    if prof.memory_bandwidth_gbs:
        update["bandwidth_gbs"] = prof.memory_bandwidth_gbs
        parts.append(f"memory bandwidth {prof.memory_bandwidth_gbs:g} GB/s")
    # a device without bf16/fp16 matrix units (a CPU, older GPUs) computes in fp32: its fp32 rate is the one
    keys = (dtype, "bf16", "fp16") if t.spec.bf16_supported else (dtype, "bf16", "fp16", "fp32")
    for key in keys:
        if key in prof.tflops:
            update["bf16_tflops"] = prof.tflops[key]
            parts.append(f"{key} matrix {prof.tflops[key]:g} TFLOPS")
            break
    if "fp32" in prof.tflops:
        update["fp32_tflops"] = prof.tflops["fp32"]
    if not update:
        return t
    note = (
        f"{t.spec.id}: {', '.join(parts) or 'fp32 TFLOPS'} measured on this box {prof.created_at[:10]} "
        f"(device profile #{prof.id}{': ' + prof.note if prof.note else ''}) in place of the "
        f"{'catalog' if t.source == 'catalog' else t.source} figures."
    )
    return replace(t, spec=t.spec.model_copy(update=update), source=t.source + " + measured", notes=[*t.notes, note])
