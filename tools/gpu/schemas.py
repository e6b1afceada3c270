"""Pydantic shapes of GPU and host telemetry."""

from __future__ import annotations

from pydantic import BaseModel, Field

from gpubox.tools.box.schemas import BoxState


class GpuProcess(BaseModel):
    pid: int
    name: str | None = Field(None, description="Process name, when this user may see it")
    used_memory_mib: float | None = Field(None, description="GPU memory used by the process")


class EccErrors(BaseModel):
    corrected_volatile: int | None = None
    uncorrected_volatile: int | None = None
    corrected_aggregate: int | None = None
    uncorrected_aggregate: int | None = None


class GpuDevice(BaseModel):
    index: int
    name: str
    uuid: str
    memory_total_mib: float
    memory_used_mib: float
    memory_free_mib: float
    utilization_gpu_pct: int | None = None
    utilization_memory_pct: int | None = None
    temperature_c: int | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    throttle_reasons: list[str] = Field(default_factory=list, description="Active clock-throttle reasons")
    ecc_errors: EccErrors | None = Field(None, description="ECC counts; null when ECC is unsupported or off")
    compute_capability: str | None = None
    processes: list[GpuProcess] = Field(default_factory=list)


class HostInfo(BaseModel):
    cpu_model: str
    cpu_count_logical: int
    cpu_count_physical: int | None
    ram_total_gib: float
    ram_available_gib: float
    load_average: tuple[float, float, float] | None = Field(None, description="1, 5, 15-minute load averages")


class ActivityUse(BaseModel):
    kind: str = Field(description="inference, finetune, indexing or benchmark")
    active: bool = Field(description="Running now")
    wall_minutes: float = Field(description="Wall-clock minutes this kind of work ran during the session")
    gpu_busy_minutes: float | None = Field(
        None, description="GPU-busy minutes attributed to it (split between kinds running together); null without NVML"
    )


class SessionInfo(BaseModel):
    started_at: str = Field(description="Server start, UTC")
    uptime_s: float
    usd_per_hour: float | None = Field(description="Price of the box per hour; null when none is configured")
    price_source: str = Field(description="Where the price came from (setting or provider catalog with its source)")
    price_observed: str | None = Field(None, description="Date a catalog price was observed; prices move")
    cost_usd: float | None = Field(description="uptime x price")
    budget_usd: float | None = None
    budget_left_usd: float | None = None
    budget_runs_out_at: str | None = Field(None, description="When the budget is spent at this rate, UTC")
    gpu_busy_share: float | None = Field(description="Share of sampled session time the GPU was busy; null unmeasured")
    gpu_idle_minutes: float | None = None
    gpu_utilisation: str = Field(description="'measured', or why utilisation is unavailable")
    minutes_since_last_request: float
    uses: list[ActivityUse]


class GpuStatus(BaseModel):
    available: bool = Field(description="True when NVML answered and at least one GPU is present")
    reason: str | None = Field(None, description="Why no GPU is reported, when available is false")
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    gpus: list[GpuDevice] = Field(default_factory=list)
    host: HostInfo
    session: SessionInfo | None = Field(
        default=None, description="This server session's cost and GPU use (rented boxes)"
    )
    memory: BoxState | None = Field(
        default=None, description="The box ledger: per device budget, reserved, external and free GB, and who holds it"
    )
