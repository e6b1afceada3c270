"""Models of the box's memory ledger: holdings, per-device accounts, admission answers."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

Kind = Literal["inference", "engine", "finetune", "benchmark", "indexing"]
# a ledger file is state another process wrote: a negative or NaN size let a reservation past the budget
Gb = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class Holding(BaseModel):
    """Memory one piece of work holds (or is about to allocate), per device."""

    owner: str = Field(description="Who holds it, e.g. 'model smollm2' or 'fine-tune job 3f2a'")
    kind: Kind
    devices: dict[str, Gb] = Field(description="GB reserved per device ('host', 'cuda:0', ...)")
    started: str = Field(description="When the reservation was made, UTC")
    pinned: bool = Field(default=False, description="Never evicted to make room")
    pid: int | None = Field(
        default=None, gt=0, description="Process holding the memory; the reservation ends when it exits"
    )
    pid_started: float | None = Field(default=None, description="That process's start time (guards against pid reuse)")
    frees_with: str = Field(description="The call that ends this work and frees its memory")
    server_pid: int | None = Field(default=None, description="The gpubox server that made the reservation")
    server_started: float | None = Field(
        default=None, description="That server's start time (guards against pid reuse; absent in older ledger files)"
    )
    source: str = Field(default="estimator", description="Where the size comes from: 'estimator' or a measurement")
    measured_gb: dict[str, Gb] | None = Field(
        default=None, description="Memory the device shows for it, when measurable"
    )


class DeviceAccount(BaseModel):
    device: str
    total_gb: float | None = Field(description="Physical memory of the device; null when unreadable")
    budget_gb: float = Field(description="What gpubox may reserve here (memory_budget_gb, or total minus headroom)")
    reserved_gb: float
    external_gb: float = Field(description="Memory in use by processes gpubox does not own, as the device shows")
    free_gb: float = Field(description="What a new reservation may take now")
    measured_gb: float | None = Field(
        default=None, description="Memory gpubox's own processes use, as the device shows"
    )


class Blocker(BaseModel):
    device: str
    need_gb: float
    free_gb: float
    frees: list[str] = Field(description="Calls that would free enough (unpinned holders, largest first)")


class Admission(BaseModel):
    fits: bool
    needs: dict[str, float] = Field(description="GB per device the work would reserve")
    blockers: list[Blocker] = Field(default_factory=list)
    reason: str


class BoxState(BaseModel):
    devices: list[DeviceAccount]
    holdings: list[Holding]
    queued: list[str] = Field(default_factory=list, description="Work waiting for memory, first in line first")
    warnings: list[str] = Field(default_factory=list)


class BoxPlan(BaseModel):
    """What fits now and, for a proposed action, whether it would fit and why."""

    box: BoxState
    action: str | None = None
    admission: Admission | None = None
    plan: dict[str, object] | None = Field(
        default=None, description="The family's own plan for the action, when it made one"
    )
