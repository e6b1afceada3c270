"""Models of the serving-engines family: the plan for an engine, its record and status."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, Field, model_validator

# unresponsive: a ready or attached engine that did not answer its health probe; it goes back (ready for an engine
# gpubox runs, attached for an attached server) once it answers again
EngineState = Literal["preparing", "starting", "ready", "failed", "stopped", "attached", "unresponsive"]


class ServePlan(BaseModel):
    """The flags gpubox passes to the engine, each with the reason it was chosen."""

    device: Literal["cpu", "cuda"]
    dtype: str
    max_model_len: int
    model_max_len: int | None = Field(default=None, description="The model's positions: max_model_len's ceiling")
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    nodes: int = 1
    gpu_memory_utilization: float | None = Field(default=None, description="Share of each GPU vLLM may take")
    kv_cache_space_gb: int | None = Field(default=None, description="CPU: VLLM_CPU_KVCACHE_SPACE")
    enforce_eager: bool = False
    memory_gb: dict[str, float] = Field(description="What the engine reserves per device in the box ledger")
    estimate_gb: dict[str, float] | None = Field(
        default=None, description="The plan's own estimate, where what this configuration took last run is more"
    )
    command: list[str] = Field(description="The exact command gpubox runs (the API key is elided)")
    env: dict[str, str] = Field(description="Environment variables gpubox sets for it")
    reasons: list[str]


class EngineRecord(BaseModel):
    id: str
    engine: Literal["vllm", "openai"] = Field(description="vllm: run by gpubox; openai: attached by URL")
    model: str = Field(description="The served model name clients pass")
    aliases: list[str] = Field(default_factory=list, description="LoRA adapters served on top, by name")
    source: str = Field(description="HF folder served, or the attached URL")
    base_url: str
    api_key: str | None = None
    port: int | None = None
    pid: int | None = None
    pid_started: float | None = None
    started: float
    state: EngineState
    error: str | None = None
    plan: ServePlan | None = None
    log_path: str | None = None
    launcher_pid: int | None = Field(default=None, description="The gpubox server preparing and launching it")
    build_pid: int | None = Field(default=None, description="The process group building its HF copy, if any")
    build_started: float | None = None


class EngineMetrics(BaseModel):
    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage: float | None = Field(default=None, description="Share of the KV cache in use (0-1)")
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None


class EngineStatus(BaseModel):
    id: str
    engine: str
    model: str
    state: EngineState
    healthy: bool
    base_url: str
    api_key: str | None = Field(
        default=None, description="The key of an engine gpubox runs, for clients that call it directly"
    )
    served_models: list[str] = Field(default_factory=list)
    uptime_s: float | None = None
    memory_gb: dict[str, float] = Field(default_factory=dict, description="Reserved in the box ledger")
    metrics: EngineMetrics | None = None
    plan: ServePlan | None = None
    error: str | None = None
    log_tail: str | None = None
    next_step: str | None = None

    @model_validator(mode="after")
    def _no_secrets(self) -> EngineStatus:
        """An attached server's key and a password in its URL are the user's own secrets: every later serve_list
        or serve_status handed them to any client (a key gpubox made for its own engine is for its clients)."""
        if self.engine == "openai":
            self.api_key = None
        self.base_url = without_password(self.base_url)
        return self


def without_password(url: str) -> str:
    """`url` with any user:password@ part written as ***@."""
    try:
        parts = urlsplit(url)
    except ValueError:  # a damaged record's "http://[::1": shown without whatever precedes an @, never a crash
        return "***@" + url.rpartition("@")[2] if "@" in url else url
    if parts.username is None and parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


class EngineList(BaseModel):
    engines: list[EngineStatus]
