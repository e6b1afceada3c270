"""GPU names mean that GPU; local devices are described from NVML (or host RAM without a GPU)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import psutil
import pytest
from mcp import Client

from gpubox.errors import InvalidInputError, UnknownNameError
from gpubox.tools.estimate.catalog import AmbiguousNameError, package_catalog
from gpubox.tools.gpu.devices import NvmlFacts, derive_spec, local_gpus, peak_bandwidth_gbs, visible_to_cuda
from tests.conftest import call_err, call_ok, has_gpu

pytestmark = pytest.mark.anyio


# --- names ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "gpu_id"),
    [
        ("A100 40GB", "A100-40GB-SXM"),
        ("A100 40 GB SXM", "A100-40GB-SXM"),
        ("a100-40gb-pcie", "A100-40GB-PCIe"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB-SXM"),  # the NVML name
        ("nvidia h100 80gb hbm3", "H100-SXM"),
        ("H100 SXM", "H100-SXM"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("L40S", "L40S"),
        ("L40", "L40"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX-6000-Ada"),
        ("Apple M4 Max", "M4-Max"),
    ],
)
def test_a_gpu_name_resolves_to_exactly_that_gpu(name: str, gpu_id: str) -> None:
    assert package_catalog().gpu(name).id == gpu_id


def test_a_short_id_inside_a_longer_name_is_not_a_match() -> None:
    cat = package_catalog()
    # today's "contained id" fallback turned these into the A10 and the L4; the L40 is its own entry
    assert cat.gpu("L40").id == "L40"
    with pytest.raises(UnknownNameError, match="L40S"):
        cat.gpu("L40X")
    assert cat.find_gpu("NVIDIA A100 40GB something") is None
    with pytest.raises(InvalidInputError):
        cat.gpu("A10 with more memory")


def test_an_ambiguous_name_lists_the_candidates() -> None:
    with pytest.raises(AmbiguousNameError) as err:
        package_catalog().gpu("A100")
    for gid in ("A100-40GB-SXM", "A100-40GB-PCIe", "A100-80GB-SXM", "A100-80GB-PCIe"):
        assert gid in str(err.value)
    with pytest.raises(AmbiguousNameError, match="H100-NVL"):
        package_catalog().gpu("H100")


async def test_both_estimators_use_the_named_gpu_not_a_shorter_one(client: Client) -> None:
    inf = await call_ok(client, "estimate_inference", model="Llama-3-8B", weight_format="f16", gpu="A100 40GB")
    assert inf["results"][0]["gpu"] == "A100-40GB-SXM" and inf["results"][0]["vram_gb"] == 40
    tr = await call_ok(client, "estimate_training", model="Mistral-7B", gpu="A100 40GB")
    assert tr["results"][0]["gpu"] == "A100-40GB-SXM"
    assert "L40S" in await call_err(client, "estimate_inference", model="Llama-3-8B", gpu="L40X")
    l40 = await call_ok(client, "estimate_inference", model="Llama-3-8B", gpu="L40")
    assert l40["results"][0]["gpu"] == "L40" and l40["results"][0]["vram_gb"] == 48


# --- NVML -> planning figures (published specifications) -----------------------------------------------
@pytest.mark.parametrize(
    ("bus_bits", "mem_mhz", "published_gbs"),
    [
        (5120, 2619, 3350),  # H100 SXM5 80 GB HBM3: 3.35 TB/s (NVIDIA H100 datasheet)
        (384, 10501, 1008),  # RTX 4090 GDDR6X 21 Gbps: 1,008 GB/s (Ada architecture whitepaper)
        (5120, 1215, 1555),  # A100 40 GB HBM2: 1,555 GB/s (A100 datasheet)
        (384, 6251, 600),  # A10 GDDR6 12.5 Gbps: 600 GB/s (A10 datasheet)
        (256, 5001, 320),  # T4 GDDR6: 320 GB/s (T4 datasheet)
    ],
)
def test_peak_bandwidth_from_nvml_bus_width_and_memory_clock(bus_bits: int, mem_mhz: int, published_gbs: int) -> None:
    # NVML reports half the per-pin data rate for HBM and GDDR alike, hence one factor of two for every type
    assert peak_bandwidth_gbs(bus_bits, mem_mhz) == pytest.approx(published_gbs, rel=0.01)


def _facts(**kw: Any) -> NvmlFacts:
    base: dict[str, Any] = {"index": 0, "uuid": "GPU-0", "memory_total_bytes": 0, "memory_free_bytes": 0}
    return NvmlFacts(**{**base, **kw})


@pytest.mark.parametrize(
    ("name", "cc", "sms", "boost_mhz", "published_tflops"),
    [
        ("NVIDIA H100 80GB HBM3", (9, 0), 132, 1830, 989.4),  # H100 SXM datasheet, dense BF16
        ("NVIDIA A100-SXM4-40GB", (8, 0), 108, 1410, 312),  # A100 datasheet
        ("NVIDIA A10", (8, 6), 72, 1695, 125),  # A10 datasheet
        ("NVIDIA L40S", (8, 9), 142, 2520, 362),  # L40S datasheet (733 sparse)
        ("NVIDIA GeForce RTX 4090", (8, 9), 128, 2520, 165.2),  # FP32-accumulate rate, Ada whitepaper
        ("NVIDIA GeForce RTX 3090", (8, 6), 82, 1695, 71),  # Ampere GA102 whitepaper
        ("Tesla V100-SXM2-16GB", (7, 0), 80, 1530, 125),  # V100 datasheet
    ],
)
def test_tensor_tflops_from_sm_count_and_boost_clock(
    name: str, cc: tuple[int, int], sms: int, boost_mhz: int, published_tflops: float
) -> None:
    spec = derive_spec(_facts(name=name, compute_capability=cc, sm_count=sms, boost_sm_clock_mhz=boost_mhz))
    assert spec.bf16_tflops == pytest.approx(published_tflops, rel=0.03)
    assert "bf16_tflops" in spec.from_nvml and spec.bf16_supported == (cc >= (8, 0))


def test_a_gpu_missing_from_the_catalog_gets_every_planning_figure_from_nvml() -> None:
    # RTX 4070 (AD104): 12 GB GDDR6X on a 192-bit bus at 21 Gbps, 46 SMs, 2475 MHz boost -> 504 GB/s and
    # ~58 TFLOPS FP16 tensor with FP32 accumulate (NVIDIA RTX 4070 specifications, Ada whitepaper)
    f = _facts(
        name="NVIDIA GeForce RTX 4070",
        memory_total_bytes=12 * 1024**3,
        memory_free_bytes=11 * 1024**3,
        memory_bus_width_bits=192,
        max_memory_clock_mhz=10501,
        compute_capability=(8, 9),
        sm_count=46,
        boost_sm_clock_mhz=2475,
        power_limit_w=200.0,
    )
    assert package_catalog().find_gpu(f.name) is None
    spec = derive_spec(f)
    assert spec.bandwidth_gbs == pytest.approx(504, rel=0.01)
    assert spec.bf16_tflops == pytest.approx(58.3, rel=0.03)
    assert spec.gpu_class == "consumer-gddr" and spec.vram_gb == pytest.approx(12.885, rel=1e-3)
    assert set(spec.from_nvml) >= {"bandwidth_gbs", "bf16_tflops", "vram_gb", "tdp_w"}


class _H200Nvml:
    """What NVML answered on a whole H200 (driver 580.159.04, 2026-11-26): no attributes outside MIG."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_CLOCK_ID_CUSTOMER_BOOST_MAX = 1, 2, 2

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(total=143771 * 1024**2, free=143155 * 1024**2)

    def nvmlDeviceGetAttributes_v2(self, h: int) -> Any:
        raise RuntimeError("NVMLError_NotSupported")

    def nvmlDeviceGetNumGpuCores(self, h: int) -> int:
        return 16896

    def nvmlDeviceGetMaxClockInfo(self, h: int, clock: int) -> int:
        return {1: 1980, 2: 3201}[clock]

    def nvmlDeviceGetClock(self, h: int, clock: int, kind: int) -> int:
        return 1980

    def nvmlDeviceGetMemoryBusWidth(self, h: int) -> int:
        return 6016

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return (9, 0)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: int) -> int:
        return 700_000

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return "GPU-e316a00c"

    def nvmlDeviceGetName(self, h: int) -> str:
        return "NVIDIA H200"

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=b"00000000:00:05.0")


def test_sm_count_comes_from_the_core_count_where_nvml_has_no_attributes_for_a_whole_gpu() -> None:
    gpus = local_gpus(_H200Nvml(), cuda_visible="0")
    assert gpus and gpus[0].sm_count == 132  # 16896 CUDA cores / 128 FP32 lanes per Hopper SM
    spec = derive_spec(gpus[0])
    known = package_catalog().find_gpu("NVIDIA H200")
    assert known is not None and spec.bf16_tflops is not None and spec.bandwidth_gbs is not None
    assert spec.bf16_tflops == pytest.approx(known.bf16_tflops, rel=0.2)
    assert spec.bandwidth_gbs == pytest.approx(known.bandwidth_gbs, rel=0.02)


@pytest.mark.parametrize(
    ("name", "cc", "sms", "boost_mhz", "published_fp32"),
    [
        ("NVIDIA A100-SXM4-40GB", (8, 0), 108, 1410, 19.5),  # 64 FP32 lanes per SM (A100 datasheet)
        ("NVIDIA A10", (8, 6), 72, 1695, 31.2),  # 128 lanes (A10 datasheet)
        ("NVIDIA H100 80GB HBM3", (9, 0), 132, 1980, 66.9),  # H100 SXM datasheet: 67
        ("Tesla V100-SXM2-16GB", (7, 0), 80, 1530, 15.7),
    ],
)
def test_fp32_tflops_use_the_lanes_per_sm_of_that_architecture(
    name: str, cc: tuple[int, int], sms: int, boost_mhz: int, published_fp32: float
) -> None:
    spec = derive_spec(_facts(name=name, compute_capability=cc, sm_count=sms, boost_sm_clock_mhz=boost_mhz))
    assert spec.fp32_tflops == pytest.approx(published_fp32, rel=0.03)


def test_cuda_visible_devices_maps_gpus_by_uuid_and_pci_order_not_nvml_index() -> None:
    a = _facts(index=0, uuid="GPU-aaaa1111", pci_bus_id="00000000:3B:00.0", name="A")
    b = _facts(index=1, uuid="GPU-bbbb2222", pci_bus_id="00000000:1A:00.0", name="B")
    assert [d.name for d in visible_to_cuda([a, b], None)] == ["B", "A"]  # PCI bus order
    picked = visible_to_cuda([a, b], "GPU-aaaa,GPU-bbbb2222")
    assert [(d.name, d.cuda_index) for d in picked] == [("A", 0), ("B", 1)]
    assert [d.name for d in visible_to_cuda([a, b], "1")] == ["A"]
    assert [d.name for d in visible_to_cuda([a, b], "0,GPU-nope,1")] == ["B"]  # CUDA stops at a bad entry
    assert visible_to_cuda([a, b], "") == [] and visible_to_cuda([a, b], "-1") == []


# --- without a GPU: the CPU and its RAM ----------------------------------------------------------------
async def test_local_without_a_gpu_plans_against_host_ram_as_device_cpu(client: Client) -> None:
    if has_gpu():
        pytest.skip("a GPU is present: gpu='local' plans for it")
    ram = psutil.virtual_memory()
    inf = await call_ok(client, "estimate_inference", model="SmolLM2-135M", weight_format="q8_0", gpu="local")
    r = inf["results"][0]
    assert r["gpu"] == "cpu" and r["fits"] and r["spec_source"].startswith("host RAM")
    assert r["vram_gb"] == pytest.approx(ram.total / 1e9, rel=0.01)
    assert any("device 'cpu'" in a for a in inf["assumptions"])
    tr = await call_ok(client, "estimate_training", model="SmolLM2-135M", method="lora", gpu="local")
    t = tr["results"][0]
    assert t["gpu"] == "cpu" and t["micro_batch"] is not None
    assert t["vram_gb"] == pytest.approx(psutil.virtual_memory().available / 1e9, rel=0.2)


@pytest.mark.gpu
async def test_a_real_gpu_is_described_from_nvml_and_planned_for(client: Client) -> None:
    gpus = local_gpus()
    assert gpus, "NVML sees a GPU but CUDA_VISIBLE_DEVICES hides all of them"
    spec = derive_spec(gpus[0])
    assert spec.vram_gb > 1 and spec.bandwidth_gbs and spec.bf16_tflops
    known = package_catalog().find_gpu(gpus[0].name)
    if known is not None:  # NVML-derived peaks agree with the datasheet within boost-clock differences
        assert spec.bandwidth_gbs == pytest.approx(known.bandwidth_gbs, rel=0.1)
        assert spec.bf16_tflops == pytest.approx(known.bf16_tflops, rel=0.2)
    inf = await call_ok(client, "estimate_inference", model="Llama-3-8B", weight_format="q4_k_m", gpu="local")
    assert "NVML" in inf["results"][0]["spec_source"]
    tr = await call_ok(client, "estimate_training", model="Mistral-7B", gpu="local")
    assert tr["results"][0]["micro_batch"]
