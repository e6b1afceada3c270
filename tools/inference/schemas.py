"""Pydantic outputs of the inference family."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class LoadedInfo(BaseModel):
    backend: Literal["llama.cpp", "transformers"]
    device: str = Field(description="cpu, cuda, or 'cuda (N/M layers)' for a partial offload")
    n_gpu_layers: int
    context_length: int
    memory_gb: float = Field(description="Estimated resident memory of the weights + KV cache")
    loaded_at: str
    last_used: str
    keep_alive_s: float = Field(description="Idle seconds before automatic unload; 0 = never idle-unloaded")
    adapter: str | None = None
    pinned: bool = Field(False, description="Never evicted or idle-unloaded; only infer_unload frees it")


class ModelEntry(BaseModel):
    name: str
    path: str
    format: Literal["gguf", "hf", "lora"]
    architecture: str | None
    params: int | None
    quantization: str | None
    context_length: int | None
    size_bytes: int
    chat_template: bool
    base_model: str | None = Field(None, description="For LoRA adapters: the base model they apply to")
    bundled: bool = False
    loaded: LoadedInfo | None = None
    problem: str | None = Field(None, description="Why the metadata could not be read (file named); None when fine")


class ServedModel(BaseModel):
    name: str = Field(description="Pass as `model` to infer_chat / infer_complete: requests go to the engine")
    engine: str
    engine_id: str
    base_url: str
    state: str


class ModelList(BaseModel):
    models: list[ModelEntry]
    resident_limit: int
    memory_budget_gb: float | None
    served: list[ServedModel] = Field(default_factory=list, description="Models engines serve (serve_start/attach)")


class LoadPlan(BaseModel):
    backend: Literal["llama.cpp", "transformers"]
    device: str
    n_gpu_layers: int
    context_length: int
    kv_cache_type: str
    free_vram_gb: float | None
    estimated_memory_gb: float
    fits: bool
    reason: str = Field(description="Why this plan: the estimator's fit on free VRAM, or CPU")


class LoadResult(BaseModel):
    model: ModelEntry
    plan: LoadPlan
    evicted: list[str] = Field(default_factory=list)
    load_seconds: float


class UnloadResult(BaseModel):
    name: str
    unloaded: bool


class GenerationResult(BaseModel):
    model: str
    text: str
    finish_reason: Literal["stop", "length", "cancelled", "content_filter"] = Field(
        description="content_filter: an attached server withheld the rest of the answer"
    )
    prompt_tokens: int
    completion_tokens: int
    time_to_first_token_s: float | None
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None
    total_seconds: float
    parsed_json: object | None = Field(default=None, description="Parsed output when a JSON schema was given")


class BenchmarkResult(BaseModel):
    model: str
    backend: str
    device: str
    requests: int
    concurrency: int
    prompt_tokens: int
    max_tokens: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    time_to_first_token_s_p50: float
    latency_s_p50: float
    latency_s_p95: float
    latency_s_p99: float
    requests_per_s: float
    aggregate_tokens_per_s: float | None = Field(
        default=None, description="Generated tokens of all requests over the wall time: what concurrency buys"
    )
    peak_memory_gb: float
    bandwidth_share: float | None = Field(
        default=None, description="On a GPU: decode bytes/s over the bandwidth ceiling"
    )
    calibration_id: int | None = Field(default=None, description="Row stored for the estimator (estimate_calibrations)")
    calibration_note: str | None = Field(
        default=None, description="Why the figures were not stored, when they were not"
    )


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=1_000_000)
