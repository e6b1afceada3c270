"""Outputs of the bench_* tools (inputs are plain annotated tool parameters)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

RunStatus = Literal["complete", "timed_out", "failed"]
BACKENDS = ("sdpa_math", "sdpa_efficient", "sdpa_flash", "sdpa_cudnn", "ffpa", "flash_attn")
Backend = Literal["sdpa_math", "sdpa_efficient", "sdpa_flash", "sdpa_cudnn", "ffpa", "flash_attn"]


class AttentionRow(BaseModel):
    backend: str
    head_dim: int
    seq_len: int
    time_ms: float = Field(description="Median time per call over the timed iterations")
    time_ms_min: float
    time_ms_max: float
    spread_pct: float = Field(description="(p90 - p10) / median, %: how steady the measurement was")
    tflops: float = Field(description="4·B·H·N²·D / time (halved when causal, ×2.5 with backward)")
    speedup: float | None = Field(None, description="Baseline time / this time at the same shape")
    max_abs_error: float | None = Field(
        description="Largest |output − math reference| (reference in fp32); None: the output held NaN or inf"
    )
    within_tolerance: bool = Field(description="False: numerically off, so the row is flagged and not ranked")
    peak_memory_mb: float | None = Field(None, description="Peak device memory of this backend at this shape (GPU)")
    winner: bool = False


class SkippedBackend(BaseModel):
    backend: str
    head_dim: int | None = Field(None, description="None: skipped for every shape")
    seq_len: int | None = None
    reason: str


class ShapeWinner(BaseModel):
    head_dim: int
    seq_len: int
    backend: str | None = Field(None, description="Fastest backend within tolerance; None when none ran")
    tflops: float | None = None
    speedup: float | None = None


class PlotRef(BaseModel):
    name: str
    uri: str = Field(description="bench://runs/{id}/{name}.png")
    series: list[str] = Field(description="Line labels drawn in the plot")


class AttentionBench(BaseModel):
    run_id: str
    status: RunStatus
    message: str | None = Field(None, description="Why the run stopped early (time limit, worker crash)")
    device: str = Field(description="'cuda' or 'cpu'")
    device_name: str
    dtype: str
    batch: int
    heads: int
    causal: bool
    backward: bool
    warmup: int
    iterations: int
    baseline: str = Field(description="Backend the speedups are measured against")
    tolerance: float = Field(description="Max abs error allowed against the math reference")
    timing: str = Field(description="How time was measured")
    rows: list[AttentionRow]
    skipped: list[SkippedBackend]
    winners: list[ShapeWinner]
    peak_memory_mb: float | None = Field(None, description="Peak device memory (GPU) or worker RSS (CPU), MB")
    versions: dict[str, str]
    plots: list[PlotRef]
    table_json: str
    table_csv: str
    elapsed_s: float
    notes: list[str]


class DeviceFigure(BaseModel):
    name: str = Field(description="e.g. memory_copy, memory_triad, matmul_bf16, h2d_pinned")
    unit: Literal["GB/s", "TFLOPS", "GFLOPS"]
    measured: float | None = Field(None, description="None: skipped (see reason)")
    datasheet: float | None = Field(None, description="Catalog/datasheet figure in the same unit")
    ratio: float | None = Field(None, description="measured / datasheet")
    source: str | None = Field(None, description="Where the datasheet figure comes from")
    detail: str = Field("", description="Size and method of the measurement, or why it was skipped")


class DeviceBench(BaseModel):
    run_id: str
    status: RunStatus
    message: str | None = None
    device: str
    device_name: str
    catalog_id: str | None = Field(None, description="Estimator catalog entry the datasheet figures come from")
    figures: list[DeviceFigure]
    calibration: str = Field(description="What was stored for the estimator, or why nothing was")
    versions: dict[str, str]
    elapsed_s: float


class RunSummary(BaseModel):
    run_id: str
    kind: Literal["attention", "device"]
    status: RunStatus
    created_at: str
    device: str
    device_name: str
    versions: dict[str, str]
    summary: str = Field(description="One line: shapes and the winners, or the headline figures")
    files: list[str] = Field(description="bench:// URIs of the stored tables and plots")


class RunList(BaseModel):
    runs: list[RunSummary]
    directory: str


class PlotResult(BaseModel):
    run_id: str
    against: str | None
    plots: list[PlotRef]
    notes: list[str]
