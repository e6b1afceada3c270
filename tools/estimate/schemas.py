"""Pydantic outputs of the estimate family."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ModelSummary(BaseModel):
    id: str
    source: str = Field(description="catalog, config.json or gguf")
    params: int
    params_b: float
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    max_context: int
    sliding_window: int | None = None


class ProviderCost(BaseModel):
    provider: str
    usd_per_hour: float
    spot_usd_per_hour: float | None = None
    price_observed: str = Field(description="Date the price was observed; prices move, check before buying")
    source: str
    usd: float = Field(description="Cost of the estimated work (per million tokens for inference, total for training)")


class InferenceMemory(BaseModel):
    weights_gb: float
    kv_cache_gb: float
    compute_buffers_gb: float
    runtime_overhead_gb: float
    total_gb: float


class FullContextLine(BaseModel):
    context: int
    kv_cache_gb: float
    total_gb: float
    fits: bool


class InferenceOnGpu(BaseModel):
    gpu: str
    gpu_name: str
    vram_gb: float
    available_gb: float = Field(description="Memory the plan may use (free memory for local GPUs)")
    memory: InferenceMemory
    fits: bool
    margin_gb: float = Field(description="available - needed; negative when it does not fit fully")
    full_context: FullContextLine
    max_context_that_fits: int = Field(description="Largest context (at this batch) with all layers on the GPU")
    n_gpu_layers: int = Field(description="Layers to offload (llama.cpp n_gpu_layers); all when it fits")
    total_layers: int
    offload: Literal["full", "partial", "none"]
    decode_tokens_per_s_ceiling: float = Field(description="Bandwidth ceiling: BW / bytes read per token")
    decode_tokens_per_s: float = Field(description="Expected aggregate decode rate = ceiling x efficiency")
    decode_efficiency: float
    efficiency_source: str
    prefill_tokens_per_s: float
    prefill_mfu: float
    costs_per_million_tokens: list[ProviderCost]
    cheapest_usd_per_million_tokens: float | None = None
    quoted_tokens_per_s: float | None = Field(default=None, description="The caller's quoted decode speed, when given")
    quoted_verdict: Literal["plausible", "above_bandwidth_ceiling", "does_not_fit"] | None = Field(
        default=None, description="How the quoted speed compares with what this GPU can physically do"
    )
    spec_source: str = Field(default="catalog", description="Where the GPU figures came from (catalog, NVML, measured)")


RANK_COLUMNS = ["gpu", "fits", "margin_gb", "decode_tokens_per_s", "usd_per_million_tokens", "provider"]
CATALOG_COLUMNS = ["id", "vram_gb", "bandwidth_gbs", "bf16_tflops", "usd_per_hour", "provider"]


class GpuRanking(BaseModel):
    """Several GPUs compared in one small table: a row per GPU, best first, in the order of `columns`."""

    columns: list[str] = Field(default_factory=lambda: list(RANK_COLUMNS))
    rows: list[tuple[str, bool, float, float, float | None, str | None]] = Field(
        description="gpu, fits, margin_gb, decode tok/s, cheapest $ per million tokens and its provider"
    )


TRAINING_RANK_COLUMNS = [
    "gpu", "micro_batch", "peak_gb", "tokens_per_s", "wall_hours", "usd", "provider",
]  # fmt: skip


class TrainingRanking(BaseModel):
    """Several GPUs' training plans in one small table: a row per GPU, best first, in the order of `columns`."""

    columns: list[str] = Field(default_factory=lambda: list(TRAINING_RANK_COLUMNS))
    rows: list[tuple[str, int | None, float, int, float | None, float | None, str | None]] = Field(
        description="gpu, largest micro-batch that fits (null: none), its peak GB, training tok/s, "
        "hours and the cheapest provider's $ for the run (null until its length is known) and that provider"
    )


class InferenceEstimate(BaseModel):
    model: ModelSummary
    weight_format: str
    context_length: int
    batch: int
    kv_cache_type: str
    results: list[InferenceOnGpu] = Field(
        description="One per GPU, ranked best-first; empty when `ranking` summarises several GPUs (detail=false)"
    )
    ranking: GpuRanking | None = Field(
        default=None, description="Several GPUs without detail: one row each, best first (detail=true: `results`)"
    )
    assumptions: list[str]
    warnings: list[str] = Field(default_factory=list)


class TrainingMemory(BaseModel):
    weights_gb: float
    trainable_weights_gb: float
    gradients_gb: float
    optimizer_gb: float
    activations_gb: float
    logits_gb: float
    overhead_gb: float
    total_gb: float
    activations_physical_gb: float = Field(description="Textbook activation+logit bytes before the measured factor")
    activation_factor: float


class BatchCandidate(BaseModel):
    micro_batch: int
    total_gb: float
    status: Literal["fits", "too_close", "oom"]


class TrainingOnGpu(BaseModel):
    gpu: str
    gpu_name: str
    gpu_count: int
    vram_gb: float
    safe_limit_gb: float = Field(description="vram x (1 - headroom): the planner's ceiling")
    micro_batch: int | None = Field(description="Largest micro-batch that fits under the headroom; null if none")
    memory: TrainingMemory = Field(description="Breakdown at the chosen micro-batch (or 1 when none fits)")
    candidates: list[BatchCandidate]
    without_checkpointing: list[BatchCandidate] = Field(
        default_factory=list,
        description="When checkpointing is on: the same micro-batches without it (up to the first OOM)",
    )
    gradient_accumulation: int | None
    global_batch: int | None
    tokens_per_s: float
    mfu: float
    mfu_source: str
    flops_per_token: float
    wall_hours: float | None = Field(
        description="null when nothing fits, or neither a dataset size nor max_steps is given"
    )
    costs: list[ProviderCost] = Field(description="Empty when the run length is unknown")
    electricity_usd: float | None = Field(description="Local power: TDP x hours x GPUs x $/kWh; null if unknown")
    calibration: str | None = None
    gradient_checkpointing: bool = Field(
        default=True, description="Whether this plan uses checkpointing ('auto' resolved)"
    )
    spec_source: str = Field(default="catalog", description="Where the GPU figures came from (catalog, NVML, measured)")


class TrainingEstimate(BaseModel):
    model: ModelSummary
    method: str
    weight_format: str
    lora_rank: int | None
    target_modules: list[str]
    trainable_params: int
    trainable_pct: float
    seq_len: int
    gradient_checkpointing: bool | Literal["auto"] = Field(description="As requested; each result says what it used")
    optimizer: str = Field(description="transformers TrainingArguments.optim")
    optimizer_bytes_per_param: float
    dataset_tokens: int | None = Field(description="null when the dataset size is unknown (no time or cost)")
    epochs: float
    results: list[TrainingOnGpu] = Field(
        description="One per GPU, ranked best-first; empty when `ranking` summarises several GPUs (detail=false)"
    )
    ranking: TrainingRanking | None = Field(
        default=None, description="Several GPUs without detail: one row each, best first (detail=true: `results`)"
    )
    assumptions: list[str]
    warnings: list[str] = Field(default_factory=list)


class GpuEntry(BaseModel):
    id: str
    name: str
    vram_gb: float
    bandwidth_gbs: float
    bf16_tflops: float
    fp32_tflops: float
    tdp_w: float
    gpu_class: str
    sources: dict[str, str]
    prices: list[ProviderCost]


class GpuTable(BaseModel):
    """The catalog in one small table: a row per GPU in the order of `columns`, with the cheapest price."""

    columns: list[str] = Field(default_factory=lambda: list(CATALOG_COLUMNS))
    rows: list[tuple[str, float, float, float, float | None, str | None]] = Field(
        description="id, vram_gb, bandwidth_gbs, bf16_tflops, cheapest $/GPU-hour and its provider"
    )


class GpuCatalog(BaseModel):
    gpus: list[GpuEntry] = Field(description="Every field, sources and dated prices; empty unless detail=true")
    table: GpuTable | None = Field(default=None, description="The default summary (detail=false)")
    note: str


class Measurement(BaseModel):
    id: int
    kind: Literal["inference", "training"]
    gpu: str
    model: str
    params: int | None
    method: str | None
    config: dict[str, object]
    peak_memory_gb: float | None
    tokens_per_s: float | None
    prefill_tokens_per_s: float | None
    decode_efficiency: float | None
    mfu: float | None
    activation_factor: float | None
    created_at: str
    note: str | None
    ignored: str | None = Field(default=None, description="Why estimates ignore this row (out of bounds), or null")


class DeviceProfile(BaseModel):
    """A measured device: memory bandwidth and matrix TFLOPS per dtype ('bf16', 'fp16', 'fp32', ...)."""

    id: int
    gpu: str = Field(description="Catalog GPU id, or 'cpu'")
    memory_bandwidth_gbs: float | None
    tflops: dict[str, float]
    note: str | None
    created_at: str
    ignored: str | None = Field(default=None, description="Why estimates ignore this profile (out of bounds), or null")


class MeasurementList(BaseModel):
    measurements: list[Measurement]
    more: bool = Field(default=False, description="Older runs exist beyond limit")
    devices: list[DeviceProfile] = Field(default_factory=list, description="Measured device profiles (kind 'device')")
    database: str
