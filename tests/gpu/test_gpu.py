from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from mcp import Client

from gpubox.tools.gpu.nvml import decode_throttle, gpu_status
from tests.conftest import call_ok, has_gpu, requires_gpu_extra

pytestmark = pytest.mark.anyio


@requires_gpu_extra
async def test_gpu_status_reports_a_missing_gpu_as_data_not_an_error(client: Client) -> None:
    if has_gpu():
        pytest.skip("this machine has a GPU")
    data = await call_ok(client, "gpu_status")
    assert data["available"] is False
    assert "NVML" in data["reason"]
    assert data["gpus"] == []
    assert data["host"]["cpu_count_logical"] >= 1
    assert data["host"]["ram_total_gib"] > 0


async def test_gpu_status_resource_carries_the_same_fields_as_the_tool(client: Client) -> None:
    import json

    res = await client.read_resource("gpu://status")
    body = json.loads(res.contents[0].text)  # type: ignore[union-attr]
    tool = await call_ok(client, "gpu_status")
    assert set(body) == set(tool)
    assert body["available"] == tool["available"]


def test_throttle_mask_decodes_to_named_reasons() -> None:
    assert decode_throttle(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert decode_throttle(0) == []


class FakeNvml:
    """Isolates the NVML-to-schema mapping; the real library is exercised by the gpu-marked test."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_AGGREGATE_ECC = 1

    def __init__(self) -> None:
        self.shutdowns = 0

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.1"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 12080

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(total=80 * 1024**3, used=10 * 1024**3, free=70 * 1024**3)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=97, memory=40)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 350_500

    def nvmlDeviceGetPowerManagementLimit(self, h: int) -> int:
        return 700_000

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return 0x4

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return (9, 0)

    def nvmlDeviceGetEccMode(self, h: int) -> tuple[int, int]:
        return (1, 1)

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        return kind * 10 + counter

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [SimpleNamespace(pid=1, usedGpuMemory=2 * 1024**3)]

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return "GPU-abc"

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 61

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        raise RuntimeError("NVMLError_NotSupported")  # unsupported queries must become null


def test_nvml_fields_map_onto_the_schema_and_unsupported_queries_become_null() -> None:
    nv = FakeNvml()
    status = gpu_status(nv)
    assert status.available and status.driver_version == "580.1" and status.cuda_driver_version == "12.8"
    g = status.gpus[0]
    assert g.name == "NVIDIA H100 80GB HBM3" and g.memory_free_mib == 70 * 1024
    assert g.power_draw_w == 350.5 and g.power_limit_w == 700.0
    assert g.throttle_reasons == ["sw_power_cap"]
    assert g.sm_clock_mhz is None
    assert g.ecc_errors is not None and g.ecc_errors.uncorrected_aggregate == 11
    assert g.compute_capability == "9.0"
    assert g.processes[0].used_memory_mib == 2048.0
    assert nv.shutdowns == 1


def test_nvml_init_failure_is_reported_with_its_reason() -> None:
    class Broken(FakeNvml):
        def nvmlInit(self) -> None:
            raise RuntimeError("Driver Not Loaded")

    status = gpu_status(Broken())
    assert not status.available
    assert status.reason is not None and "Driver Not Loaded" in status.reason


@pytest.mark.gpu
def test_gpu_status_reads_a_real_gpu() -> None:
    status = gpu_status()
    assert status.available
    g = status.gpus[0]
    assert g.memory_total_mib > 1000
    assert g.memory_used_mib + g.memory_free_mib <= g.memory_total_mib + 1
    assert g.uuid.startswith("GPU-")
    assert g.temperature_c is not None and 0 < g.temperature_c < 120
